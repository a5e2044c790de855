//! A recording decimated to pixel columns: per rail and in total one [`Bin`] (min, max,
//! mean) per column, broken at gaps, with the gaps, trigger edges and logger readings in
//! the window; from its samples or from its overview's summaries. What a plot draws
//! ([`crate::store::plot`]) and what the live view's page draws ([`window_json`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::bail;
use arrow_array::Array;

use crate::store::recording::{self, Kind, Rows, Source};

/// What a plot shows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plotted {
    /// The window, s.
    pub from: f64,
    /// The window's end, s.
    pub to: f64,
    /// Sample rows in the window.
    pub samples: u64,
    /// Gaps that overlap it.
    pub gaps: usize,
    /// Trigger edges in it.
    pub edges: usize,
    /// GPU logger readings in it.
    pub logger: usize,
    /// Drawn from the recording's summaries (its overview), which hold no trigger edges
    /// nor logger readings: those are drawn when zoomed in.
    pub summaries: bool,
}

/// Min, max and sum of the values that fall in one pixel column.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bin {
    /// The smallest value.
    pub min: f32,
    /// The largest value.
    pub max: f32,
    /// Their sum.
    pub sum: f64,
    /// How many.
    pub n: u64,
}

impl Bin {
    /// No value yet.
    pub const EMPTY: Bin = Bin {
        min: f32::INFINITY,
        max: f32::NEG_INFINITY,
        sum: 0.0,
        n: 0,
    };

    /// Adds a value; one not finite is left out.
    pub fn add(&mut self, v: f32) {
        if v.is_finite() {
            self.min = self.min.min(v);
            self.max = self.max.max(v);
            self.sum += f64::from(v);
            self.n += 1;
        }
    }

    /// The mean value.
    pub fn mean(&self) -> f64 {
        self.sum / self.n as f64
    }
}

/// Which of `columns` equal columns spanning `[t0, t1]` holds time `t` (the last column
/// includes `t1`); `None` outside.
pub fn column(t: f64, t0: f64, t1: f64, columns: usize) -> Option<usize> {
    if columns == 0 || !(t >= t0 && t <= t1) {
        return None;
    }
    let c = ((t - t0) / (t1 - t0) * columns as f64) as usize;
    Some(c.min(columns - 1))
}

/// Per-column bins filled one value at a time; [`Envelope::take`] ends a run (at a gap).
#[derive(Debug, Clone)]
pub struct Envelope {
    t0: f64,
    t1: f64,
    bins: Vec<Option<Bin>>,
    touched: Option<(usize, usize)>,
}

impl Envelope {
    /// An empty envelope of `columns` columns over `[t0, t1]`.
    pub fn new(t0: f64, t1: f64, columns: usize) -> Envelope {
        Envelope {
            t0,
            t1,
            bins: vec![None; columns],
            touched: None,
        }
    }

    /// Adds a value; one outside the window, or not finite, is left out.
    pub fn push(&mut self, t: f64, v: f32) {
        let Some(c) = column(t, self.t0, self.t1, self.bins.len()) else {
            return;
        };
        if !v.is_finite() {
            return;
        }
        self.bins[c].get_or_insert(Bin::EMPTY).add(v);
        self.touched = Some(self.touched.map_or((c, c), |(a, b)| (a.min(c), b.max(c))));
    }

    /// Column `c`'s bin so far (empty where it has none), to add to and give back
    /// ([`Envelope::set`]).
    pub fn bin(&self, c: usize) -> Bin {
        self.bins[c].unwrap_or(Bin::EMPTY)
    }

    /// Makes `bin` column `c`'s (left as it is where `bin` holds no value).
    pub fn set(&mut self, c: usize, bin: Bin) {
        if bin.n == 0 {
            return;
        }
        self.bins[c] = Some(bin);
        self.touched = Some(self.touched.map_or((c, c), |(a, b)| (a.min(c), b.max(c))));
    }

