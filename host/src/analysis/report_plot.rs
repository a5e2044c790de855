//! The analysis of a profiling run as one picture (`railtrace report --plot`): four panels
//! in a 2 × 2 layout, as SVG or PNG by the output's extension.
//!
//! 1. The stitched profiles on one time axis (time of interest from each execution's
//!    start, µs): the rig's total power as a step line of the bins' means over a band of
//!    their confidence intervals, the GPU logger's as a mark per bin with its interval as
//!    an error bar; the kernel's mean duration shaded and marked.
//! 2. SSE against SSP: each execution's mean rig power (its energy over its duration)
//!    against the time since its train's first start, coloured by regime, with the
//!    settling threshold; when every execution is SSE the panel says so and why.
//! 3. The execution times' histogram: every duration cluster shaded (the kept, dominant
//!    one in blue), the fixed-margin bin's ends as dashed lines, the counts in the
//!    legend. A far tail is left off the axis and counted.
//! 4. The clock links' residuals, device → host per trigger edge and GPU → host per
//!    bracketed clock read, each on its own scale (µs, or ns when under a microsecond),
//!    with the fit's RMS in the legend.

use std::collections::HashMap;
use std::path::Path;

use anyhow::bail;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::analysis::stitch::{Analysis, Point};
use crate::store::plot::Format;

/// The picture's size the fixed sizes below are for; others scale them.
const REFERENCE: (f64, f64) = (2000.0, 1400.0);

const RIG: RGBColor = RGBColor(0x1f, 0x5f, 0xa8);
const RIG_BAND: RGBColor = RGBColor(0xb9, 0xd0, 0xea);
const LOGGER: RGBColor = RGBColor(0x8e, 0x3b, 0xa0);
const KERNEL: RGBColor = RGBColor(0xec, 0xec, 0xec);
const MARK: RGBColor = RGBColor(0x40, 0x40, 0x40);
const SSE: RGBColor = RGBColor(0x4e, 0x79, 0xa7);
const SSP: RGBColor = RGBColor(0xe1, 0x6a, 0x10);
const KEPT: RGBColor = RGBColor(0x4e, 0x79, 0xa7);
const KEPT_SHADE: RGBColor = RGBColor(0xd3, 0xe1, 0xf0);
const OTHER: RGBColor = RGBColor(0x8a, 0x8a, 0x8a);
const OTHER_SHADES: [RGBColor; 2] = [RGBColor(0xf6, 0xe2, 0xc6), RGBColor(0xe4, 0xe4, 0xe4)];
const FIXED: RGBColor = RGBColor(0xc0, 0x1c, 0x2b);
const DEVICE: RGBColor = RGBColor(0x00, 0x80, 0x60);
const GPU: RGBColor = RGBColor(0x8e, 0x3b, 0xa0);
const GRID_LIGHT: RGBColor = RGBColor(0xee, 0xee, 0xee);
const GRID_BOLD: RGBColor = RGBColor(0xd0, 0xd0, 0xd0);

/// How big, and the title.
#[derive(Debug, Clone)]
pub struct Options {
    /// Picture width, px.
    pub width: u32,
    /// Picture height, px.
    pub height: u32,
    /// The title; "railtrace report" when empty.
    pub title: String,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            width: 2000,
            height: 1400,
            title: String::new(),
        }
    }
}

/// The output's format, or why `out` and `opts` cannot make a picture (a caller can check
/// before the analysis).
pub fn check(out: &Path, opts: &Options) -> anyhow::Result<Format> {
    let format = Format::of(out)?;
    let (w, h) = (opts.width, opts.height);
    if !(1000..=16_384).contains(&w) || !(700..=16_384).contains(&h) {
        bail!("{w}×{h} px: the report's picture must be 1000 to 16384 px wide and 700 to 16384 px high");
    }
    Ok(format)
}

/// Draws `a` into `out` (`.svg` or `.png`, see [`Format::of`]).
pub fn render(a: &Analysis, out: &Path, opts: &Options) -> anyhow::Result<()> {
    check(out, opts)?;
    let title = if opts.title.is_empty() {
        "railtrace report"
    } else {
        &opts.title
    };
    let size = (opts.width, opts.height);
    let l = Layout::new(opts.width, opts.height);
    // The bins the rig or the logger does not support are left out, and said so.
    let a = &a.drawable();
    crate::store::plot::draw_to!(out, size, |root| draw(root, a, title, &l));
    Ok(())
}

/// Sizes: those of a 2000 × 1400 px picture, scaled.
#[derive(Debug, Clone, Copy)]
struct Layout {
    scale: f64,
}

impl Layout {
    fn new(width: u32, height: u32) -> Layout {
        let scale = (f64::from(width) / REFERENCE.0).min(f64::from(height) / REFERENCE.1);
        Layout {
            scale: scale.clamp(0.5, 4.0),
        }
    }

