//! A recording as a picture: power per rail and in total against time, as SVG or PNG.
//!
//! Samples are decimated to one [`Bin`] (min, max, mean) per pixel column: the plot draws
//! the min/max envelope as a pale band and the mean as a line over it (as a dot per column
//! where the load changes faster than the columns, see `jumpy`), so a one-sample peak
//! still shows and the drawing costs the same however long the recording. A gap row breaks
//! every band and line and is drawn as a grey band; trigger edges are vertical lines (▲
//! rising, ▼ falling); the GPU's own logger readings are a step line with a dot at each.
//!
//! The decimation is [`crate::store::decimate`]'s.

use std::path::Path;

use anyhow::{anyhow, bail};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::store::decimate::{collect, scan, window, Data, Series};
pub use crate::store::decimate::{column, decimate, extent, window_json, Bin, Envelope, Plotted};
use crate::store::recording::{self, Kind, Source};

/// The embedded font (DejaVu Sans, licence in `host/assets`): no system font library needed.
static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// Registers the embedded font as plotters' "sans-serif" (no system font library needed).
pub(crate) fn register_font() -> anyhow::Result<()> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| anyhow!("the embedded font does not load"))
}

/// Draws a picture into `out`, SVG or PNG by its extension: `$draw` is an expression of
/// the drawing area `$root` (generic drawing code is instantiated once per backend)
/// returning plotters' `Result`; errors name the file. It is drawn whole or not at all
/// ([`crate::store::through_partial`]).
macro_rules! draw_to {
    ($out:expr, $size:expr, |$root:ident| $draw:expr) => {{
        use plotters::prelude::IntoDrawingArea;
        let out: &std::path::Path = $out;
        let format = $crate::store::plot::Format::of(out)?;
        $crate::store::plot::register_font()?;
        $crate::store::through_partial(out, |partial| match format {
            $crate::store::plot::Format::Svg => {
                let $root = plotters::prelude::SVGBackend::new(partial, $size).into_drawing_area();
                $draw.map_err(|e| anyhow::anyhow!("{e}"))
            }
            $crate::store::plot::Format::Png => {
                let $root =
                    plotters::prelude::BitMapBackend::new(partial, $size).into_drawing_area();
                $draw.map_err(|e| anyhow::anyhow!("{e}"))
            }
        })
        .map_err(|e: anyhow::Error| anyhow::anyhow!("{}: {e}", out.display()))?
    }};
}
pub(crate) use draw_to;

/// Space around the chart, px at 1600 × 900 (see [`Layout`]).
const MARGIN: u32 = 20;
/// Width of the y axis' labels and description.
const Y_LABELS: u32 = 100;
/// Height of the x axis' labels and description.
const X_LABELS: u32 = 70;
/// Height of the title and caption.
const TITLES: u32 = 80;

/// Rail colours (Tableau 10, without the purple and grey kept for the logger and gaps).
const RAIL_COLOURS: [RGBColor; 8] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xe1, 0x57, 0x59),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0x9c, 0x75, 0x5f),
];
const TOTAL_COLOUR: RGBColor = RGBColor(0x20, 0x20, 0x20);
const LOGGER_COLOUR: RGBColor = RGBColor(0x8e, 0x3b, 0xa0);
/// An overlay (the logger deconvolved): dark teal, dashed, over everything else.
const OVERLAY_COLOUR: RGBColor = RGBColor(0x00, 0x6d, 0x77);
const GAP_COLOUR: RGBColor = RGBColor(0x90, 0x90, 0x90);
const EDGE_COLOURS: [RGBColor; 4] = [
    RGBColor(0x1f, 0x3a, 0x93),
    RGBColor(0xc0, 0x1c, 0x7a),
    RGBColor(0x00, 0x80, 0x60),
    RGBColor(0xa0, 0x50, 0x00),
];

/// The picture's format, from the output's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `.svg`
    Svg,
    /// `.png`
    Png,
}

impl Format {
    /// The format for `path`, or a one-line error naming the extension.
    pub fn of(path: &Path) -> anyhow::Result<Format> {
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase());
        match ext.as_deref() {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            Some(e) => bail!(
                "{}: cannot plot to a .{e} file; the output must end in .svg or .png",
                path.display()
            ),
            None => bail!(
                "{}: no extension; the output must end in .svg or .png",
                path.display()
            ),
        }
    }
}

