//! mismatch's plots (plotters, PNG or SVG by extension, the font of
//! [`crate::render::plot`]): the histogram of Δlogp (signed, log-magnitude bins), the mean
//! `|Δ|` by response-position bucket, and the per-step trend of the judged metric with its
//! findings marked (drawn by [`crate::render::plot::write_panel`]).

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::error::{Error, Result};
use crate::mismatch::report::{Report, StepReport};
use crate::render::plot::{write_panel, Panel, PlotFormat, Series, PANEL_SIZE};

fn draw_err<E: std::fmt::Debug>(e: E) -> Error {
    Error::Internal(format!("drawing failed: {e:?}"))
}

/// A bar chart of `bars` (`label`, value) titled `title`, `y` described by `y_desc`.
fn bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    y_desc: &str,
    bars: &[(String, f64, RGBColor)],
) -> Result<()> {
    crate::render::plot::register_font();
    area.fill(&WHITE).map_err(draw_err)?;
    let n = bars.len().max(1) as f64;
    let ymax = bars
        .iter()
        .map(|b| b.1)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let ymax = if ymax > 0.0 { ymax * 1.08 } else { 1.0 };
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let every = (bars.len() / 8).max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n, 0f64..ymax)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(y_desc)
        .label_style(("sans-serif", 13))
        .x_labels(bars.len().min(50))
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.26 && i < labels.len() && i.is_multiple_of(every) {
                labels[i].clone()
            } else {
                String::new()
            }
        })
        .draw()
        .map_err(draw_err)?;
    chart
        .draw_series(
            bars.iter()
                .enumerate()
                .filter(|(_, b)| b.1.is_finite())
                .map(|(i, b)| {
                    Rectangle::new(
                        [(i as f64 + 0.08, 0.0), (i as f64 + 0.92, b.1)],
                        b.2.filled(),
                    )
                }),
        )
        .map_err(draw_err)?;
    Ok(())
}

fn write_bars(
    path: &Path,
    title: &str,
    y_desc: &str,
    data: &[(String, f64, RGBColor)],
) -> Result<()> {
    let fail = |e: String| Error::Export {
        path: path.to_path_buf(),
        msg: format!("writing the plot failed: {e}"),
    };
    match PlotFormat::from_path(path)? {
        PlotFormat::Png => {
            let root = BitMapBackend::new(path, PANEL_SIZE).into_drawing_area();
            bars(&root, title, y_desc, data)?;
            root.present().map_err(|e| fail(format!("{e:?}")))
        }
        PlotFormat::Svg => {
            let root = SVGBackend::new(path, PANEL_SIZE).into_drawing_area();
            bars(&root, title, y_desc, data)?;
            root.present().map_err(|e| fail(format!("{e:?}")))
        }
    }
}

const NEG: RGBColor = RGBColor(200, 80, 60);
const POS: RGBColor = RGBColor(60, 110, 190);

/// The histogram bars of a step: negative Δ from the largest magnitude in, then zero,
/// then positive Δ outwards; empty outer bins trimmed.
fn histogram_bars(s: &StepReport) -> Vec<(String, f64, RGBColor)> {
    let h = &s.histogram;
    let lab = |e: f64| format!("1e{e:.1}");
    let mut v: Vec<(String, f64, RGBColor)> = Vec::new();
    for i in (0..h.negative.len()).rev() {
        v.push((
            format!("-{}", lab(h.log10_edges[i])),
            h.negative[i] as f64,
            NEG,
        ));
    }
    v.push(("0".into(), h.zero as f64, RGBColor(120, 120, 120)));
    for i in 0..h.positive.len() {
        v.push((
            format!("+{}", lab(h.log10_edges[i])),
            h.positive[i] as f64,
            POS,
        ));
    }
    let first = v.iter().position(|b| b.1 > 0.0).unwrap_or(0);
    let last = v.iter().rposition(|b| b.1 > 0.0).unwrap_or(v.len() - 1);
    v[first..=last].to_vec()
}

/// Write the plots of `report` into `dir` with extension `ext` (`png` or `svg`):
/// `delta_hist_step<N>`, `by_position_step<N>` per step and `trend_<i>` per trend.
/// Returns the files written.
///
/// Errors: the folder cannot be created or a file written.
pub fn write_plots(report: &Report, dir: &Path, ext: &str) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut written = Vec::new();
    for s in &report.steps {
        let p = dir.join(format!("delta_hist_step{}.{ext}", s.step));
        write_bars(
            &p,
            &format!(
                "step {}: Δlogp = {} − {} (log10 |Δ| bins)",
                s.step,
                crate::mismatch::role_name(s.pair[1]),
                crate::mismatch::role_name(s.pair[0])
            ),
            "tokens",
            &histogram_bars(s),
        )?;
        written.push(p);
        let p = dir.join(format!("by_position_step{}.{ext}", s.step));
        let data: Vec<(String, f64, RGBColor)> = s
            .attribution
            .by_position
            .iter()
            .map(|b| {
                (
                    b.key.split("..").next().unwrap_or("").to_string(),
                    b.mean_abs,
                    POS,
                )
            })
            .collect();
        write_bars(
            &p,
            &format!("step {}: mean |Δlogp| by response position", s.step),
            "mean |Δ|",
            &data,
        )?;
        written.push(p);
    }
    for (i, t) in report.trends.iter().enumerate() {
        let marks = report
            .findings
            .iter()
            .filter(|f| f.detector == "mismatch-growth" || f.detector == "mismatch-jump")
            .filter_map(|f| Some((f.first_step?, f.last_step?, f.severity, f.detector.clone())))
            .collect();
        let panel = Panel {
            key: "mismatch",
            title: format!("{} ({})", t.metric, t.source),
            series: vec![Series {
                label: t.metric.clone(),
                points: t.points.clone(),
            }],
            band: vec![],
            marks,
            most_severe: None,
        };
        let p = dir.join(format!("trend_{i}.{ext}"));
        write_panel(&p, &panel, None)?;
        written.push(p);
    }
    Ok(written)
}