    /// `n` px at 2000 × 1400, scaled; at least 1.
    fn px(&self, n: u32) -> u32 {
        ((f64::from(n) * self.scale).round() as u32).max(1)
    }

    /// A font size, scaled and even (plotters' ab_glyph text sets the glyphs of odd sizes
    /// a pixel off the baseline).
    fn font(&self, n: u32) -> u32 {
        (self.px(n) / 2 * 2).max(10)
    }

    /// A legend icon's width and half-height, px.
    fn icon(&self) -> (i32, i32) {
        (self.px(24) as i32, self.px(7) as i32)
    }

    /// Headroom above `hi` for a legend of `rows` rows, for a plot `plot_px` high
    /// showing `lo..hi` under it: the top of the y range.
    fn with_legend(&self, lo: f64, hi: f64, rows: usize, plot_px: f64) -> f64 {
        let legend = rows as f64 * f64::from(self.font(LEGEND)) * 1.5 + f64::from(self.px(20));
        hi + (hi - lo) * legend / (plot_px - legend).max(plot_px / 3.0)
    }
}

/// Font sizes at the reference size.
const TITLE: u32 = 30;
const CAPTION: u32 = 22;
const AXIS: u32 = 18;
const LABELS: u32 = 16;
const LEGEND: u32 = 16;
/// Room for the axes' labels and descriptions.
const X_AREA: u32 = 56;
const Y_AREA: u32 = 86;

type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;
type Drawn<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Decimals enough to tell apart labels `step` apart.
fn decimals(step: f64) -> usize {
    if step.is_finite() && step > 0.0 {
        (-step.log10().floor()).clamp(0.0, 9.0) as usize
    } else {
        0
    }
}

/// The largest even font size up to `size` at which `text` fits `width` px.
fn fit<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
    mut size: u32,
    width: u32,
) -> Result<u32, DrawingAreaErrorKind<DB::ErrorType>> {
    while size > 10
        && area
            .estimate_text_size(text, &("sans-serif", size).into_text_style(area))?
            .0
            > width
    {
        size -= 2;
    }
    Ok(size)
}

fn plural(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// A chart's axes.
#[derive(Debug, Clone, Copy)]
struct Axes<'s> {
    x: (f64, f64),
    y: (f64, f64),
    x_desc: &'s str,
    y_desc: &'s str,
    /// At most this many labels on x and y.
    labels: (usize, usize),
    /// Whole numbers only (counts, indices) on x and y.
    whole: (bool, bool),
}

/// At most `n` labels on `range` and their decimals: whole numbers only when `whole`.
fn labels((lo, hi): (f64, f64), n: usize, whole: bool) -> (usize, usize) {
    if whole {
        // Plotters picks steps of 1, 2 or 5 × 10ᵏ: no more labels than whole numbers
        // in the range keeps the step at 1 or more.
        (n.min((hi - lo).floor().max(1.0) as usize + 1), 0)
    } else {
        (n, decimals((hi - lo) / n as f64))
    }
}

/// A chart on `area` with a caption, its mesh drawn.
fn chart<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    caption: &str,
    axes: &Axes<'_>,
    l: &Layout,
) -> Result<Chart<'a, DB>, DrawingAreaErrorKind<DB::ErrorType>> {
    let width = area.dim_in_pixel().0;
    let size = fit(area, caption, l.font(CAPTION), width)?;
    let (x, y) = (axes.x, axes.y);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", size))
        .margin_right(l.px(16))
        .margin_top(l.px(6))
        .x_label_area_size(l.px(X_AREA))
        .y_label_area_size(l.px(Y_AREA))
        .build_cartesian_2d(x.0..x.1, y.0..y.1)?;
    let (x_labels, x_dec) = labels(x, axes.labels.0, axes.whole.0);
    let (y_labels, y_dec) = labels(y, axes.labels.1, axes.whole.1);
    chart
        .configure_mesh()
        .x_desc(axes.x_desc)
        .y_desc(axes.y_desc)
        .axis_desc_style(("sans-serif", l.font(AXIS)))
        .label_style(("sans-serif", l.font(LABELS)))
        .x_labels(x_labels)
        .y_labels(y_labels)
        .x_label_formatter(&|v| format!("{v:.x_dec$}"))
        .y_label_formatter(&|v| format!("{v:.y_dec$}"))
        .light_line_style(GRID_LIGHT)
        .bold_line_style(GRID_BOLD)
        .draw()?;
    Ok(chart)
}

/// The legend, in the upper right corner.
fn legend<'a, DB: DrawingBackend + 'a>(chart: &mut Chart<'a, DB>, l: &Layout) -> Drawn<DB> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", l.font(LEGEND)))
        .margin(l.px(8))
        .legend_area_size(l.px(36))
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(0xa0, 0xa0, 0xa0))
        .draw()
}

