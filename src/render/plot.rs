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
use crate::frames::log::frame::LogFrame;
use crate::render::axis::YAxis;
pub use crate::render::axis::{nice_step, tick_text, ticks_in, YScale};

/// DejaVuSans, registered as `sans-serif` before any text is drawn.
static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");
static FONT_ONCE: Once = Once::new();

/// Register the bundled font as `sans-serif` (once), before any text is drawn.
pub(crate) fn register_font() {
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
    /// Index in `marks` of the run's most severe finding, when it concerns this panel.
    pub most_severe: Option<usize>,
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
        let mine: Vec<&Finding> = findings
            .iter()
            .filter(|f| panel_detectors(key).contains(&f.detector.as_str()))
            .filter(|f| f.first_step.is_some() && f.last_step.is_some())
            .collect();
        let marks = mine
            .iter()
            .filter_map(|f| Some((f.first_step?, f.last_step?, f.severity, f.detector.clone())))
            .collect();
        out.push(Panel {
            key,
            title: title.to_string(),
            series,
            band,
            marks,
            most_severe: None,
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
    mark_most_severe(&mut out, findings);
    out
}

/// Mark, on every panel that shows it, the most severe finding among those the panels
/// show (ties: the one spanning more steps, then the earlier).
fn mark_most_severe(panels: &mut [Panel], findings: &[Finding]) {
    let shown = |f: &Finding| {
        panels
            .iter()
            .any(|p| panel_detectors(p.key).contains(&f.detector.as_str()))
    };
    let Some(w) = findings
        .iter()
        .filter(|f| f.first_step.is_some() && f.last_step.is_some() && shown(f))
        .max_by(|a, b| {
            (a.severity, a.count, std::cmp::Reverse(a.first_step)).cmp(&(
                b.severity,
                b.count,
                std::cmp::Reverse(b.first_step),
            ))
        })
    else {
        return;
    };
    for p in panels.iter_mut() {
        p.most_severe = p.marks.iter().position(|m| {
            Some(m.0) == w.first_step && Some(m.1) == w.last_step && m.3 == w.detector
        });
    }
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

/// Font sizes in pixels (title, axis labels, legend, finding labels).
const TITLE_PX: u32 = 22;
const LABEL_PX: u32 = 16;
const LEGEND_PX: u32 = 15;
const MARK_PX: u32 = 15;
/// Height of the title-and-legend strip above the chart.
const HEAD_PX: u32 = 34;
/// Each finding gets a lane of this share of the data's height under the data.
const LANE_SHARE: f64 = 0.11;

/// Draw `panel` into `area`, with a dashed vertical line at `crash`: the title and the
/// legend in a strip above the chart (never over the data), a zero line or a symmetric-log
/// axis where a series changes sign, and each finding as its own lane under the data with
/// its label (the run's most severe finding outlined and named so).
pub fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
    crash: Option<i64>,
) -> Result<()> {
    register_font();
    area.fill(&WHITE).map_err(draw_err)?;
    let (head, body) = area.split_vertically(HEAD_PX);
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
        .chain(panel.marks.iter().flat_map(|m| [m.0, m.1]))
        .collect();
    let (mut x0, mut x1) = (
        steps.iter().copied().min().unwrap_or(0),
        steps.iter().copied().max().unwrap_or(1),
    );
    if x1 <= x0 {
        x0 -= 1;
        x1 += 1;
    }
    let pad_x = ((x1 - x0) as f64 * 0.02).max(0.6);
    let xr = (x0 as f64 - pad_x)..(x1 as f64 + pad_x);
    let line_values: Vec<f64> = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|v| v.is_finite())
        .collect();
    let y = YAxis::new(&finite, &line_values);
    let span = y.hi - y.lo;
    let lanes = panel.marks.len();
    let lane_h = span * LANE_SHARE;
    let bottom = y.lo - lane_h * lanes as f64;
    let top = y.hi + span * 0.02;
    let fy = |v: f64| y.scale.fwd(v);

    let mut chart = ChartBuilder::on(&body)
        .margin_left(8)
        .margin_right(14)
        .margin_bottom(4)
        .x_label_area_size(42)
        .y_label_area_size(74)
        .build_cartesian_2d(xr.clone(), bottom..top)
        .map_err(draw_err)?;
    // y ticks are drawn below from `y.ticks` (nice numbers, distinct labels); plotters
    // draws the x axis, with labels only at whole steps.
    chart
        .configure_mesh()
        .x_desc("step")
        .label_style(("sans-serif", LABEL_PX))
        .axis_desc_style(("sans-serif", LABEL_PX))
        .bold_line_style(RGBColor(225, 225, 225))
        .light_line_style(RGBColor(245, 245, 245))
        .y_labels(0)
        .x_labels(10)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 {
                format!("{x:.0}")
            } else {
                String::new()
            }
        })
        .draw()
        .map_err(draw_err)?;
    let base = body.get_base_pixel();
    // Labels closer than a line of text to one already drawn are dropped (symlog ticks
    // near zero): zero first, then the outermost.
    let mut order: Vec<&(f64, String)> = y.ticks.iter().collect();
    order.sort_by(|a, b| {
        (a.0 != 0.0)
            .cmp(&(b.0 != 0.0))
            .then(b.0.abs().total_cmp(&a.0.abs()))
    });
    let mut drawn: Vec<i32> = Vec::new();
    for (t, label) in order {
        let py = chart.backend_coord(&(xr.start, *t)).1;
        if drawn.iter().any(|d| (d - py).abs() < LABEL_PX as i32 + 2) {
            continue;
        }
        drawn.push(py);
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(xr.start, *t), (xr.end, *t)],
                RGBColor(225, 225, 225).stroke_width(1),
            )))
            .map_err(draw_err)?;
        let (px, py) = chart.backend_coord(&(xr.start, *t));
        body.draw(&Text::new(
            label.clone(),
            (px - base.0 - 6, py - base.1),
            ("sans-serif", LABEL_PX)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Right, VPos::Center)),
        ))
        .map_err(draw_err)?;
    }

    // A zero line where the data crosses zero.
    if y.lo < 0.0 && y.hi > 0.0 {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(xr.start, 0.0), (xr.end, 0.0)],
                RGBColor(90, 90, 90).stroke_width(1),
            )))
            .map_err(draw_err)?;
    }
    if lanes > 0 {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(xr.start, y.lo), (xr.end, y.lo)],
                RGBColor(170, 170, 170).stroke_width(1),
            )))
            .map_err(draw_err)?;
    }

    // Findings: one lane each under the data; the label inside the lane.
    let plot_px = (body.dim_in_pixel().0 as f64 - 96.0).max(1.0);
    let per_px = (xr.end - xr.start) / plot_px;
    for (k, (a, b, sev, label)) in panel.marks.iter().enumerate() {
        let c = severity_color(*sev);
        let worst = panel.most_severe == Some(k);
        let (l, r) = (*a as f64 - 0.5, *b as f64 + 0.5);
        let lane_top = y.lo - lane_h * k as f64 - lane_h * 0.12;
        let lane_bot = y.lo - lane_h * (k + 1) as f64 + lane_h * 0.12;
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(l, lane_top), (r, lane_bot)],
                c.mix(0.35).filled(),
            )))
            .map_err(draw_err)?;
        if worst {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(l, lane_top), (r, lane_bot)],
                    c.stroke_width(2),
                )))
                .map_err(draw_err)?;
        }
        let text = if worst {
            format!("{label} ({} — most severe finding)", sev.name())
        } else {
            format!("{label} ({})", sev.name())
        };
        // Inside the lane when it fits, else beside it (right, then left), never over
        // another lane.
        let width = text.chars().count() as f64 * MARK_PX as f64 * 0.58 * per_px;
        let gap = 6.0 * per_px;
        let (lx, anchor) = if width + gap <= r - l {
            (l + gap / 2.0, HPos::Left)
        } else if r + gap + width <= xr.end {
            (r + gap, HPos::Left)
        } else if l - gap - width >= xr.start {
            (l - gap, HPos::Right)
        } else {
            (xr.start, HPos::Left)
        };
        chart
            .draw_series(std::iter::once(Text::new(
                text,
                (lx, (lane_top + lane_bot) / 2.0),
                ("sans-serif", MARK_PX)
                    .into_font()
                    .color(&RGBColor(30, 30, 30))
                    .pos(Pos::new(anchor, VPos::Center)),
            )))
            .map_err(draw_err)?;
    }

    if !panel.band.is_empty() {
        let mut poly: Vec<(f64, f64)> = panel.band.iter().map(|b| (b.0 as f64, fy(b.2))).collect();
        poly.extend(panel.band.iter().rev().map(|b| (b.0 as f64, fy(b.1))));
        chart
            .draw_series(std::iter::once(Polygon::new(
                poly,
                PALETTE[0].mix(0.18).filled(),
            )))
            .map_err(draw_err)?;
    }
    let mut legend: Vec<(String, RGBColor, bool)> = Vec::new();
    for (i, s) in panel.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        legend.push((s.label.clone(), color, false));
        // Break the line at non-finite values.
        let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for (x, v) in &s.points {
            if v.is_finite() {
                if let Some(seg) = segments.last_mut() {
                    seg.push((*x as f64, fy(*v)));
                }
            } else if segments.last().is_some_and(|l| !l.is_empty()) {
                segments.push(Vec::new());
            }
        }
        for seg in segments.into_iter().filter(|s| !s.is_empty()) {
            chart
                .draw_series(LineSeries::new(seg.clone(), color.stroke_width(2)))
                .map_err(draw_err)?;
            if seg.len() <= 40 {
                chart
                    .draw_series(seg.iter().map(|p| Circle::new(*p, 3, color.filled())))
                    .map_err(draw_err)?;
            }
        }
        let bad: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| !p.1.is_finite())
            .map(|p| (p.0 as f64, y.hi - span * 0.04))
            .collect();
        if !bad.is_empty() {
            let red = RGBColor(214, 39, 40);
            chart
                .draw_series(bad.iter().map(|p| TriangleMarker::new(*p, 7, red.filled())))
                .map_err(draw_err)?;
            legend.push((format!("{} non-finite", s.label), red, true));
        }
    }
    if let Some(c) = crash {
        let red = RGBColor(200, 0, 0);
        let x = c as f64;
        chart
            .draw_series(DashedLineSeries::new(
                vec![(x, bottom), (x, top)],
                6,
                4,
                red.stroke_width(2),
            ))
            .map_err(draw_err)?;
        legend.push((format!("crash (step {c})"), red, false));
    }
    draw_head(&head, panel, y.scale, &legend)
}