/// What to plot and how big.
#[derive(Debug, Clone)]
pub struct Options {
    /// Start of the window, s (`time_s`); the first sample's time when `None`.
    pub from: Option<f64>,
    /// End of the window, s; the last sample's time when `None`.
    pub to: Option<f64>,
    /// Picture width, px.
    pub width: u32,
    /// Picture height, px.
    pub height: u32,
    /// The first line of the title; the file's name when empty.
    pub title: String,
    /// A series drawn over the recording as steps (a logger's readings deconvolved).
    pub overlay: Option<Overlay>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            from: None,
            to: None,
            width: 1600,
            height: 900,
            title: String::new(),
            overlay: None,
        }
    }
}

/// A series drawn over a recording: each value held from its time to the next.
#[derive(Debug, Clone, PartialEq)]
pub struct Overlay {
    /// Its name in the legend.
    pub label: String,
    /// (s on the recording's timeline, W), in time order.
    pub steps: Vec<(f64, f64)>,
}

/// Sizes for a picture: those of 1600 × 900 px, scaled to the picture's size.
#[derive(Debug, Clone, Copy)]
struct Layout {
    scale: f64,
    width: u32,
    height: u32,
}

impl Layout {
    fn new(width: u32, height: u32) -> Layout {
        let scale = (f64::from(width) / 1600.0).min(f64::from(height) / 900.0);
        Layout {
            scale: scale.clamp(0.6, 4.0),
            width,
            height,
        }
    }

    /// `n` px at 1600 × 900, scaled; at least 1.
    fn px(&self, n: u32) -> u32 {
        ((f64::from(n) * self.scale).round() as u32).max(1)
    }

    /// A font size, scaled and even: plotters' ab_glyph text sets the glyphs of odd
    /// sizes a pixel off the baseline.
    fn font(&self, n: u32) -> u32 {
        (self.px(n) / 2 * 2).max(10)
    }

    /// The plotting area's width: one envelope column per pixel.
    fn columns(&self) -> usize {
        self.width
            .saturating_sub(2 * self.px(MARGIN) + self.px(Y_LABELS))
            .max(1) as usize
    }

    /// The plotting area's height (about: the titles' height is estimated).
    fn plot_height(&self) -> u32 {
        self.height
            .saturating_sub(2 * self.px(MARGIN) + self.px(X_LABELS) + self.px(TITLES))
            .max(1)
    }
}

/// The output's format, or why `out` and `opts` cannot make a plot of any recording (a
/// caller can check before reading a large one).
pub fn check(out: &Path, opts: &Options) -> anyhow::Result<Format> {
    let format = Format::of(out)?;
    let (w, h) = (opts.width, opts.height);
    if !(640..=16_384).contains(&w) || !(360..=16_384).contains(&h) {
        bail!("{w}×{h} px: the picture must be 640 to 16384 px wide and 360 to 16384 px high");
    }
    for (name, t) in [("--from", opts.from), ("--to", opts.to)] {
        if t.is_some_and(|t| !t.is_finite()) {
            bail!("{name} {}: not a time in seconds", t.unwrap_or_default());
        }
    }
    if let (Some(from), Some(to)) = (opts.from, opts.to) {
        if from >= to {
            bail!("--from {from} s is not before --to {to} s");
        }
    }
    Ok(format)
}