/// The height of the plotting area a [`chart`] on `area` will have (about).
fn plot_height<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, l: &Layout) -> f64 {
    let h = area.dim_in_pixel().1;
    f64::from(
        h.saturating_sub(l.px(X_AREA) + l.px(6) + 2 * l.font(CAPTION))
            .max(50),
    )
}

/// A panel with a caption and a few lines of text in a frame instead of a chart.
fn message<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    lines: &[String],
    l: &Layout,
) -> Drawn<DB> {
    let w = area.dim_in_pixel().0;
    let size = fit(area, caption, l.font(CAPTION), w)?;
    let inner = area.titled(caption, ("sans-serif", size))?;
    let (iw, ih) = inner.dim_in_pixel();
    let m = l.px(16) as i32;
    inner.draw(&Rectangle::new(
        [(m, m), (iw as i32 - m, ih as i32 - m)],
        GRID_BOLD.stroke_width(l.px(2)),
    ))?;
    let text_w = iw.saturating_sub(4 * m as u32);
    let mut size = l.font(AXIS);
    for line in lines {
        size = size.min(fit(&inner, line, l.font(AXIS), text_w)?);
    }
    let style = ("sans-serif", size)
        .into_text_style(&inner)
        .pos(Pos::new(HPos::Center, VPos::Center));
    let step = f64::from(size) * 1.8;
    let top = f64::from(ih) / 2.0 - step * (lines.len() as f64 - 1.0) / 2.0;
    for (i, line) in lines.iter().enumerate() {
        let y = (top + step * i as f64) as i32;
        inner.draw(&Text::new(line.as_str(), (iw as i32 / 2, y), style.clone()))?;
    }
    Ok(())
}

/// Draws the picture.
fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    a: &Analysis,
    title: &str,
    l: &Layout,
) -> Drawn<DB> {
    root.fill(&WHITE)?;
    let m = l.px(16);
    let root = root.margin(m, m, m, m);
    let width = root.dim_in_pixel().0;
    let root = root.titled(
        title,
        ("sans-serif", fit(&root, title, l.font(TITLE), width)?),
    )?;
    let line = subtitle(a);
    let root = root.titled(
        &line,
        ("sans-serif", fit(&root, &line, l.font(AXIS), width)?),
    )?;
    let panels = root.split_evenly((2, 2));
    let gap = l.px(14);
    let inner: Vec<_> = panels
        .iter()
        .map(|p| p.margin(gap, gap, gap, gap))
        .collect();
    profiles(&inner[0], a, l)?;
    sse_ssp(&inner[1], a, l)?;
    histogram(&inner[2], a, l)?;
    residuals(&inner[3], a, l)?;
    root.present()
}

/// The line under the title: what was run and how it was analysed.
fn subtitle(a: &Analysis) -> String {
    let trains = a
        .executions
        .iter()
        .map(|e| e.train)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let kept = a.executions.iter().filter(|e| e.kept).count();
    let o = &a.options;
    let rig = if a.has_rig() {
        format!(
            "rig energy {:.3} mJ per kept execution; clock rate errors: device {:+.2} ppm, GPU {:+.2} ppm",
            a.rig_energy_j * 1e3,
            a.device.rate_error_ppm,
            a.gpu.rate_error_ppm
        )
    } else {
        format!(
            "no rig (the logger alone); clock rate error: GPU {:+.2} ppm",
            a.gpu.rate_error_ppm
        )
    };
    format!(
        "{} in {}, {kept} kept; profile bins {:.0} µs, horizon {:.1} ms, {:.0} % confidence; {rig}",
        plural(a.executions.len(), "execution"),
        plural(trains, "train"),
        o.bin_s * 1e6,
        o.horizon_s * 1e3,
        o.confidence * 100.0,
    )
}

/// The mean duration of the kept executions (of all when none is kept), s, and how many.
fn kernel_duration(a: &Analysis) -> (f64, usize) {
    let kept: Vec<f64> = a
        .executions
        .iter()
        .filter(|e| e.kept && e.duration_s.is_finite())
        .map(|e| e.duration_s)
        .collect();
    let d = if kept.is_empty() {
        a.executions
            .iter()
            .map(|e| e.duration_s)
            .filter(|d| d.is_finite())
            .collect()
    } else {
        kept
    };
    (d.iter().sum::<f64>() / d.len().max(1) as f64, d.len())
}

/// The runs of consecutive bins with a finite mean (an empty bin breaks a line).
fn runs(points: &[Point]) -> Vec<&[Point]> {
    points
        .split(|p| !(p.mean_w.is_finite() && p.lo_s.is_finite() && p.hi_s.is_finite()))
        .filter(|r| !r.is_empty())
        .collect()
}

/// A confidence interval's half-width, or none.
fn ci(p: &Point) -> Option<f64> {
    (p.ci_half_w.is_finite() && p.ci_half_w >= 0.0).then_some(p.ci_half_w)
}

