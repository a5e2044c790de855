//! DVFS switching latency: the time from the host's request for a DVFS level
//! to the power step the rig sees.
//!
//! [`acquire`] asks the GPU for DVFS levels in turn (each request a different level from
//! the one before), each after a random wait long enough for the power to settle, and
//! drives a trigger pulse into the rig just before each request so that the rig's clock
//! can be linked to the host's. Everything goes into a recording of its own (`driven` and
//! `dvfs_request` rows, host-bracketed); the rig's capture goes beside it. [`latencies`]
//! puts the rig's samples on the host's timeline through the trigger edges and, after
//! each request, finds the power step with [`railtrace_calibration::steps::find_step`]
//! (the least-squares change point, timed half-way between the two levels) up to the
//! next request or a window, whichever comes first. The latency is the step's instant
//! less the middle of the request's bracket.

use std::path::Path;

use railtrace_calibration::steps::{find_step, Step};
use serde::Serialize;

use crate::analysis::stitch::{dvfs_timeline, AnalysisError, Link, Options as LinkOptions};
use crate::gpu::profile::ProfileError;
use crate::gpu::{host_now_ns, GpuRunner};
use crate::link::trigger::TriggerOut;
use crate::store::recording::{Event, Meta, Writer, FORMAT_VERSION};

/// What to ask for.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The levels, asked for in turn (at least two).
    pub levels: Vec<String>,
    /// Requests to make.
    pub switches: usize,
    /// Shortest and longest random wait before each request, s.
    pub wait_s: (f64, f64),
    /// The rig's trigger input the trigger output is wired to.
    pub trigger_line: u8,
    /// Seed of the waits.
    pub seed: u64,
}

/// Makes `plan`'s requests on `runner`, writing them and the trigger edges into a
/// recording at `output`; `progress` is called with the requests made so far. Returns the
/// requests made: fewer than planned when an end was asked for ([`crate::link::stop`]).
pub fn acquire(
    runner: &mut dyn GpuRunner,
    trigger: &mut dyn TriggerOut,
    plan: &Plan,
    output: &Path,
    settings: serde_json::Value,
    mut progress: impl FnMut(usize),
) -> Result<usize, ProfileError> {
    for level in &plan.levels {
        crate::gpu::check_dvfs_level(runner, level)?;
    }
    let epoch_ns = host_now_ns();
    let meta = Meta {
        version: FORMAT_VERSION,
        source: format!("dvfs latency on {}", runner.describe()),
        epoch_utc_ns: epoch_ns,
        timebase: "host clock (UTC)".into(),
        rails: Vec::new(),
        code_channels: Vec::new(),
        device: None,
        rig: None,
        derive: None,
        settings: Some(serde_json::json!({
            "levels": plan.levels,
            "switches": plan.switches,
            "wait_s": [plan.wait_s.0, plan.wait_s.1],
            "gpu": runner.describe(),
            "gpu_clock_hz": runner.clock_hz(),
            "trigger": trigger.describe(),
            "trigger_line": plan.trigger_line,
            "more": settings,
        })),
    };
    let mut w = Writer::create(output, &meta)?;
    let host_s = |ns: i64| (ns - epoch_ns) as f64 * 1e-9;
    let mid = |a: i64, b: i64| a + (b - a) / 2;
    let mut rng = plan.seed | 1;
    let other = |e: crate::link::trigger::TriggerError| crate::gpu::GpuError::Other(e.to_string());
    let mut made = 0;
    for i in 0..plan.switches {
        if crate::link::stop::requested() {
            break;
        }
        let u = crate::gpu::uniform(&mut rng);
        let (lo, hi) = plan.wait_s;
        std::thread::sleep(std::time::Duration::from_secs_f64(lo + (hi - lo) * u));
        let level = &plan.levels[i % plan.levels.len()];
        let rise = trigger.set(true).map_err(other)?;
        let r = runner.request_dvfs(level)?;
        let fall = trigger.set(false).map_err(other)?;
        for d in [rise, fall] {
            w.event(&d.event(plan.trigger_line, epoch_ns));
        }
        w.event(&Event::DvfsRequest {
            time_s: host_s(mid(r.host_before_ns, r.host_after_ns)),
            level: r.level,
            host_before_ns: r.host_before_ns,
            host_after_ns: r.host_after_ns,
        });
        w.maybe_flush()?;
        made = i + 1;
        progress(made);
    }
    // The last switch takes effect after its latency: let the rig see it.
    std::thread::sleep(std::time::Duration::from_secs_f64(plan.wait_s.1.max(0.05)));
    w.finish()?;
    Ok(made)
}