    /// Adds a bin of values gathered elsewhere (a summary row of the recording) at `t`.
    pub fn push_bin(&mut self, t: f64, bin: Bin) {
        let Some(c) = column(t, self.t0, self.t1, self.bins.len()) else {
            return;
        };
        if bin.n == 0 || !(bin.min.is_finite() && bin.max.is_finite() && bin.sum.is_finite()) {
            return;
        }
        match &mut self.bins[c] {
            Some(b) => {
                b.min = b.min.min(bin.min);
                b.max = b.max.max(bin.max);
                b.sum += bin.sum;
                b.n += bin.n;
            }
            empty => *empty = Some(bin),
        }
        self.touched = Some(self.touched.map_or((c, c), |(a, b)| (a.min(c), b.max(c))));
    }

    /// The filled columns, in order, leaving the envelope empty for the next run.
    pub fn take(&mut self) -> Vec<(usize, Bin)> {
        let Some((a, b)) = self.touched.take() else {
            return Vec::new();
        };
        self.bins[a..=b]
            .iter_mut()
            .enumerate()
            .filter_map(|(i, bin)| bin.take().map(|bin| (a + i, bin)))
            .collect()
    }
}

/// `columns` bins of the values `v` at times `t` over `[t0, t1]`: the envelope the plot
/// draws (values outside the window or not finite are left out).
pub fn decimate(t: &[f64], v: &[f32], t0: f64, t1: f64, columns: usize) -> Vec<Option<Bin>> {
    let mut e = Envelope::new(t0, t1, columns);
    for (&t, &v) in t.iter().zip(v) {
        e.push(t, v);
    }
    e.bins
}

/// One line of the plot: its runs between gaps.
#[derive(Debug)]
pub(crate) struct Series {
    pub name: String,
    /// Its place among the recording's rails; `None` for the total.
    pub rail: Option<usize>,
    pub runs: Vec<Vec<(usize, Bin)>>,
}

#[derive(Debug)]
pub(crate) struct EdgeLine {
    pub label: String,
    /// (column, rising) of each edge, one per pixel column and direction.
    pub marks: BTreeSet<(usize, bool)>,
}

/// Everything drawn, decimated.
#[derive(Debug)]
pub(crate) struct Data {
    pub series: Vec<Series>,
    pub gaps: Vec<(f64, f64)>,
    pub edges: BTreeMap<u8, EdgeLine>,
    pub logger: Vec<(f64, f64)>,
    /// The overlay's label and its steps in the window (the one in effect at its start
    /// first): a plot's, set by it.
    #[cfg_attr(not(feature = "plots"), allow(dead_code))]
    pub overlay: Option<(String, Vec<(f64, f64)>)>,
}

/// The span of `rec`'s samples, s (or why it has none to show).
pub fn extent(rec: &impl Source) -> anyhow::Result<(f64, f64)> {
    let (t0, t1, _) = window(rec.path(), (None, None), &scan(rec, (None, None))?)?;
    Ok((t0, t1))
}

/// The recording at `path` in `[t0, t1]` decimated to `columns` columns, as JSON for a
/// page to draw: each series' runs between gaps as `[t, min, max, mean]` per column, the
/// gaps `[start, end]`, the trigger edges `[t, line, rising]` and the logger's readings
/// `[t, W]`. Through `browse` where the recording was closed: from its summaries where
/// they are fine enough (at least two a column; they hold no edges nor logger readings,
/// and `summaries` says so), else from the record batches that hold the window (found,
/// not scanned for); else from the whole file's samples, read a batch at a time.
pub fn window_json(
    path: &Path,
    browse: Option<&recording::Browse>,
    t0: f64,
    t1: f64,
    columns: usize,
) -> anyhow::Result<serde_json::Value> {
    match browse {
        // Two summaries a column at least (a column's least and most then come from
        // samples at most a quarter column outside it); below that, the samples, which
        // hold the trigger edges and the logger's readings too.
        Some(b) => match b.summaries(t0, t1, 2 * columns)? {
            Some(level) => window_of(&level, t0, t1, columns),
            None => window_of(&b.samples(t0, t1)?, t0, t1, columns),
        },
        None => window_of(&recording::open(path)?, t0, t1, columns),
    }
}