/// The words for `n` intervals cut at the axis' ends.
fn cut_note(n: usize) -> String {
    match n {
        0 => String::new(),
        n => format!(" ({n} cut at the axis)"),
    }
}

/// Panel 1: the logger's and the rig's stitched profiles on one time axis.
fn profiles<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    a: &Analysis,
    l: &Layout,
) -> Drawn<DB> {
    let (iw, ih) = l.icon();
    let caption = "Stitched power profiles (kept executions, on one time axis)";
    let all = a
        .rig
        .iter()
        .chain(&a.logger)
        .filter(|p| p.mean_w.is_finite());
    // The means set the power axis; an interval past it (a bin of two or three readings
    // has a wide one) is cut at the axis' ends.
    let (mut x1, mut lo, mut hi) = (0.0f64, 0.0f64, f64::NEG_INFINITY);
    for p in all {
        x1 = x1.max(p.hi_s * 1e6);
        lo = lo.min(p.mean_w);
        hi = hi.max(p.mean_w);
    }
    if !hi.is_finite() {
        return message(
            area,
            caption,
            &["No stitched bins: no reading fell within an execution's horizon.".into()],
            l,
        );
    }
    let (mean_d, n_kept) = kernel_duration(a);
    let mean_us = mean_d * 1e6;
    let x1 = x1.max(mean_us) * 1.01;
    let hi = if hi > lo { hi } else { lo + 1.0 };
    let pad = (hi - lo) * 0.06;
    let (lo, hi) = (if lo < 0.0 { lo - pad } else { lo }, hi + pad);
    let rows = 3 + a.support.notes.len();
    let y1 = l.with_legend(lo, hi, rows, plot_height(area, l));
    let cut = |w: f64| w.clamp(lo, y1);
    let cut_off = |p: &Point| ci(p).is_some_and(|c| p.mean_w - c < lo || p.mean_w + c > y1);
    let axes = Axes {
        x: (0.0, x1),
        y: (lo, y1),
        x_desc: "time of interest from the execution's start (µs)",
        y_desc: "power (W)",
        labels: (10, 8),
        whole: (false, false),
    };
    let mut chart = chart(area, caption, &axes, l)?;
    let bin_us = a.options.bin_s * 1e6;
    let conf = a.options.confidence * 100.0;

    // The kernel's mean run, shaded, and its end.
    if mean_us.is_finite() && mean_us > 0.0 {
        chart.draw_series([Rectangle::new([(0.0, lo), (mean_us, y1)], KERNEL.filled())])?;
        let style = MARK.stroke_width(l.px(2));
        let dash = (l.px(8), l.px(5));
        chart
            .draw_series(DashedLineSeries::new(
                [(mean_us, lo), (mean_us, y1)],
                dash.0,
                dash.1,
                style,
            ))?
            .label(format!(
                "kernel: mean duration {mean_us:.1} µs (shaded; {})",
                plural(n_kept, "execution")
            ))
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + Rectangle::new([(0, -ih), (iw, ih)], KERNEL.filled())
                    + PathElement::new([(iw, -ih), (iw, ih)], style)
            });
    }

    // The rig: CI band per bin under a step line of the means.
    chart.draw_series(
        a.rig
            .iter()
            .filter(|p| p.mean_w.is_finite())
            .filter_map(|p| {
                let c = ci(p)?;
                Some(Rectangle::new(
                    [
                        (p.lo_s * 1e6, cut(p.mean_w - c)),
                        (p.hi_s * 1e6, cut(p.mean_w + c)),
                    ],
                    RIG_BAND.filled(),
                ))
            }),
    )?;
    let rig_style = RIG.stroke_width(l.px(2));
    let mut labelled = false;
    for run in runs(&a.rig) {
        let steps = run
            .iter()
            .flat_map(|p| [(p.lo_s * 1e6, p.mean_w), (p.hi_s * 1e6, p.mean_w)]);
        let anno = chart.draw_series(LineSeries::new(steps, rig_style))?;
        if !labelled {
            labelled = true;
            let n = a.rig.iter().filter(|p| cut_off(p)).count();
            anno.label(format!(
                "rig: total power, mean per {bin_us:.0} µs bin (W); band: {conf:.0} % CI{}",
                cut_note(n)
            ))
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + Rectangle::new([(0, -ih), (iw, ih)], RIG_BAND.filled())
                    + PathElement::new([(0, 0), (iw, 0)], rig_style)
            });
        }
    }

    // The logger: a mark per bin with its interval as an error bar, a thin line between.
    let thin = LOGGER.mix(0.5).stroke_width(l.px(1));
    for run in runs(&a.logger) {
        let mids = run
            .iter()
            .map(|p| ((p.lo_s + p.hi_s) / 2.0 * 1e6, p.mean_w));
        chart.draw_series(LineSeries::new(mids, thin))?;
    }
    let bar = LOGGER.stroke_width(l.px(2));
    chart.draw_series(
        a.logger
            .iter()
            .filter(|p| p.mean_w.is_finite())
            .filter_map(|p| {
                let c = ci(p)?;
                let x = (p.lo_s + p.hi_s) / 2.0 * 1e6;
                Some(PathElement::new(
                    [(x, cut(p.mean_w - c)), (x, cut(p.mean_w + c))],
                    bar,
                ))
            }),
    )?;
    let r = l.px(4) as i32;
    let anno = chart.draw_series(a.logger.iter().filter(|p| p.mean_w.is_finite()).map(|p| {
        let x = (p.lo_s + p.hi_s) / 2.0 * 1e6;
        EmptyElement::at((x, p.mean_w)) + Circle::new((0, 0), r, LOGGER.filled())
    }))?;
    if a.logger.iter().any(|p| p.mean_w.is_finite()) {
        let n = a.logger.iter().filter(|p| cut_off(p)).count();
        anno.label(format!(
            "GPU logger: mean per {bin_us:.0} µs bin (W); bar: {conf:.0} % CI{}",
            cut_note(n)
        ))
        .legend(move |(x, y)| {
            EmptyElement::at((x + iw / 2, y))
                + PathElement::new([(0, -ih), (0, ih)], bar)
                + Circle::new((0, 0), r, LOGGER.filled())
        });
    }
    // What is left out, and why: a legend line each.
    for note in &a.support.notes {
        chart
            .draw_series(std::iter::empty::<EmptyElement<(f64, f64), DB>>())?
            .label(note.as_str())
            .legend(|(x, y)| EmptyElement::at((x, y)));
    }
    legend(&mut chart, l)
}