/// How to find the steps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Options {
    /// Look for a request's step at most this long after it, s (and never past the next
    /// request).
    pub window_s: f64,
    /// The smallest step called a step, W.
    pub min_step_w: f64,
    /// The smallest step called a step, in standard errors of the two levels' difference.
    pub min_z: f64,
    /// The trigger path's mean latency, s (as [`LinkOptions::trigger_latency_s`]).
    pub trigger_latency_s: f64,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            window_s: 50e-3,
            min_step_w: 2.0,
            min_z: 8.0,
            trigger_latency_s: 0.0,
        }
    }
}

/// One request and what the rig saw.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Switch {
    /// The level asked for.
    pub level: String,
    /// The request's instant (the middle of its bracket), host s since the run's epoch.
    pub request_s: f64,
    /// Half the bracket's width, s (the request's timing uncertainty).
    pub request_half_width_s: f64,
    /// The step's instant, host s, if one was found.
    pub step_s: Option<f64>,
    /// From the request to the step, s.
    pub latency_s: Option<f64>,
    /// Power before and after the step, W.
    pub before_w: Option<f64>,
    /// Power after the step, W.
    pub after_w: Option<f64>,
}

/// The switching latencies of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latencies {
    /// Every request.
    pub switches: Vec<Switch>,
    /// Requests whose step was found.
    pub found: usize,
    /// Median latency, s.
    pub median_s: f64,
    /// 5th and 95th percentiles, s.
    pub p05_s: f64,
    /// 95th percentile, s.
    pub p95_s: f64,
    /// Mean and standard deviation, s.
    pub mean_s: f64,
    /// Standard deviation, s.
    pub sd_s: f64,
    /// The device → host link the rig's samples went through.
    pub device: Link,
    /// The options used.
    pub options: Options,
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let x = q * (sorted.len() - 1) as f64;
    let (i, f) = (x.floor() as usize, x.fract());
    sorted[i] + (sorted[(i + 1).min(sorted.len() - 1)] - sorted[i]) * f
}

/// A DVFS latency run on the digital twin of `scenario` (the built-in
/// [`DVFS_SCENARIO`](crate::analysis::model::DVFS_SCENARIO) when none) into `output`, the rig's capture beside it at `rate_hz` (its highest when
/// none): `plan.levels` empty asks for every level of the twin's GPU. `progress` is told
/// of each request; returns the requests made (fewer when interrupted, the recordings
/// closed and keeping them).
///
/// # Errors
///
/// A scenario that does not load, fewer than two levels, the twin or the capture failing.
pub fn on_twin(
    scenario: Option<&Path>,
    mut plan: Plan,
    output: &Path,
    rate_hz: Option<u32>,
    progress: impl FnMut(usize),
) -> anyhow::Result<(usize, crate::link::capture::Summary)> {
    use anyhow::Context;
    let loaded = match scenario {
        Some(p) => railtrace_twin::load_scenario(p)?,
        None => railtrace_twin::scenario::parse(
            "dvfs.toml",
            crate::analysis::model::DVFS_SCENARIO,
            |_| {
                Ok((
                    "pcie-2x8pin-hs.toml".into(),
                    railtrace_twin::scenario::DEFAULT_RIG.into(),
                ))
            },
        )
        .context("the built-in DVFS scenario")?,
    };
    let twin = railtrace_twin::Twin::start(&loaded).context("the twin did not start")?;
    let gpu = crate::gpu::twin::TwinGpu::new(&twin);
    let mut runner = gpu.runner(plan.seed);
    if plan.levels.is_empty() {
        plan.levels = runner.dvfs_levels();
    }
    let rig_out = crate::store::recording::rig_path(output);
    let result = (|| {
        anyhow::ensure!(
            plan.levels.len() >= 2,
            "need two DVFS levels or more to switch between (have: {})",
            plan.levels.join(", ")
        );
        crate::gpu::profile::with_rig(
            twin.path(),
            &rig_out,
            (rate_hz, None),
            (None, false),
            || {
                let settings = serde_json::json!({
                    "scenario": scenario.map(|p| p.display().to_string()),
                    "rig_recording": rig_out.display().to_string(),
                });
                let mut trigger = crate::gpu::twin::TwinTrigger::new(&twin, plan.trigger_line);
                Ok(acquire(
                    &mut runner,
                    &mut trigger,
                    &plan,
                    output,
                    settings,
                    progress,
                )?)
            },
        )
    })();
    twin.stop().context("the twin failed")?;
    result
}