/// [`window_json`] of the rows `rec` gives.
pub(crate) fn window_of(
    rec: &impl Source,
    t0: f64,
    t1: f64,
    columns: usize,
) -> anyhow::Result<serde_json::Value> {
    let (d, plotted, _) = collect(rec, t0, t1, columns)?;
    let at = |c: usize| t0 + (c as f64 + 0.5) * (t1 - t0) / columns as f64;
    let r = |v: f64| (v * 1e3).round() / 1e3;
    let series: Vec<serde_json::Value> = (d.series.iter())
        .map(|s| {
            let runs: Vec<Vec<[f64; 4]>> = (s.runs.iter())
                .map(|run| {
                    (run.iter())
                        .map(|(c, b)| [at(*c), r(b.min.into()), r(b.max.into()), r(b.mean())])
                        .collect()
                })
                .collect();
            serde_json::json!({"name": s.name, "runs": runs})
        })
        .collect();
    let edges: Vec<(f64, u8, bool)> = (d.edges.iter())
        .flat_map(|(line, e)| {
            e.marks
                .iter()
                .map(move |&(c, rising)| (at(c), *line, rising))
        })
        .collect();
    Ok(serde_json::json!({
        "t0": t0,
        "t1": t1,
        "columns": columns,
        "summaries": plotted.summaries,
        "series": series,
        "gaps": d.gaps,
        "edges": edges,
        "logger": d.logger,
    }))
}

/// The times of the sample rows: the first, the last, and how many are in a window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    first: f64,
    last: f64,
    inside: u64,
}

impl Span {
    fn new() -> Span {
        Span {
            first: f64::INFINITY,
            last: f64::NEG_INFINITY,
            inside: 0,
        }
    }

    /// Adds a sample at `t`, counted if it is in `[from, to]`.
    fn add(&mut self, t: f64, from: f64, to: f64) {
        self.first = self.first.min(t);
        self.last = self.last.max(t);
        self.inside += u64::from(t >= from && t <= to);
    }

    /// Adds the samples of summary row `i`, counted if its middle is in `[from, to]`.
    fn add_summary(&mut self, rows: &Rows<'_>, i: usize, from: f64, to: f64) {
        let t = rows.f64("time_s").value(i);
        let d = Rows::get(rows.f64("duration_s"), i).unwrap_or(0.0);
        let n = Rows::get(rows.u64("count"), i).unwrap_or(0);
        self.first = self.first.min(t);
        self.last = self.last.max(t + d);
        if (from..=to).contains(&(t + d / 2.0)) {
            self.inside += n;
        }
    }
}

/// The span of the samples, the window being `(from, to)` (open where not given): a pass over
/// the `kind` and `time_s` columns only.
pub(crate) fn scan(
    rec: &impl Source,
    (from, to): (Option<f64>, Option<f64>),
) -> anyhow::Result<Span> {
    let (from, to) = (from.unwrap_or(f64::MIN), to.unwrap_or(f64::MAX));
    let mut span = Span::new();
    for batch in rec.batches(Some(&["time_s", "duration_s", "count"]))? {
        let batch = batch?;
        let rows = Rows::new(&batch);
        let time = rows.f64("time_s");
        for i in 0..rows.len() {
            match rows.kind(i) {
                Kind::Sample => span.add(time.value(i), from, to),
                Kind::Summary => span.add_summary(&rows, i, from, to),
                _ => {}
            }
        }
    }
    Ok(span)
}

/// The window to plot and the samples in it, or why there is none, from the span of the
/// samples in the window asked for, `(from, to)`.
pub(crate) fn window(
    path: &Path,
    asked: (Option<f64>, Option<f64>),
    span: &Span,
) -> anyhow::Result<(f64, f64, u64)> {
    let (from, to) = (asked.0.unwrap_or(f64::MIN), asked.1.unwrap_or(f64::MAX));
    let Span {
        first,
        last,
        inside,
    } = *span;
    let path = path.display();
    if first > last {
        bail!("{path}: the recording holds no samples to plot");
    }
    if from > last {
        bail!("{path}: --from {from} s is after the last sample, at {last:.6} s");
    }
    if to < first {
        bail!("{path}: --to {to} s is before the first sample, at {first:.6} s");
    }
    if inside == 0 {
        bail!("{path}: no samples between {from} s and {to} s (a gap?); the samples span {first:.6} s to {last:.6} s");
    }
    // A recording that starts within 1 % of time_s = 0: from 0, for a round first label.
    let first = if (0.0..0.01 * last).contains(&first) {
        0.0
    } else {
        first
    };
    let (t0, t1) = (asked.0.unwrap_or(first), asked.1.unwrap_or(last));
    // A single sample: a millisecond around it.
    Ok(if t1 > t0 {
        (t0, t1, inside)
    } else {
        (t0 - 5e-4, t1 + 5e-4, inside)
    })
}