/// Panel 2: per-execution mean rig power against the time since the train's start, SSE
/// against SSP.
fn sse_ssp<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    a: &Analysis,
    l: &Layout,
) -> Drawn<DB> {
    let iw = l.icon().0;
    let caption = "SSE vs SSP: each execution's mean rig power (energy / duration)";
    if !a.has_rig() {
        return message(
            area,
            caption,
            &[
                "No rig: no execution's energy was measured, so SSE and SSP are not told apart."
                    .into(),
            ],
            l,
        );
    }
    let mut train_start: HashMap<u64, f64> = HashMap::new();
    for e in &a.executions {
        let s = train_start.entry(e.train).or_insert(e.start_s);
        *s = s.min(e.start_s);
    }
    // (ms since the train's start, W, ssp, kept)
    let pts: Vec<(f64, f64, bool, bool)> = a
        .executions
        .iter()
        .map(|e| {
            (
                (e.start_s - train_start[&e.train]) * 1e3,
                e.rig_energy_j / e.duration_s,
                e.ssp,
                e.kept,
            )
        })
        .filter(|p| p.0.is_finite() && p.1.is_finite())
        .collect();
    let settle_ms = a.settle_s * 1e3;
    let mean = |ssp: bool| {
        let of = |kept_only: bool| {
            let w: Vec<f64> = pts
                .iter()
                .filter(|p| p.2 == ssp && (p.3 || !kept_only))
                .map(|p| p.1)
                .collect();
            (w.iter().sum::<f64>() / w.len() as f64, w.len())
        };
        match of(true) {
            (_, 0) => (of(false).0, "all"),
            (m, _) => (m, "kept"),
        }
    };
    let n_ssp = pts.iter().filter(|p| p.2).count();
    let n_sse = pts.len() - n_ssp;
    if n_ssp == 0 {
        let trains = train_start.len();
        let (mean_d, _) = kernel_duration(a);
        let longest = pts.iter().map(|p| p.0).fold(0.0f64, f64::max);
        let mut lines = vec![
            match a.executions.len() {
                1 => "The only execution is SSE: it is its train's first.".to_string(),
                n => format!(
                    "All {n} executions are SSE: none started {settle_ms:.1} ms or more after its train's first."
                ),
            },
            if a.executions.len() == trains {
                "Every train is a single execution (railtrace profile --count 1).".to_string()
            } else {
                format!(
                    "{} of {}; the latest start is {longest:.2} ms into its train.",
                    plural(trains, "train"),
                    plural(a.executions.len(), "execution")
                )
            },
            format!(
                "SSP needs trains longer than the settling time: at {:.0} µs per execution,",
                mean_d * 1e6
            ),
            format!(
                "more than {:.0} executions back to back (railtrace profile --count N).",
                (a.settle_s / mean_d).ceil()
            ),
        ];
        if n_sse > 0 {
            let (m, which) = mean(false);
            lines.push(format!("SSE mean power: {m:.1} W ({which} executions)."));
        }
        return message(area, caption, &lines, l);
    }
    let x1 = pts.iter().map(|p| p.0).fold(settle_ms, f64::max) * 1.03;
    let (lo, hi) = pts
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
            (lo.min(p.1), hi.max(p.1))
        });
    let pad = ((hi - lo) * 0.05).max(1.0);
    let (y0, hi) = (lo - pad, hi + pad);
    let y1 = l.with_legend(y0, hi, 4, plot_height(area, l));
    let axes = Axes {
        x: (0.0, x1),
        y: (y0, y1),
        x_desc: "start, time since the train's first start (ms)",
        y_desc: "mean rig power over the execution (W)",
        labels: (10, 8),
        whole: (false, false),
    };
    let mut chart = chart(area, caption, &axes, l)?;
    let line = MARK.stroke_width(l.px(2));
    chart
        .draw_series(DashedLineSeries::new(
            [(settle_ms, y0), (settle_ms, y1)],
            l.px(8),
            l.px(5),
            line,
        ))?
        .label(match a.settling_tau_s {
            Some(tau) => format!(
                "SSP from {settle_ms:.1} ms = 3 τ, τ = {:.2} ms fitted to the trains",
                tau * 1e3
            ),
            None => format!("SSP from {settle_ms:.1} ms (fixed; no settling fitted)"),
        })
        .legend(move |(x, y)| PathElement::new([(x, y), (x + iw, y)], line));
    let r = l.px(4) as i32;
    let width = l.px(2);
    for (ssp, colour, name) in [(false, SSE, "SSE"), (true, SSP, "SSP")] {
        // Dropped ones first, under the kept.
        chart.draw_series(
            pts.iter()
                .filter(|p| p.2 == ssp && !p.3)
                .map(|p| Circle::new((p.0, p.1), r, colour.stroke_width(width))),
        )?;
        let n = pts.iter().filter(|p| p.2 == ssp).count();
        let (m, which) = mean(ssp);
        chart
            .draw_series(
                pts.iter()
                    .filter(|p| p.2 == ssp && p.3)
                    .map(|p| Circle::new((p.0, p.1), r, colour.mix(0.8).filled())),
            )?
            .label(format!(
                "{name}: {}, mean {m:.1} W ({which})",
                plural(n, "execution")
            ))
            .legend(move |(x, y)| Circle::new((x + iw / 2, y), r, colour.filled()));
    }
    let dropped = pts.iter().filter(|p| !p.3).count();
    chart
        .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
        .label(format!(
            "hollow: dropped by the duration clustering ({dropped})"
        ))
        .legend(move |(x, y)| Circle::new((x + iw / 2, y), r, OTHER.stroke_width(width)));
    legend(&mut chart, l)
}

