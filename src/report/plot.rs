//! Plots of the key metrics over steps (plotters): loss, reward mean ± std, grad norm, KL,
//! entropy, completion lengths, step time and peak memory, each with the crash step and
//! the findings that concern it marked. PNG through the bitmap backend with DejaVuSans
//! registered from bytes (no system font library), SVG through the SVG backend.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::detect::{Finding, Severity};
use crate::error::{Error, Result};
use crate::logscan::frame::LogFrame;

/// DejaVuSans, registered as `sans-serif` before any text is drawn.
static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");
static FONT_ONCE: Once = Once::new();

fn register_font() {
    FONT_ONCE.call_once(|| {
        // The font is a valid TTF compiled into the binary; a failure would only leave
        // text undrawn, which the drawing calls below report as an error, not a panic.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// One line of a panel.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// `(step, value)`; NaN/±inf values are drawn as red markers at the top.
    pub points: Vec<(i64, f64)>,
}

/// One panel: a metric family over steps.
#[derive(Debug, Clone)]
pub struct Panel {
    /// File-name key (`loss`, `reward`, …).
    pub key: &'static str,
    /// Title drawn above the panel.
    pub title: String,
    /// Lines.
    pub series: Vec<Series>,
    /// A shaded band `(step, low, high)` (reward mean ± std).
    pub band: Vec<(i64, f64, f64)>,
    /// Findings marked on this panel: `(first, last, severity, label)`.
    pub marks: Vec<(i64, i64, Severity, String)>,
}

/// Which detectors concern which panel.
fn panel_detectors(key: &str) -> &'static [&'static str] {
    match key {
        "loss" => &["zero-loss", "nan-grad", "plateau"],
        "reward" => &["dead-groups", "adv-explosion", "plateau", "zero-loss"],
        "grad_norm" => &["nan-grad", "grad-spike", "zero-grad"],
        "kl" => &["kl-explosion", "kl-negative", "logprob-mismatch"],
        "entropy" => &["entropy-collapse"],
        "completion_len" => &["empty-completions", "truncation"],
        "step_time" => &["slowdown"],
        "memory" => &["mem-growth"],
        _ => &[],
    }
}

/// Canonical metrics [`panels`] reads.
pub const METRICS: &[&str] = &[
    "loss",
    "val_loss",
    "reward_mean",
    "reward_std_total",
    "reward_std",
    "grad_norm",
    "kl",
    "entropy",
    "completion_len_min",
    "completion_len_mean",
    "completion_len_max",
    "step_time",
    "it_per_sec",
    "peak_memory_gb",
];

/// The panels that have data in `frame`, with `findings` attached where they belong.
pub fn panels(frame: &LogFrame, findings: &[Finding]) -> Vec<Panel> {
    let s = |name: &str| frame.series(name);
    let line = |label: &str, pts: Vec<(i64, f64)>| Series {
        label: label.to_string(),
        points: pts,
    };
    let mut out = Vec::new();
    let mut push = |key: &'static str, title: &str, series: Vec<Series>, band| {
        let series: Vec<Series> = series
            .into_iter()
            .filter(|x| !x.points.is_empty())
            .collect();
        if series.is_empty() {
            return;
        }
        let marks = findings
            .iter()
            .filter(|f| panel_detectors(key).contains(&f.detector.as_str()))
            .filter_map(|f| Some((f.first_step?, f.last_step?, f.severity, f.detector.clone())))
            .collect();
        out.push(Panel {
            key,
            title: title.to_string(),
            series,
            band,
            marks,
        });
    };
    push(
        "loss",
        "Loss",
        vec![line("loss", s("loss")), line("val_loss", s("val_loss"))],
        Vec::new(),
    );
    let mean = s("reward_mean");
    let std: std::collections::HashMap<i64, f64> = {
        let a = s("reward_std_total");
        if a.is_empty() {
            s("reward_std")
        } else {
            a
        }
    }
    .into_iter()
    .collect();
    let band = mean
        .iter()
        .filter_map(|(st, m)| std.get(st).map(|sd| (*st, m - sd, m + sd)))
        .filter(|(_, a, b)| a.is_finite() && b.is_finite())
        .collect();
    push(
        "reward",
        "Reward mean ± std",
        vec![line("reward_mean", mean.clone())],
        band,
    );
    push(
        "grad_norm",
        "Grad norm",
        vec![line("grad_norm", s("grad_norm"))],
        Vec::new(),
    );
    push("kl", "KL", vec![line("kl", s("kl"))], Vec::new());
    push(
        "entropy",
        "Entropy",
        vec![line("entropy", s("entropy"))],
        Vec::new(),
    );
    push(
        "completion_len",
        "Completion length (tokens)",
        vec![
            line("min", s("completion_len_min")),
            line("mean", s("completion_len_mean")),
            line("max", s("completion_len_max")),
        ],
        Vec::new(),
    );
    let mut st = s("step_time");
    let mut st_label = "step_time";
    if st.is_empty() {
        st = s("it_per_sec")
            .into_iter()
            .filter(|(_, v)| *v > 0.0)
            .map(|(k, v)| (k, 1.0 / v))
            .collect();
        st_label = "1 / it_per_sec";
    }
    push(
        "step_time",
        "Step time (s)",
        vec![line(st_label, st)],
        Vec::new(),
    );
    push(
        "memory",
        "Peak memory (GB)",
        vec![line("peak_memory_gb", s("peak_memory_gb"))],
        Vec::new(),
    );
    out
}