/// The title on the left and the legend entries on the right of the strip above a chart.
fn draw_head<DB: DrawingBackend>(
    head: &DrawingArea<DB, Shift>,
    panel: &Panel,
    scale: YScale,
    legend: &[(String, RGBColor, bool)],
) -> Result<()> {
    let title = match scale {
        YScale::Linear => panel.title.clone(),
        YScale::SymLog(_) => format!("{} (symlog)", panel.title),
    };
    let h = HEAD_PX as i32;
    head.draw(&Text::new(
        title,
        (12, h / 2),
        ("sans-serif", TITLE_PX)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Left, VPos::Center)),
    ))
    .map_err(draw_err)?;
    let font: TextStyle = ("sans-serif", LEGEND_PX).into_font().into();
    let mut x = head.dim_in_pixel().0 as i32 - 22;
    for (label, color, marker) in legend.iter().rev() {
        let w = head
            .estimate_text_size(label, &font)
            .map(|(w, _)| w as i32)
            .unwrap_or(label.chars().count() as i32 * 8);
        x -= w;
        head.draw(&Text::new(
            label.clone(),
            (x, h / 2),
            font.clone()
                .color(&RGBColor(40, 40, 40))
                .pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(draw_err)?;
        x -= 26;
        if *marker {
            head.draw(&TriangleMarker::new((x + 10, h / 2), 6, color.filled()))
                .map_err(draw_err)?;
        } else {
            head.draw(&PathElement::new(
                vec![(x, h / 2), (x + 20, h / 2)],
                color.stroke_width(3),
            ))
            .map_err(draw_err)?;
        }
        x -= 14;
    }
    Ok(())
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

/// Panel size in pixels: at the HTML page's two-column width (~575 px) a 16 px label is
/// still 12 px.
pub const PANEL_SIZE: (u32, u32) = (760, 340);

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