/// The `q` quantile of sorted `v` (nearest rank).
fn quantile(v: &[f64], q: f64) -> f64 {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Panel 3: the execution times' histogram with the clusters and the fixed-margin bin.
fn histogram<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    a: &Analysis,
    l: &Layout,
) -> Drawn<DB> {
    let (iw, ih) = l.icon();
    let mut d: Vec<f64> = a
        .executions
        .iter()
        .map(|e| e.duration_s * 1e6)
        .filter(|d| d.is_finite())
        .collect();
    d.sort_by(f64::total_cmp);
    if d.is_empty() {
        return message(area, "Execution time", &["No executions.".into()], l);
    }
    // The dominant cluster: the one holding the kept executions (the largest otherwise).
    let kept = a.kept_durations();
    let dominant = a
        .clusters
        .iter()
        .position(|c| kept.first().is_some_and(|&k| k >= c.0 && k <= c.1))
        .or_else(|| (0..a.clusters.len()).max_by_key(|&i| a.clusters[i].2));
    let us = |s: f64| s * 1e6;
    let fm = (us(a.fixed_margin.0), us(a.fixed_margin.1), a.fixed_margin.2);
    // The axis: the bulk of the durations, a far tail left off (and counted).
    let (p1, p99) = (quantile(&d, 0.01), quantile(&d, 0.99));
    let spread = (p99 - p1).max(quantile(&d, 0.5).abs() * 0.01).max(1e-3);
    let mut lo = d[0].max(p1 - 0.5 * spread);
    let mut hi = d[d.len() - 1].min(p99 + 0.5 * spread);
    let mut widen = |a: f64, b: f64| {
        if a.is_finite() && b.is_finite() {
            lo = lo.min(a);
            hi = hi.max(b);
        }
    };
    widen(fm.0, fm.1);
    if let Some(i) = dominant {
        widen(us(a.clusters[i].0), us(a.clusters[i].1));
    }
    if hi <= lo {
        (lo, hi) = (lo - 0.5, hi + 0.5);
    }
    let inside: Vec<f64> = d.iter().copied().filter(|&x| x >= lo && x <= hi).collect();
    let (below, above) = (
        d.iter().filter(|&&x| x < lo).count(),
        d.iter().filter(|&&x| x > hi).count(),
    );
    // Freedman–Diaconis bins over the durations on the axis.
    let iqr = quantile(&inside, 0.75) - quantile(&inside, 0.25);
    let fd = 2.0 * iqr / (inside.len() as f64).cbrt();
    let bins = if fd > 0.0 {
        (((hi - lo) / fd).ceil() as usize).clamp(10, 150)
    } else {
        30
    };
    let width = (hi - lo) / bins as f64;
    let mut counts = vec![0usize; bins];
    for &x in &inside {
        counts[(((x - lo) / width) as usize).min(bins - 1)] += 1;
    }
    let top = counts.iter().copied().max().unwrap_or(1).max(1) as f64;
    let shown = a.clusters.len().min(5);
    let rows = shown + usize::from(a.clusters.len() > shown) + 1 + usize::from(below + above > 0);
    let pad = (hi - lo) * 0.02;
    let (x0, x1) = (lo - pad, hi + pad);
    let y1 = l.with_legend(0.0, top * 1.05, rows, plot_height(area, l));
    let caption = format!(
        "Execution time: {}, {}, bins of {width:.2} µs",
        plural(d.len(), "execution"),
        plural(a.clusters.len(), "duration cluster")
    );
    let axes = Axes {
        x: (x0, x1),
        y: (0.0, y1),
        x_desc: "execution time on the GPU's clock (µs)",
        y_desc: "executions per bin",
        labels: (10, 8),
        whole: (false, true),
    };
    let mut chart = chart(area, &caption, &axes, l)?;
    let clip = |x: f64| x.clamp(x0, x1);
    // The clusters, shaded (the dominant one first in the legend).
    let mut order: Vec<usize> = (0..a.clusters.len()).collect();
    order.sort_by_key(|&i| (Some(i) != dominant, std::cmp::Reverse(a.clusters[i].2)));
    for (rank, &i) in order.iter().enumerate() {
        let (clo, chi, n) = a.clusters[i];
        let shade = if Some(i) == dominant {
            KEPT_SHADE
        } else {
            OTHER_SHADES[i % OTHER_SHADES.len()]
        };
        let anno = chart.draw_series([Rectangle::new(
            [(clip(us(clo)), 0.0), (clip(us(chi)), y1)],
            shade.filled(),
        )])?;
        if rank < shown {
            let what = if Some(i) == dominant {
                "kept cluster"
            } else {
                "cluster"
            };
            anno.label(format!(
                "{what} {:.1}–{:.1} µs: {}",
                us(clo),
                us(chi),
                plural(n, "execution")
            ))
            .legend(move |(x, y)| Rectangle::new([(x, y - ih), (x + iw, y + ih)], shade.filled()));
        }
    }
    if a.clusters.len() > shown {
        let rest: usize = order[shown..].iter().map(|&i| a.clusters[i].2).sum();
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
            .label(format!(
                "{} more: {}",
                plural(a.clusters.len() - shown, "cluster"),
                plural(rest, "execution")
            ))
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - ih), (x + iw, y + ih)], OTHER_SHADES[1].filled())
            });
    }
    // The bars: blue in the kept cluster, grey elsewhere.
    let in_kept =
        |x: f64| dominant.is_some_and(|i| x >= us(a.clusters[i].0) && x <= us(a.clusters[i].1));
    chart.draw_series(
        counts
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(i, &n)| {
                let (a0, a1) = (lo + i as f64 * width, lo + (i + 1) as f64 * width);
                let colour = if in_kept((a0 + a1) / 2.0) {
                    KEPT
                } else {
                    OTHER
                };
                Rectangle::new([(a0, 0.0), (a1, n as f64)], colour.filled())
            }),
    )?;
    // The fixed margin's ends.
    let style = FIXED.stroke_width(l.px(2));
    if fm.0.is_finite() && fm.1.is_finite() {
        for (k, x) in [fm.0, fm.1].into_iter().enumerate() {
            let anno = chart.draw_series(DashedLineSeries::new(
                [(x, 0.0), (x, y1)],
                l.px(8),
                l.px(5),
                style,
            ))?;
            if k == 0 {
                anno.label(format!(
                    "fixed margin ±{:.0} % of the median: {:.1}–{:.1} µs, {}",
                    a.options.margin * 100.0,
                    fm.0,
                    fm.1,
                    plural(fm.2, "execution")
                ))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + iw, y)], style));
            }
        }
    }
    if below + above > 0 {
        let mut words = Vec::new();
        if below > 0 {
            words.push(format!("{below} below, down to {:.1} µs", d[0]));
        }
        if above > 0 {
            words.push(format!("{above} above, up to {:.1} µs", d[d.len() - 1]));
        }
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
            .label(format!("off the axis: {}", words.join("; ")))
            .legend(|(x, y)| EmptyElement::at((x, y)));
    }
    if a.clusters.is_empty() && !(fm.0.is_finite() && fm.1.is_finite()) && below + above == 0 {
        // Nothing labelled: no empty legend box.
        return Ok(());
    }
    legend(&mut chart, l)
}