/// Plots `rec` into `out` (`.svg` or `.png`, see [`Format::of`]).
///
/// The recording is read a record batch at a time, so a file opened with
/// [`crate::store::recording::open`] is plotted in bounded memory however long it is: twice
/// when the window is not given (`from` and `to`), first only its times to find the
/// window, then to decimate into it; once when it is.
pub fn render(rec: &impl Source, out: &Path, opts: &Options) -> anyhow::Result<Plotted> {
    check(out, opts)?;
    let layout = Layout::new(opts.width, opts.height);
    let (data, plotted) = match (opts.from, opts.to) {
        // The window is the one asked for: one pass decimates and counts the samples.
        (Some(t0), Some(t1)) => {
            let (data, plotted, span) = collect(rec, t0, t1, layout.columns())?;
            let (_, _, samples) = window(rec.path(), (opts.from, opts.to), &span)?;
            (data, Plotted { samples, ..plotted })
        }
        _ => {
            let asked = (opts.from, opts.to);
            let (t0, t1, samples) = window(rec.path(), asked, &scan(rec, asked)?)?;
            let (data, plotted, _) = collect(rec, t0, t1, layout.columns())?;
            (data, Plotted { samples, ..plotted })
        }
    };
    let data = Data {
        overlay: opts.overlay.as_ref().map(|o| {
            let first = o
                .steps
                .partition_point(|s| s.0 <= plotted.from)
                .saturating_sub(1);
            let end = o.steps.partition_point(|s| s.0 <= plotted.to);
            let inside = o.steps[first..end.max(first)].iter();
            let steps = inside.map(|&(t, w)| (t.max(plotted.from), w)).collect();
            (o.label.clone(), steps)
        }),
        ..data
    };
    let mut title = opts.title.clone();
    if title.is_empty() {
        title = rec
            .path()
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
    }
    let size = (opts.width, opts.height);
    draw_to!(out, size, |root| draw(
        root, &data, &title, &plotted, &layout
    ));
    Ok(plotted)
}

/// Plots a recording from its overview ([`recording::overview`]) where its summaries are
/// fine enough for the window (at least two per pixel column: each column's band is then
/// the least and most of whole summaries, as from the samples, and the mean line their
/// mean); `None` where they are not, and the samples are to be read.
pub fn render_overview(
    ov: &recording::Overview,
    out: &Path,
    opts: &Options,
) -> anyhow::Result<Option<Plotted>> {
    check(out, opts)?;
    let (from, to) = (opts.from.unwrap_or(f64::MIN), opts.to.unwrap_or(f64::MAX));
    let columns = Layout::new(opts.width, opts.height).columns();
    if !summaries_suffice(ov, from, to, columns) {
        return Ok(None);
    }
    render(&ov.recording, out, opts).map(Some)
}

/// Whether an overview level holds at least two summaries a column in `[from, to]`.
fn summaries_suffice(ov: &recording::Overview, from: f64, to: f64, columns: usize) -> bool {
    let mut summaries = 0usize;
    for rows in ov.recording.rows() {
        let time = rows.f64("time_s");
        summaries += (0..rows.len())
            .filter(|&i| rows.kind(i) == Kind::Summary && (from..=to).contains(&time.value(i)))
            .count();
    }
    summaries >= 2 * columns
}

/// A series' colour: its rail's, or the total's.
fn colour(s: &Series) -> RGBColor {
    s.rail
        .map_or(TOTAL_COLOUR, |i| RAIL_COLOURS[i % RAIL_COLOURS.len()])
}