/// Decimates the samples (one envelope per rail and the total, broken at gap rows) and
/// gathers the gaps, edges and logger readings in the window; and the span of the samples
/// with `[t0, t1]` as the window.
pub(crate) fn collect(
    rec: &impl Source,
    t0: f64,
    t1: f64,
    columns: usize,
) -> anyhow::Result<(Data, Plotted, Span)> {
    let mut names: Vec<String> = rec.meta().rails.clone();
    names.push("total".into());
    let watts: Vec<String> = rec
        .meta()
        .rails
        .iter()
        .map(|r| format!("{r}_w"))
        .chain(["total_w".to_string()])
        .collect();
    // An overview's summaries also have each series' least and most.
    let extremes: Vec<[String; 2]> = watts
        .iter()
        .map(|w| [format!("{w}_min"), format!("{w}_max")])
        .filter(|[lo, _]| rec.schema().index_of(lo).is_ok())
        .collect();
    let wanted: Vec<&str> = [
        "time_s",
        "duration_s",
        "count",
        "line",
        "rising",
        "text",
        "logger_w",
    ]
    .into_iter()
    .chain(watts.iter().map(String::as_str))
    .chain(extremes.iter().flatten().map(String::as_str))
    // A reader that gives out block rows as they are (a browsed window's) needs these.
    .chain(["codes", "tick", "period_ticks"])
    .collect();
    let derive = rec.meta().derive.as_ref();
    let mut span = Span::new();
    let mut env: Vec<Envelope> = names
        .iter()
        .map(|_| Envelope::new(t0, t1, columns))
        .collect();
    let mut runs: Vec<Vec<Vec<(usize, Bin)>>> = names.iter().map(|_| Vec::new()).collect();
    let end_runs = |env: &mut [Envelope], runs: &mut [Vec<Vec<(usize, Bin)>>]| {
        for (e, r) in env.iter_mut().zip(runs) {
            let run = e.take();
            if !run.is_empty() {
                r.push(run);
            }
        }
    };
    let mut gaps = Vec::new();
    let mut edges: BTreeMap<u8, EdgeLine> = BTreeMap::new();
    let mut logger = Vec::new();
    let mut n_edges = 0;
    let mut last_summary: Option<(f64, f64)> = None;
    let mut drew_summaries = false;
    for batch in rec.batches(Some(&wanted))? {
        let batch = batch?;
        let rows = Rows::new(&batch);
        let time = rows.f64("time_s");
        let cols: Vec<_> = watts.iter().map(|w| rows.f32(w)).collect();
        let ext: Vec<_> = extremes
            .iter()
            .map(|[lo, hi]| (rows.f32(lo), rows.f32(hi)))
            .collect();
        for i in 0..rows.len() {
            let t = time.value(i);
            if let Some(d) = derive.filter(|_| rows.is_block(i)) {
                let step = Rows::get(rows.column::<arrow_array::UInt32Array>("period_ticks"), i)
                    .map_or(0.0, |p| f64::from(p) / d.tick_hz);
                // Each sample as its sample row would be given out (see `Rows::block_watts`),
                // added to its column's bins as `Envelope::push` adds it, those bins held
                // here while the samples stay in one column.
                let mut open: Option<(usize, Vec<Bin>)> = None;
                let close = |env: &mut [Envelope], open: Option<(usize, Vec<Bin>)>| {
                    if let Some((c, bins)) = open {
                        for (e, b) in env.iter_mut().zip(bins) {
                            e.set(c, b);
                        }
                    }
                };
                rows.block_watts(i, d, |k, w| {
                    let t = t + k as f64 * step;
                    span.add(t, t0, t1);
                    let Some(c) = column(t, t0, t1, columns) else {
                        return;
                    };
                    if open.as_ref().map(|o| o.0) != Some(c) {
                        close(&mut env, open.take());
                        open = Some((c, env.iter().map(|e| e.bin(c)).collect()));
                    }
                    if let Some((_, bins)) = &mut open {
                        for (b, &v) in bins.iter_mut().zip(w) {
                            b.add(v);
                        }
                    }
                });
                close(&mut env, open);
                continue;
            }
            match rows.kind(i) {
                Kind::Sample => {
                    span.add(t, t0, t1);
                    for (e, c) in env.iter_mut().zip(&cols) {
                        if let Some(v) = Rows::get(c, i) {
                            e.push(t, v);
                        }
                    }
                }
                Kind::Summary if ext.len() == cols.len() => {
                    span.add_summary(&rows, i, t0, t1);
                    drew_summaries = true;
                    let d = Rows::get(rows.f64("duration_s"), i).unwrap_or(0.0);
                    let mid = t + d / 2.0;
                    let n = Rows::get(rows.u64("count"), i).unwrap_or(0);
                    // Summaries never span a gap: where one starts later than a sample
                    // period and a half after the last ended, samples are missing.
                    if let Some((end, period)) = last_summary {
                        if t - end > 1.5 * period {
                            end_runs(&mut env, &mut runs);
                            if t >= t0 && end <= t1 {
                                gaps.push((end + period, t));
                            }
                        }
                    }
                    let period = if n > 1 {
                        d / (n - 1) as f64
                    } else {
                        last_summary.map_or(0.0, |l| l.1)
                    };
                    last_summary = Some((t + d, period));
                    for (e, (c, (lo, hi))) in env.iter_mut().zip(cols.iter().zip(&ext)) {
                        if let (Some(mean), Some(min), Some(max)) =
                            (Rows::get(c, i), Rows::get(lo, i), Rows::get(hi, i))
                        {
                            let sum = f64::from(mean) * n as f64;
                            e.push_bin(mid, Bin { min, max, sum, n });
                        }
                    }
                }
                Kind::Gap => {
                    end_runs(&mut env, &mut runs);
                    let d = Rows::get(rows.f64("duration_s"), i).filter(|d| d.is_finite());
                    let end = t + d.unwrap_or(0.0).max(0.0);
                    if end >= t0 && t <= t1 {
                        gaps.push((t, end));
                    }
                }
                Kind::Edge => {
                    let Some(c) = column(t, t0, t1, columns) else {
                        continue;
                    };
                    n_edges += 1;
                    let line = rows.column::<arrow_array::UInt8Array>("line").value(i);
                    let rising = rows.column::<arrow_array::BooleanArray>("rising").value(i);
                    let text = rows.text();
                    let e = edges.entry(line).or_insert_with(|| EdgeLine {
                        label: String::new(),
                        marks: BTreeSet::new(),
                    });
                    if e.label.is_empty() && text.is_valid(i) {
                        e.label = text.value(i).to_string();
                    }
                    e.marks.insert((c, rising));
                }
                Kind::Logger => {
                    if let Some(w) = Rows::get(rows.f64("logger_w"), i) {
                        if t >= t0 && t <= t1 && w.is_finite() {
                            logger.push((t, w));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    end_runs(&mut env, &mut runs);
    let mut series: Vec<Series> = names
        .into_iter()
        .zip(runs)
        .enumerate()
        .map(|(i, (name, runs))| Series {
            rail: Some(i),
            name,
            runs,
        })
        .collect();
    if let Some(total) = series.last_mut() {
        total.rail = None;
    }
    series.retain(|s| !s.runs.is_empty());
    let plotted = Plotted {
        from: t0,
        to: t1,
        samples: 0,
        gaps: gaps.len(),
        edges: n_edges,
        logger: logger.len(),
        summaries: drew_summaries,
    };
    Ok((
        Data {
            series,
            gaps,
            edges,
            logger,
            overlay: None,
        },
        plotted,
        span,
    ))
}