/// Panel 4: the clock links' residuals, one chart above the other.
fn residuals<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    a: &Analysis,
    l: &Layout,
) -> Drawn<DB> {
    let (top, bottom) = area.split_vertically(area.dim_in_pixel().1 / 2);
    let bottom = bottom.margin(l.px(8), 0, 0, 0);
    let d = &a.device;
    let caption = "Alignment residuals: device (rig) clock → host, per trigger edge";
    if !a.has_rig() {
        message(
            &top,
            caption,
            &["No rig: no trigger edges to align its clock by.".into()],
            l,
        )?;
    } else {
        residual_chart(
            &top,
            caption,
            "trigger edge number",
            &d.residuals_s,
            &|rms| {
                format!(
                    "device→host: {}, RMS {rms} ({} used, {})",
                    plural(d.residuals_s.len(), "edge"),
                    d.used,
                    plural(d.outliers, "outlier")
                )
            },
            d.rms_s,
            DEVICE,
            l,
        )?;
    }
    let g = &a.gpu;
    residual_chart(
        &bottom,
        "Alignment residuals: GPU clock → host, per bracketed clock read",
        "clock read number",
        &g.residuals_s,
        &|rms| {
            format!(
                "GPU→host: {}, RMS {rms} over the fit's {} tightest, {}",
                plural(g.residuals_s.len(), "read"),
                g.used,
                plural(g.outliers, "outlier")
            )
        },
        g.rms_s,
        GPU,
        l,
    )
}