/// The latency of every request of the run at `run_path`, from its rig capture at
/// `rig_path`.
pub fn latencies(
    run_path: &Path,
    rig_path: &Path,
    o: &Options,
) -> Result<Latencies, AnalysisError> {
    let link = LinkOptions {
        trigger_latency_s: o.trigger_latency_s,
        ..LinkOptions::default()
    };
    let t = dvfs_timeline(run_path, rig_path, &link)?;
    if t.requests.is_empty() {
        return Err(AnalysisError::Missing(format!(
            "{}: no dvfs_request rows",
            run_path.display()
        )));
    }
    let math = |e: &dyn std::fmt::Display| AnalysisError::Math(e.to_string());
    let mut switches = Vec::new();
    for (i, (level, before, after)) in t.requests.iter().enumerate() {
        let request = 0.5 * (before + after);
        let end = t
            .requests
            .get(i + 1)
            .map_or(f64::INFINITY, |n| n.1)
            .min(request + o.window_s);
        // From the bracket's start: the step cannot come before the request. A window
        // of fewer than four samples (a run cut short) has no step.
        let samples =
            t.rig_t.partition_point(|&x| x < end) - t.rig_t.partition_point(|&x| x < *before);
        let step: Option<Step> = if samples < 4 {
            None
        } else {
            find_step(&t.rig_t, &t.rig_w, *before, end, o.min_step_w, o.min_z)
                .map_err(|e| math(&e))?
        };
        switches.push(Switch {
            level: level.clone(),
            request_s: request,
            request_half_width_s: 0.5 * (after - before),
            step_s: step.map(|s| s.time_s),
            latency_s: step.map(|s| s.time_s - request),
            before_w: step.map(|s| s.before_w),
            after_w: step.map(|s| s.after_w),
        });
    }
    let mut l: Vec<f64> = switches.iter().filter_map(|s| s.latency_s).collect();
    l.sort_by(f64::total_cmp);
    let n = l.len() as f64;
    let mean = l.iter().sum::<f64>() / n;
    let sd = (l.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
    Ok(Latencies {
        found: l.len(),
        median_s: quantile(&l, 0.5),
        p05_s: quantile(&l, 0.05),
        p95_s: quantile(&l, 0.95),
        mean_s: mean,
        sd_s: sd,
        switches,
        device: t.device,
        options: o.clone(),
    })
}

#[cfg(feature = "plots")]
/// The rig's power around a request (ms since it, W) and the step found, ms.
type Trace = (Vec<(f64, f64)>, Option<f64>);

#[cfg(feature = "plots")]
/// A picture of a run's latencies, as PNG or SVG by `out`'s extension: their histogram,
/// and the rig's power around the first requests, aligned at each request, with the
/// steps found marked.
pub fn plot(l: &Latencies, run_path: &Path, out: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    crate::store::plot::Format::of(out)?; // before the work, the macro's check again after
    let link = LinkOptions {
        trigger_latency_s: l.options.trigger_latency_s,
        ..LinkOptions::default()
    };
    let t = dvfs_timeline(
        run_path,
        &crate::store::recording::rig_path(run_path),
        &link,
    )?;
    let lat_ms: Vec<f64> = l
        .switches
        .iter()
        .filter_map(|s| s.latency_s.map(|x| x * 1e3))
        .collect();
    let (span_lo, span_hi) = (-0.25 * l.options.window_s, l.options.window_s);
    // The traces: up to 30 switches, time since the request in ms.
    let traces: Vec<Trace> = l
        .switches
        .iter()
        .take(30)
        .map(|s| {
            let a = t.rig_t.partition_point(|&x| x < s.request_s + span_lo);
            let b = t.rig_t.partition_point(|&x| x < s.request_s + span_hi);
            let pts = (a..b)
                .map(|i| ((t.rig_t[i] - s.request_s) * 1e3, t.rig_w[i]))
                .collect();
            (pts, s.latency_s.map(|x| x * 1e3))
        })
        .collect();
    fn draw<DB: DrawingBackend>(
        root: DrawingArea<DB, plotters::coord::Shift>,
        lat_ms: &[f64],
        traces: &[Trace],
        span_ms: (f64, f64),
        title: &str,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        root.fill(&WHITE)?;
        let root = root.titled(title, ("sans-serif", 24))?;
        let (top, bottom) = root.split_vertically(root.dim_in_pixel().1 / 2);
        // The histogram.
        let (lo, hi) = lat_ms
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            });
        let (lo, hi) = if lo.is_finite() && hi > lo {
            (lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
        } else if lo.is_finite() {
            (lo - 0.1, lo + 0.1)
        } else {
            (0.0, 1.0)
        };
        let bins = 40;
        let w = (hi - lo) / bins as f64;
        let mut counts = vec![0u32; bins];
        for &x in lat_ms {
            counts[(((x - lo) / w) as usize).min(bins - 1)] += 1;
        }
        let top_count = counts.iter().copied().max().unwrap_or(1).max(1);
        let mut c = ChartBuilder::on(&top)
            .caption(
                "latency: host request to the rig's power step",
                ("sans-serif", 18),
            )
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(lo..hi, 0u32..top_count + 1)?;
        c.configure_mesh()
            .x_desc("latency, ms")
            .y_desc("switches")
            .label_style(("sans-serif", 14))
            .draw()?;
        c.draw_series(counts.iter().enumerate().map(|(i, &n)| {
            let x0 = lo + i as f64 * w;
            Rectangle::new([(x0, 0), (x0 + w, n)], RGBColor(0x4e, 0x79, 0xa7).filled())
        }))?;
        // The traces.
        let (mut plo, mut phi) = (f64::INFINITY, f64::NEG_INFINITY);
        for (pts, _) in traces {
            for &(_, p) in pts {
                plo = plo.min(p);
                phi = phi.max(p);
            }
        }
        if !(plo.is_finite() && phi > plo) {
            (plo, phi) = (0.0, 1.0);
        }
        let pad = 0.05 * (phi - plo);
        let mut c = ChartBuilder::on(&bottom)
            .caption(
                "the rig's power around each request (the first 30), steps marked",
                ("sans-serif", 18),
            )
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(span_ms.0..span_ms.1, (plo - pad)..(phi + pad))?;
        c.configure_mesh()
            .x_desc("time since the request, ms")
            .y_desc("power, W")
            .label_style(("sans-serif", 14))
            .draw()?;
        for (pts, step) in traces {
            c.draw_series(LineSeries::new(
                pts.iter().copied(),
                RGBColor(0x1f, 0x77, 0xb4).mix(0.5),
            ))?;
            if let Some(s) = step {
                c.draw_series(std::iter::once(PathElement::new(
                    vec![(*s, plo - pad), (*s, phi + pad)],
                    RGBColor(0xd6, 0x27, 0x28).mix(0.3),
                )))?;
            }
        }
        root.present()
    }
    let title = format!(
        "railtrace dvfs latency: {} of {} switches, median {:.3} ms",
        l.found,
        l.switches.len(),
        l.median_s * 1e3
    );
    let span = (span_lo * 1e3, span_hi * 1e3);
    crate::store::plot::draw_to!(out, (1400, 1000), |root| draw(
        root, &lat_ms, &traces, span, &title
    ));
    Ok(())
}