const PALETTE: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

fn severity_color(s: Severity) -> RGBColor {
    match s {
        Severity::Info => RGBColor(120, 120, 120),
        Severity::Warning => RGBColor(230, 160, 0),
        Severity::Error => RGBColor(214, 39, 40),
        Severity::Critical => RGBColor(140, 0, 60),
    }
}

fn draw_err<E: std::fmt::Debug>(e: E) -> Error {
    Error::Usage(format!("drawing a plot failed: {e:?}"))
}

/// Draw `panel` into `area`, with a dashed vertical line at `crash`.
pub fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
    crash: Option<i64>,
) -> Result<()> {
    register_font();
    area.fill(&WHITE).map_err(draw_err)?;
    let finite: Vec<f64> = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(panel.band.iter().flat_map(|b| [b.1, b.2]))
        .filter(|v| v.is_finite())
        .collect();
    let steps: Vec<i64> = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .chain(crash)
        .collect();
    let (mut x0, mut x1) = (
        steps.iter().copied().min().unwrap_or(0),
        steps.iter().copied().max().unwrap_or(1),
    );
    if x1 <= x0 {
        x0 -= 1;
        x1 += 1;
    }
    let pad_x = ((x1 - x0) as f64 * 0.02).max(0.5);
    let (mut y0, mut y1) = finite
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(*v), b.max(*v))
        });
    if !y0.is_finite() {
        (y0, y1) = (0.0, 1.0);
    }
    if y1 - y0 < 1e-12 {
        let d = if y0.abs() > 1e-12 {
            y0.abs() * 0.1
        } else {
            1.0
        };
        y0 -= d;
        y1 += d;
    }
    let pad_y = (y1 - y0) * 0.08;
    let (y0, y1) = (y0 - pad_y, y1 + pad_y);
    let xr = (x0 as f64 - pad_x)..(x1 as f64 + pad_x);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 18))
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(60)
        .build_cartesian_2d(xr.clone(), y0..y1)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .label_style(("sans-serif", 12))
        .light_line_style(RGBColor(235, 235, 235))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| tick_label(*y, y1 - y0))
        .draw()
        .map_err(draw_err)?;
    // Findings: translucent spans over their step range, labelled at the top.
    for (k, (a, b, sev, label)) in panel.marks.iter().enumerate() {
        let c = severity_color(*sev);
        let (l, r) = (*a as f64 - 0.5, *b as f64 + 0.5);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(l, y0), (r, y1)],
                c.mix(0.18).filled(),
            )))
            .map_err(draw_err)?;
        // Labels of spans in the right half end at the span instead of starting there.
        let per_px = (xr.end - xr.start) / (area.dim_in_pixel().0 as f64 - 80.0).max(1.0);
        let width = label.chars().count() as f64 * 7.0 * per_px;
        let lx = if l > (xr.start + xr.end) / 2.0 {
            (r - width).max(xr.start)
        } else {
            l
        };
        chart
            .draw_series(std::iter::once(Text::new(
                label.clone(),
                (lx, y0 + (y1 - y0) * (0.02 + 0.08 * k as f64)),
                ("sans-serif", 12)
                    .into_font()
                    .color(&c)
                    .pos(Pos::new(HPos::Left, VPos::Bottom)),
            )))
            .map_err(draw_err)?;
    }
    if !panel.band.is_empty() {
        let mut poly: Vec<(f64, f64)> = panel.band.iter().map(|b| (b.0 as f64, b.2)).collect();
        poly.extend(panel.band.iter().rev().map(|b| (b.0 as f64, b.1)));
        chart
            .draw_series(std::iter::once(Polygon::new(
                poly,
                PALETTE[0].mix(0.2).filled(),
            )))
            .map_err(draw_err)?;
    }
    for (i, s) in panel.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        // Break the line at non-finite values.
        let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for (x, y) in &s.points {
            if y.is_finite() {
                if let Some(seg) = segments.last_mut() {
                    seg.push((*x as f64, *y));
                }
            } else if segments.last().is_some_and(|l| !l.is_empty()) {
                segments.push(Vec::new());
            }
        }
        let mut labelled = false;
        for seg in segments.into_iter().filter(|s| !s.is_empty()) {
            let single = seg.len() == 1;
            let ann = chart
                .draw_series(LineSeries::new(seg.clone(), color.stroke_width(2)))
                .map_err(draw_err)?;
            if !labelled {
                ann.label(s.label.clone()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
                labelled = true;
            }
            if single || seg.len() <= 40 {
                chart
                    .draw_series(seg.iter().map(|p| Circle::new(*p, 2, color.filled())))
                    .map_err(draw_err)?;
            }
        }
        let bad: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| !p.1.is_finite())
            .map(|p| (p.0 as f64, y1 - (y1 - y0) * 0.06))
            .collect();
        if !bad.is_empty() {
            let red = RGBColor(214, 39, 40);
            chart
                .draw_series(bad.iter().map(|p| TriangleMarker::new(*p, 6, red.filled())))
                .map_err(draw_err)?
                .label(format!("{} non-finite", s.label))
                .legend(move |(x, y)| TriangleMarker::new((x + 8, y), 5, red.filled()));
        }
    }
    if let Some(c) = crash {
        let red = RGBColor(200, 0, 0);
        let x = c as f64;
        chart
            .draw_series(DashedLineSeries::new(
                vec![(x, y0), (x, y1)],
                6,
                4,
                red.stroke_width(2),
            ))
            .map_err(draw_err)?
            .label(format!("crash (step {c})"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], red.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 12))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(200, 200, 200))
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// A y-axis tick label with as many decimals as the axis range needs.
fn tick_label(y: f64, range: f64) -> String {
    let a = y.abs();
    if a <= range.abs() * 1e-9 {
        return "0".to_string();
    }
    if !(1e-4..1e6).contains(&a) {
        return format!("{y:.2e}");
    }
    let decimals = if range > 0.0 && range.is_finite() {
        (-(range / 5.0).log10().floor()).clamp(0.0, 6.0) as usize
    } else {
        3
    };
    format!("{y:.decimals$}")
}