#[allow(clippy::too_many_arguments)]
fn residual_chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    x_desc: &str,
    r: &[f64],
    label: &dyn Fn(&str) -> String,
    rms: f64,
    colour: RGBColor,
    l: &Layout,
) -> Drawn<DB> {
    let iw = l.icon().0;
    let finite: Vec<f64> = r.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return message(area, caption, &["No residuals.".into()], l);
    }
    let mut abs: Vec<f64> = finite.iter().map(|v| v.abs()).collect();
    abs.sort_by(f64::total_cmp);
    let max = abs[abs.len() - 1];
    // µs, or ns when every residual is under a microsecond.
    let (k, unit) = if max < 1e-6 {
        (1e9, "ns")
    } else {
        (1e6, "µs")
    };
    // A few gross outliers would flatten the rest: those past 20 RMS are left off the
    // axis, which stops at the largest of the others, and are marked at its edge.
    let gross = 20.0 * rms;
    let lim = if rms > 0.0 && max > gross {
        abs.iter()
            .copied()
            .filter(|&v| v <= gross)
            .fold(3.0 * rms, f64::max)
    } else {
        max
    };
    let lim = if lim > 0.0 { lim * 1.1 * k } else { 1.0 };
    let beyond = abs.iter().filter(|&&v| v * k > lim).count();
    let rows = 1 + usize::from(beyond > 0);
    let y1 = l.with_legend(-lim, lim, rows, plot_height(area, l));
    let n = r.len() as f64;
    let y_desc = format!("residual ({unit})");
    let axes = Axes {
        x: (-0.5, (n - 0.5).max(0.5)),
        y: (-lim, y1),
        x_desc,
        y_desc: &y_desc,
        labels: (10, 6),
        whole: (true, false),
    };
    let mut chart = chart(area, caption, &axes, l)?;
    chart.draw_series([PathElement::new(
        [(-0.5, 0.0), (n - 0.5, 0.0)],
        MARK.stroke_width(1),
    )])?;
    let rad = l.px(3) as i32;
    chart
        .draw_series(
            r.iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite() && (v.abs() * k) <= lim)
                .map(|(i, v)| Circle::new((i as f64, v * k), rad, colour.mix(0.75).filled())),
        )?
        .label(label(&format!("{:.2} {unit}", rms * k)))
        .legend(move |(x, y)| Circle::new((x + iw / 2, y), rad, colour.filled()));
    if beyond > 0 {
        let t = l.px(7) as i32;
        let marks = r
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite() && (v.abs() * k) > lim)
            .map(|(i, v)| {
                let (y, tip) = if *v > 0.0 { (lim, -t) } else { (-lim, t) };
                EmptyElement::at((i as f64, y))
                    + Polygon::new(vec![(-t / 2, 0), (t / 2, 0), (0, tip)], FIXED.filled())
            });
        chart
            .draw_series(marks)?
            .label(format!(
                "{} beyond ±{lim:.2} {unit}, marked at the edge",
                plural(beyond, "residual")
            ))
            .legend(move |(x, y)| {
                Polygon::new(
                    vec![
                        (x + iw / 2 - t / 2, y + t / 2),
                        (x + iw / 2 + t / 2, y + t / 2),
                        (x + iw / 2, y - t / 2),
                    ],
                    FIXED.filled(),
                )
            });
    }
    legend(&mut chart, l)
}