/// Draws the plot.
fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    d: &Data,
    title: &str,
    p: &Plotted,
    l: &Layout,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let columns = l.columns();
    let (t0, t1) = (p.from, p.to);
    // Seconds, or milliseconds for a short window.
    let (k, unit) = if t1 - t0 < 0.1 {
        (1e3, "ms")
    } else {
        (1.0, "s")
    };
    let x = |c: usize| (t0 + (c as f64 + 0.5) / columns as f64 * (t1 - t0)) * k;
    let bins = d.series.iter().flat_map(|s| s.runs.iter().flatten());
    let (mut lo, mut hi) = bins.fold((0.0f64, f64::NEG_INFINITY), |(lo, hi), (_, b)| {
        (lo.min(f64::from(b.min)), hi.max(f64::from(b.max)))
    });
    let overlay = d.overlay.iter().flat_map(|o| &o.1);
    for &(_, w) in d.logger.iter().chain(overlay) {
        (lo, hi) = (lo.min(w), hi.max(w));
    }
    if hi <= lo {
        hi = lo + 1.0;
    }
    // Headroom above the highest peak for the legend: its rows, 24 px each, and its
    // border, over the plotting area's height.
    let legend = d.series.len()
        + d.edges.len()
        + usize::from(!d.logger.is_empty())
        + usize::from(d.overlay.is_some())
        + usize::from(!d.gaps.is_empty());
    let legend_px = f64::from(l.px(legend as u32 * 24 + 30));
    let plot_px = f64::from(l.plot_height());
    let (y0, y1) = (
        lo,
        hi + (hi - lo) * legend_px / (plot_px - legend_px).max(plot_px / 3.0),
    );
    // Enough decimals to tell the labels (about 12 on x, 10 on y) apart.
    let decimals = |step: f64| (-step.log10().floor()).clamp(0.0, 9.0) as usize;
    let (x_dec, y_dec) = (decimals((t1 - t0) * k / 12.0), decimals((y1 - y0) / 10.0));

    let m = l.px(MARGIN);
    let root = root.margin(m, m, m, m);
    // The largest even size up to `size` (see `Layout::font`) at which `text` fits.
    let fit = |text: &str, mut size: u32| {
        let width = root.dim_in_pixel().0;
        while size > 8
            && root
                .estimate_text_size(text, &("sans-serif", size).into_text_style(&root))?
                .0
                > width
        {
            size -= 2;
        }
        Ok(size)
    };
    let root = root.titled(title, ("sans-serif", fit(title, l.font(26))?))?;
    let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let mut subtitle = if p.summaries {
        format!(
            "{} from {t0:.6} s to {t1:.6} s; {}; from the recording's summaries (zoom in for trigger edges and logger readings)",
            count(p.samples as usize, "sample"),
            count(p.gaps, "gap"),
        )
    } else {
        format!(
            "{} from {t0:.6} s to {t1:.6} s; {}, {}",
            count(p.samples as usize, "sample"),
            count(p.gaps, "gap"),
            count(p.edges, "trigger edge"),
        )
    };
    if p.logger > 0 {
        subtitle += &format!(", {}", count(p.logger, "GPU logger reading"));
    }
    subtitle += ". Band: min–max per pixel column; line (dots where it jumps): mean";
    let mut chart = ChartBuilder::on(&root)
        .caption(&subtitle, ("sans-serif", fit(&subtitle, l.font(18))?))
        .x_label_area_size(l.px(X_LABELS))
        .y_label_area_size(l.px(Y_LABELS))
        .build_cartesian_2d(t0 * k..t1 * k, y0..y1)?;
    chart
        .configure_mesh()
        .x_desc(format!("time ({unit})"))
        .y_desc("power (W)")
        .axis_desc_style(("sans-serif", l.font(22)))
        .label_style(("sans-serif", l.font(18)))
        .x_labels(12)
        .y_labels(10)
        .x_label_formatter(&|v| format!("{v:.x_dec$}"))
        .y_label_formatter(&|v| format!("{v:.y_dec$}"))
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .bold_line_style(RGBColor(0xd0, 0xd0, 0xd0))
        .draw()?;

    // Gaps: at least a pixel wide, so that a short one still shows.
    let min_w = (t1 - t0) / columns as f64;
    chart.draw_series(d.gaps.iter().map(|&(a, b)| {
        let b = b.max(a + min_w);
        Rectangle::new([(a * k, y0), (b * k, y1)], GAP_COLOUR.mix(0.35).filled())
    }))?;

    // The min/max bands, opaque and pale (the total's first, under the rails'): a path up
    // and down each pixel column, along the top or bottom to the next. (A filled polygon
    // of the outline leaves holes in plotters' bitmap rasteriser.)
    for s in d.series.iter().rev() {
        let pale = |c: u8| (f64::from(c) * 0.3 + 255.0 * 0.7) as u8;
        let style =
            RGBColor(pale(colour(s).0), pale(colour(s).1), pale(colour(s).2)).stroke_width(l.px(1));
        chart.draw_series(s.runs.iter().map(|run| {
            let path = run.iter().enumerate().flat_map(|(i, (c, b))| {
                let (lo, hi) = ((x(*c), f64::from(b.min)), (x(*c), f64::from(b.max)));
                if i % 2 == 0 {
                    [lo, hi]
                } else {
                    [hi, lo]
                }
            });
            PathElement::new(path.collect::<Vec<_>>(), style)
        }))?;
    }
    let px_per_w = plot_px / (y1 - y0);
    // Thin lines where each pixel column holds several samples, thicker where few.
    let line_px = l.px(if p.samples > 2 * columns as u64 { 1 } else { 2 });
    for s in &d.series {
        let (n, sum, max) = s
            .runs
            .iter()
            .flatten()
            .fold((0, 0.0, f32::MIN), |(n, sum, max), (_, b)| {
                (n + b.n, sum + b.sum, max.max(b.max))
            });
        let label = format!("{}  mean {:.2} W, max {:.2} W", s.name, sum / n as f64, max);
        let style = colour(s).stroke_width(line_px);
        for (i, run) in s.runs.iter().enumerate() {
            let anno = if jumpy(run, px_per_w) {
                let mark = colour(s).filled();
                chart.draw_series(run.iter().map(|(c, b)| {
                    EmptyElement::at((x(*c), b.mean())) + Rectangle::new([(-1, -1), (1, 1)], mark)
                }))?
            } else {
                let line = LineSeries::new(run.iter().map(|(c, b)| (x(*c), b.mean())), style);
                chart.draw_series(line)?
            };
            if i == 0 {
                let c = colour(s);
                anno.label(label.clone()).legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 24, y)], c.stroke_width(3))
                });
            }
        }
    }

    if !d.logger.is_empty() {
        let style = LOGGER_COLOUR.stroke_width(l.px(2));
        let steps = d
            .logger
            .windows(2)
            .flat_map(|w| [(w[0].0 * k, w[0].1), (w[1].0 * k, w[0].1)]);
        let last = d.logger.last().map(|&(t, w)| (t * k, w));
        chart.draw_series(LineSeries::new(steps.chain(last), style))?;
        chart
            .draw_series(
                d.logger
                    .iter()
                    .map(|&(t, w)| Circle::new((t * k, w), 3, LOGGER_COLOUR.filled())),
            )?
            .label("GPU logger")
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new([(0, 0), (24, 0)], style)
                    + Circle::new((12, 0), 3, LOGGER_COLOUR.filled())
            });
    }

    if let Some((label, steps)) = &d.overlay {
        let style = OVERLAY_COLOUR.stroke_width(l.px(3));
        let held = steps
            .windows(2)
            .flat_map(|w| [(w[0].0 * k, w[0].1), (w[1].0 * k, w[0].1)]);
        let last = steps.last().map(|&(t, w)| (t * k, w));
        let dash = (l.px(9), l.px(4));
        chart
            .draw_series(DashedLineSeries::new(
                held.chain(last),
                dash.0,
                dash.1,
                style,
            ))?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], style));
    }

    for (i, (line, e)) in d.edges.iter().enumerate() {
        let c = EDGE_COLOURS[i % EDGE_COLOURS.len()];
        let dir = if line & 0x80 != 0 { "output" } else { "input" };
        let label = if e.label.is_empty() {
            String::new()
        } else {
            format!(" {}", e.label)
        };
        chart.draw_series(
            e.marks
                .iter()
                .map(|&(col, _)| PathElement::new([(x(col), y0), (x(col), y1)], c.mix(0.6))),
        )?;
        chart
            .draw_series(
                e.marks
                    .iter()
                    .map(|&(col, rising)| EmptyElement::at((x(col), y1)) + edge_marker(rising, c)),
            )?
            .label(format!(
                "edge line {} ({dir}){label}: ▲ rising ▼ falling",
                line & 0x7f
            ))
            .legend(move |(x, y)| EmptyElement::at((x + 12, y - 7)) + edge_marker(true, c));
    }

    if !d.gaps.is_empty() {
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
            .label("gap (no samples)")
            .legend(|(x, y)| {
                Rectangle::new([(x, y - 7), (x + 24, y + 7)], GAP_COLOUR.mix(0.35).filled())
            });
    }

    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", l.font(18)))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(0xa0, 0xa0, 0xa0))
        .draw()?;
    root.present()
}

/// True when the mean of most columns is more than 4 px from the last column's: a load
/// that changes faster than the pixel columns, whose mean drawn as a line would be
/// vertical strokes filling the band. Such a run is drawn as one mark per column.
fn jumpy(run: &[(usize, Bin)], px_per_w: f64) -> bool {
    let big = run
        .windows(2)
        .filter(|w| ((w[1].1.mean() - w[0].1.mean()) * px_per_w).abs() > 4.0)
        .count();
    big > run.len() / 2
}

/// The marker of an edge, just under the top of the plot: ▲ rising, ▼ falling.
fn edge_marker(rising: bool, c: RGBColor) -> Polygon<(i32, i32)> {
    let pts = if rising {
        vec![(-6, 12), (6, 12), (0, 2)]
    } else {
        vec![(-6, 2), (6, 2), (0, 12)]
    };
    Polygon::new(pts, c.filled())
}