/// Image format of a plot file, from its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlotFormat {
    /// `.png`
    Png,
    /// `.svg`
    Svg,
}

impl PlotFormat {
    /// The format implied by `path`'s extension (`png`/`svg`), else a usage error.
    pub fn from_path(path: &Path) -> Result<PlotFormat> {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("png") => Ok(PlotFormat::Png),
            Some("svg") => Ok(PlotFormat::Svg),
            _ => Err(Error::Usage(format!(
                "{}: plot file must end in .png or .svg",
                path.display()
            ))),
        }
    }
}

/// Panel size in pixels.
pub const PANEL_SIZE: (u32, u32) = (900, 320);

/// Draw one panel to `path` (PNG or SVG by extension).
pub fn write_panel(path: &Path, panel: &Panel, crash: Option<i64>) -> Result<()> {
    match PlotFormat::from_path(path)? {
        PlotFormat::Png => {
            let root = BitMapBackend::new(path, PANEL_SIZE).into_drawing_area();
            draw_panel(&root, panel, crash)?;
            root.present().map_err(|e| file_err(path, e))
        }
        PlotFormat::Svg => {
            let root = SVGBackend::new(path, PANEL_SIZE).into_drawing_area();
            draw_panel(&root, panel, crash)?;
            root.present().map_err(|e| file_err(path, e))
        }
    }
}

fn file_err<E: std::fmt::Debug>(path: &Path, e: E) -> Error {
    Error::Export {
        path: path.to_path_buf(),
        msg: format!("writing the plot failed: {e:?}"),
    }
}

/// Draw every panel in a two-column grid to `path` (PNG or SVG by extension). Errors when
/// there is nothing to draw.
pub fn write_grid(path: &Path, panels: &[Panel], crash: Option<i64>) -> Result<()> {
    if panels.is_empty() {
        return Err(Error::Usage(format!(
            "{}: no plottable metric in the logs (loss, reward, grad norm, kl, entropy, lengths, step time, memory)",
            path.display()
        )));
    }
    let cols = if panels.len() == 1 { 1 } else { 2 };
    let rows = panels.len().div_ceil(cols);
    let size = (PANEL_SIZE.0 * cols as u32, PANEL_SIZE.1 * rows as u32);
    match PlotFormat::from_path(path)? {
        PlotFormat::Png => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            root.fill(&WHITE).map_err(draw_err)?;
            for (area, p) in root.split_evenly((rows, cols)).iter().zip(panels) {
                draw_panel(area, p, crash)?;
            }
            root.present().map_err(|e| file_err(path, e))
        }
        PlotFormat::Svg => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            root.fill(&WHITE).map_err(draw_err)?;
            for (area, p) in root.split_evenly((rows, cols)).iter().zip(panels) {
                draw_panel(area, p, crash)?;
            }
            root.present().map_err(|e| file_err(path, e))
        }
    }
}
