//! The demo's report: the profiles against the truth as a table, the picture (SVG and
//! PNG), the profiles as CSV, the figures as JSON, the exports, and an HTML page with
//! them all.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use plotters::prelude::*;

use super::score::{Score, Scored};
use super::Check;
use crate::analysis::stitch::Cell;
use crate::store::export::{export, Format, Options as ExportOptions};

/// The rows (the first the truth) as a table: each phase's power and its error, each
/// step's time, the energy per execution and its error, the RMS error.
pub fn table(rows: &[(&str, Score)]) -> String {
    let truth = &rows[0].1;
    let rel = |a: f64, b: f64| (a - b) / b;
    let phases = truth.phase_w.len();
    let mut table = String::new();
    let _ = write!(table, "{:<14}", "");
    for j in 0..phases {
        let _ = write!(table, "{:>18}", format!("phase {} W", j + 1));
    }
    for j in 0..phases.saturating_sub(1) {
        let _ = write!(table, "{:>16}", format!("step {} µs", j + 1));
    }
    let _ = writeln!(table, "{:>22}{:>10}", "energy/exec mJ", "RMS W");
    for (name, s) in rows {
        let _ = write!(table, "{name:<14}");
        for (&w, &t) in s.phase_w.iter().zip(&truth.phase_w) {
            let _ = write!(
                table,
                "{:>18}",
                format!("{w:.1} ({:+.1} %)", rel(w, t) * 100.0)
            );
        }
        for st in &s.step_s {
            let _ = write!(
                table,
                "{:>16}",
                st.map_or("none".into(), |t| format!("{:.1}", t * 1e6))
            );
        }
        let _ = writeln!(
            table,
            "{:>22}{:>10.2}",
            format!(
                "{:.3} ({:+.2} %)",
                s.energy_j * 1e3,
                rel(s.energy_j, truth.energy_j) * 100.0
            ),
            s.rms_w
        );
    }
    table
}

/// Writes the report into `out`: `profiles.png` and `.svg`, `profiles.csv`,
/// `figures.json`, the profile's and the rig's recordings (`recordings`: the profile
/// first, the rig's second) exported to Parquet and Perfetto, and `report.html` with the
/// table, the checks and the picture; returns the report's path.
///
/// # Errors
///
/// A file that cannot be written, or a recording that cannot be read.
pub fn write(
    out: &Path,
    title: &str,
    figures: &serde_json::Value,
    scored: &Scored,
    table: &str,
    checks: &[Check],
    recordings: &[&Path; 2],
) -> anyhow::Result<PathBuf> {
    let p = &scored.profiles;
    let curves = [
        Curve {
            name: "truth (the twin's GPU power)",
            colour: BLACK,
            dashed: false,
            cells: &p.truth,
        },
        Curve {
            name: "rig",
            colour: RGBColor(0x1f, 0x77, 0xb4),
            dashed: false,
            cells: &p.rig,
        },
        Curve {
            name: "raw stitched logger",
            colour: RGBColor(0x8e, 0x3b, 0xa0),
            dashed: false,
            cells: &p.raw,
        },
        Curve {
            name: "rig through the identified logger",
            colour: RGBColor(0xff, 0x7f, 0x0e),
            dashed: true,
            cells: &p.through,
        },
        Curve {
            name: "corrected (band shaded)",
            colour: RGBColor(0xd6, 0x27, 0x28),
            dashed: false,
            cells: &p.corrected,
        },
    ];
    let duration = scored.duration_s;
    let zoom = (-0.15 * duration, 1.6 * duration);
    picture(
        &out.join("profiles.png"),
        title,
        &curves,
        &p.band,
        scored.span,
        zoom,
    )?;
    let svg = picture(
        &out.join("profiles.svg"),
        title,
        &curves,
        &p.band,
        scored.span,
        zoom,
    )?
    .unwrap_or_default();
    let dt = figures["bin_s"].as_f64().unwrap_or(10e-6);
    write_csv(
        &out.join("profiles.csv"),
        &[
            ("truth_w", &p.truth),
            ("rig_w", &p.rig),
            ("raw_w", &p.raw),
            ("rig_through_logger_w", &p.through),
            ("corrected_w", &p.corrected),
        ],
        dt,
        scored.span,
    )?;
    let [profile, rig] = *recordings;
    let mut exported = Vec::new();
    for (path, format, name) in [
        (rig, Format::Parquet, "profile.rig.parquet"),
        (rig, Format::Perfetto, "profile.rig.json"),
        (profile, Format::Parquet, "profile.parquet"),
    ] {
        let target = out.join(name);
        export(
            &crate::store::recording::open(path)?,
            &target,
            &ExportOptions::new(format),
        )?;
        exported.push(target);
    }
    crate::store::write_output(
        &out.join("figures.json"),
        serde_json::to_string_pretty(figures)?,
    )
    .with_context(|| format!("cannot write into {}", out.display()))?;
    let html = out.join("report.html");
    crate::store::write_output(
        &html,
        report_html(figures, table, checks, &svg, &exported, out),
    )
    .with_context(|| format!("cannot write {}", html.display()))?;
    Ok(html)
}

