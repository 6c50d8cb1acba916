//! The y axis of the plots: nice-number ticks whose labels never repeat, and the
//! symmetric-log scale used when a line changes sign with one side dwarfed by the other.

/// A tick spacing of 1, 2 or 5 × 10^k that cuts `range` into about `target` intervals.
pub fn nice_step(range: f64, target: usize) -> f64 {
    if !(range.is_finite() && range > 0.0) {
        return 1.0;
    }
    let raw = range / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let m = raw / mag;
    let nice = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

/// The multiples of `step` within `lo..=hi` (with a little slack for rounding).
pub fn ticks_in(lo: f64, hi: f64, step: f64) -> Vec<f64> {
    let (a, b) = (
        (lo / step - 1e-9).ceil() as i64,
        (hi / step + 1e-9).floor() as i64,
    );
    (a..=b).map(|k| k as f64 * step).collect()
}

/// A tick label for a multiple of `step`: exactly the decimals `step` needs, so two ticks
/// never print the same text; scientific when the numbers are very large or small.
pub fn tick_text(v: f64, step: f64) -> String {
    if v.abs() < step * 1e-6 {
        return "0".into();
    }
    let e = step.log10().floor() as i32;
    if e >= -4 && v.abs() < 1e6 {
        let decimals = (-e).max(0) as usize;
        format!("{v:.decimals$}")
    } else {
        let digits = (v.abs().log10().floor() as i32 - e + 1).max(1) as usize;
        crate::fmt::sig(v, digits, crate::fmt::Notation::Sci)
    }
}

/// How values map to the y axis: linear, or symmetric-log with linear threshold `c`
/// (`sign(y)·log10(1 + |y|/c)`) when a series changes sign and one side is dwarfed by
/// the other, so a small negative KL stays visible next to a spike.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum YScale {
    /// `y` as is.
    Linear,
    /// Symmetric log with this linear threshold.
    SymLog(f64),
}

impl YScale {
    /// The scale for these finite values: symlog when both signs occur and the smaller
    /// side's largest magnitude is under 5 % of the larger side's.
    pub fn choose(values: &[f64]) -> YScale {
        let pos = values
            .iter()
            .copied()
            .filter(|v| *v > 0.0)
            .fold(0.0_f64, f64::max);
        let neg = values
            .iter()
            .copied()
            .filter(|v| *v < 0.0)
            .fold(0.0_f64, |a, v| a.max(-v));
        if pos == 0.0 || neg == 0.0 {
            return YScale::Linear;
        }
        let (small, large) = (pos.min(neg), pos.max(neg));
        if small < 0.05 * large {
            YScale::SymLog(small / 2.0)
        } else {
            YScale::Linear
        }
    }

    /// Axis position of `y`.
    pub fn fwd(self, y: f64) -> f64 {
        match self {
            YScale::Linear => y,
            YScale::SymLog(c) => y.signum() * (1.0 + y.abs() / c).log10(),
        }
    }

    /// The value at axis position `t`.
    pub fn inv(self, t: f64) -> f64 {
        match self {
            YScale::Linear => t,
            YScale::SymLog(c) => t.signum() * (10f64.powf(t.abs()) - 1.0) * c,
        }
    }
}

/// The y axis of a panel: scale, data range and ticks (axis positions and their labels).
pub struct YAxis {
    /// The scale.
    pub scale: YScale,
    /// Axis positions of the data's bottom and top (ticks snapped outward).
    pub lo: f64,
    /// See `lo`.
    pub hi: f64,
    /// Tick positions on the axis and their labels.
    pub ticks: Vec<(f64, String)>,
}

impl YAxis {
    /// The axis over `values` (lines and bands); the scale is chosen from the lines'
    /// values `series` alone (a ± std band dipping below zero is no sign change).
    pub fn new(values: &[f64], series: &[f64]) -> YAxis {
        let scale = YScale::choose(series);
        let (mut y0, mut y1) = values
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                (a.min(*v), b.max(*v))
            });
        if !y0.is_finite() {
            (y0, y1) = (0.0, 1.0);
        }
        if y1 - y0 < 1e-12 * y0.abs().max(1e-300) || y1 - y0 == 0.0 {
            let d = if y0.abs() > 1e-12 {
                y0.abs() * 0.1
            } else {
                1.0
            };
            y0 -= d;
            y1 += d;
        }
        match scale {
            YScale::Linear => {
                let step = nice_step(y1 - y0, 5);
                let lo = (y0 / step).floor() * step;
                let hi = (y1 / step).ceil() * step;
                let ticks = ticks_in(lo, hi, step)
                    .into_iter()
                    .map(|t| (t, tick_text(t, step)))
                    .collect();
                YAxis {
                    scale,
                    lo,
                    hi,
                    ticks,
                }
            }
            YScale::SymLog(c) => {
                let (lo, hi) = (scale.fwd(y0), scale.fwd(y1));
                let pad = (hi - lo) * 0.05;
                let mut ticks = vec![(0.0, "0".to_string())];
                let kmin = c.log10().ceil() as i32;
                let kmax = y0.abs().max(y1.abs()).log10().ceil() as i32;
                for k in kmin..=kmax {
                    let v = 10f64.powi(k);
                    for s in [v, -v] {
                        let t = scale.fwd(s);
                        if t >= lo - pad && t <= hi + pad {
                            ticks.push((t, crate::fmt::num(s)));
                        }
                    }
                }
                // A side without a power-of-ten tick gets its extreme value labelled.
                if y0 < 0.0 && !ticks.iter().any(|t| t.0 < 0.0) {
                    ticks.push((scale.fwd(y0), crate::fmt::num(y0)));
                }
                if y1 > 0.0 && !ticks.iter().any(|t| t.0 > 0.0) {
                    ticks.push((scale.fwd(y1), crate::fmt::num(y1)));
                }
                ticks.sort_by(|a, b| a.0.total_cmp(&b.0));
                YAxis {
                    scale,
                    lo: lo - pad,
                    hi: hi + pad,
                    ticks,
                }
            }
        }
    }
}