/// The profiles on one grid of cells `dt` wide over `span`, as CSV (empty where a
/// profile has no cell there).
fn write_csv(
    path: &Path,
    columns: &[(&str, &[Cell])],
    dt: f64,
    span: (f64, f64),
) -> anyhow::Result<()> {
    let mut s = String::from("t_us");
    for (name, _) in columns {
        s.push(',');
        s.push_str(name);
    }
    s.push('\n');
    let n = ((span.1 - span.0) / dt).round() as usize;
    for i in 0..n {
        let mid = span.0 + (i as f64 + 0.5) * dt;
        let _ = write!(s, "{:.3}", mid * 1e6);
        for (_, cells) in columns {
            s.push(',');
            if let Some(c) = cells
                .iter()
                .find(|c| c.lo <= mid && mid < c.hi && c.w.is_finite())
            {
                let _ = write!(s, "{:.4}", c.w);
            }
        }
        s.push('\n');
    }
    crate::store::write_output(path, s).with_context(|| format!("cannot write {}", path.display()))
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The report: the table, the checks, the picture inline, the files.
fn report_html(
    figures: &serde_json::Value,
    table: &str,
    checks: &[Check],
    picture: &str,
    exported: &[PathBuf],
    out: &Path,
) -> String {
    let mut h = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>railtrace demo</title>\n\
         <style>body{font-family:sans-serif;max-width:1450px;margin:2em auto;color:#222}\
         pre{background:#f6f6f6;padding:1em;overflow-x:auto}td,th{padding:.2em .8em;text-align:left}\
         .pass{color:#1a7f37}.fail{color:#c01c2b;font-weight:bold}</style></head><body>\n",
    );
    let _ = writeln!(
        h,
        "<h1>railtrace demo</h1><p>{}</p>",
        escape(figures["scenario"].as_str().unwrap_or(""))
    );
    let m = &figures["logger"];
    let _ = writeln!(
        h,
        "<p>{} runs, {} executions kept by the duration clustering; the logger identified \
         from the rig as <b>{}</b> (period {:.4} ms, delay {:.2} µs, gain {:.4}, offset {:.2} W, \
         residual {:.3} W); corrected on {:.0} µs cells, λ {:.3e} ({}), idle {:.1} W.</p>",
        figures["runs"],
        figures["executions_kept"],
        escape(m["family"].as_str().unwrap_or("")),
        m["period_s"].as_f64().unwrap_or(f64::NAN) * 1e3,
        m["delay_s"].as_f64().unwrap_or(f64::NAN) * 1e6,
        m["gain"].as_f64().unwrap_or(f64::NAN),
        m["offset_w"].as_f64().unwrap_or(f64::NAN),
        m["residual_rms_w"].as_f64().unwrap_or(f64::NAN),
        figures["bin_s"].as_f64().unwrap_or(f64::NAN) * 1e6,
        figures["lambda"].as_f64().unwrap_or(f64::NAN),
        escape(figures["rule"].as_str().unwrap_or("")),
        figures["idle_w"].as_f64().unwrap_or(f64::NAN),
    );
    if let Some(why) = figures["widened"].as_str() {
        let _ = writeln!(h, "<p><b>Bins widened:</b> {}.</p>", escape(why));
    }
    let pilot = &figures["pilot"];
    if let Some(runs) = pilot["runs"].as_u64() {
        let p = &pilot["run_plan"];
        let _ = writeln!(
            h,
            "<p><b>Pilot:</b> {runs} executions planned this run: bins of {:.1} µs and {} executions; this run's own plan asks for {:.2} times that.</p>",
            p["bin_s"].as_f64().unwrap_or(f64::NAN) * 1e6,
            p["executions"],
            pilot["replanned_ratio"].as_f64().unwrap_or(f64::NAN),
        );
    }
    if let Some(plan) = figures["plan"].as_str() {
        let _ = writeln!(h, "<p><b>Plan:</b> {}.</p>", escape(plan));
    }
    match figures["validity"]["outside"].as_array() {
        Some(outside) if !outside.is_empty() => {
            h.push_str(
                "<p><b>Outside the range where the correction can be trusted:</b></p><ul>\n",
            );
            for why in outside.iter().filter_map(|w| w.as_str()) {
                let _ = writeln!(h, "<li>{}</li>", escape(why));
            }
            h.push_str("</ul>\n");
        }
        _ => h.push_str("<p><b>Within the range where the correction can be trusted.</b></p>\n"),
    }
    let _ = writeln!(
        h,
        "<h2>Against the twin's truth</h2><pre>{}</pre>",
        escape(table)
    );
    h.push_str("<h2>Checks</h2><table>\n");
    for c in checks {
        let _ = writeln!(
            h,
            "<tr><td class=\"{}\">{}</td><td>{}</td><td>{}</td></tr>",
            if c.pass { "pass" } else { "fail" },
            if c.pass { "pass" } else { "FAIL" },
            escape(&c.what),
            escape(&c.measured)
        );
    }
    h.push_str("</table>\n<h2>The profiles</h2>\n");
    h.push_str(picture.trim_start_matches(|c| c != '<'));
    h.push_str("\n<h2>Files</h2><ul>\n");
    let mut files = vec![
        "profile.arrow".to_string(),
        "profile.rig.arrow".into(),
        "logger.toml".into(),
        "corrected.arrow".into(),
        "profiles.csv".into(),
        "profiles.svg".into(),
        "profiles.png".into(),
        "figures.json".into(),
        "truth/".into(),
    ];
    files.extend(
        exported
            .iter()
            .map(|p| p.strip_prefix(out).unwrap_or(p).display().to_string()),
    );
    for f in files {
        let _ = writeln!(h, "<li><a href=\"{0}\">{0}</a></li>", escape(&f));
    }
    h.push_str("</ul></body></html>\n");
    h
}

/// One curve of the demo's picture.
#[derive(Debug, Clone)]
pub struct Curve<'a> {
    /// Its name in the legend.
    pub name: &'a str,
    /// Its colour.
    pub colour: RGBColor,
    /// Drawn dashed.
    pub dashed: bool,
    /// Its cells.
    pub cells: &'a [Cell],
}

/// The demo's picture, as SVG (returned as text) or PNG by `out`'s extension, written to
/// `out`: the curves over the whole TOI span `wide`, and again over `zoom`, with the
/// corrected profile's band (cells of `(lo, hi)` W) shaded.
pub fn picture(
    out: &Path,
    title: &str,
    curves: &[Curve<'_>],
    band: &[(Cell, Cell)],
    wide: (f64, f64),
    zoom: (f64, f64),
) -> anyhow::Result<Option<String>> {
    crate::store::plot::register_font()?;
    let size = (1400, 1100);
    match crate::store::plot::Format::of(out)? {
        crate::store::plot::Format::Svg => {
            let mut text = String::new();
            draw(
                SVGBackend::with_string(&mut text, size).into_drawing_area(),
                title,
                curves,
                band,
                wide,
                zoom,
            )
            .map_err(|e| anyhow!("{}: {e}", out.display()))?;
            crate::store::write_output(out, &text)
                .with_context(|| format!("cannot write {}", out.display()))?;
            Ok(Some(text))
        }
        crate::store::plot::Format::Png => {
            crate::store::through_partial(out, |partial| {
                draw(
                    BitMapBackend::new(partial, size).into_drawing_area(),
                    title,
                    curves,
                    band,
                    wide,
                    zoom,
                )
                .map_err(|e| anyhow!("{e}"))
            })
            .map_err(|e| anyhow!("{}: {e}", out.display()))?;
            Ok(None)
        }
    }
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    curves: &[Curve<'_>],
    band: &[(Cell, Cell)],
    wide: (f64, f64),
    zoom: (f64, f64),
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 26))?;
    let panels = root.split_evenly((2, 1));
    for (area, (span, caption)) in panels.iter().zip([
        (wide, "the kernel and the logger's reach"),
        (zoom, "the kernel"),
    ]) {
        panel(area, curves, band, span, caption)?;
    }
    root.present()
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    curves: &[Curve<'_>],
    band: &[(Cell, Cell)],
    span: (f64, f64),
    caption: &str,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let us = |t: f64| t * 1e6;
    let inside = |c: &Cell| c.hi > span.0 && c.lo < span.1 && c.w.is_finite();
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for c in curves
        .iter()
        .flat_map(|c| c.cells.iter())
        .filter(|c| inside(c))
    {
        lo = lo.min(c.w);
        hi = hi.max(c.w);
    }
    if !(lo.is_finite() && hi > lo) {
        (lo, hi) = (0.0, 1.0);
    }
    let pad = 0.06 * (hi - lo);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(46)
        .y_label_area_size(70)
        .build_cartesian_2d(us(span.0)..us(span.1), (lo - pad)..(hi + 2.5 * pad))?;
    chart
        .configure_mesh()
        .x_desc("time since the execution's start, µs")
        .y_desc("power, W")
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .draw()?;
    let shade = RGBColor(0xf4, 0xc7, 0xc3);
    chart.draw_series(
        band.iter()
            .filter(|(l, _)| inside(l))
            .map(|(l, h)| Rectangle::new([(us(l.lo), l.w), (us(l.hi), h.w)], shade.filled())),
    )?;
    for c in curves {
        // A step line through the cells' levels.
        let mut pts = Vec::new();
        for cell in c.cells.iter().filter(|c| inside(c)) {
            pts.push((us(cell.lo.max(span.0)), cell.w));
            pts.push((us(cell.hi.min(span.1)), cell.w));
        }
        let style = c.colour.stroke_width(2);
        let drawn = if c.dashed {
            chart.draw_series(DashedLineSeries::new(pts, 6, 4, style))?
        } else {
            chart.draw_series(LineSeries::new(pts, style))?
        };
        drawn
            .label(c.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(0xcc, 0xcc, 0xcc))
        .label_font(("sans-serif", 15))
        .draw()
}
