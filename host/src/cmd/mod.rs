//! One subcommand per file.
pub mod calibrate;
pub mod capture;
pub mod compare;
pub mod correct;
pub mod demo;
pub mod devices;
pub mod dvfs;
pub mod export;
pub mod import;
pub mod info;
pub mod inspect;
pub mod model;
pub mod plot;
pub mod profile;
pub mod report;
pub mod survey;
pub mod twin;
pub mod view;

/// A count option (runs, executions, replicates) from `least` to `most`: the bound,
/// argued from what the run or the machine can hold, is in the error.
pub fn count(least: u64, most: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(least..=most)
}

/// The longest time an option takes: a month, longer than any bench run.
const LONGEST_S: f64 = 31.0 * 86_400.0;

/// A time: plain seconds or a number with a unit (`10s`, `500ms`, `250us`, `2min`, `1h`),
/// at least 0 and at most a month.
pub fn duration(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || ".eE+-".contains(c)))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "min" => 60.0,
        "h" => 3600.0,
        u => return Err(format!("unknown unit `{u}`: use s, ms, us, min or h")),
    };
    let v: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a time (e.g. 10, 10s, 500ms)"))?;
    let s = v * scale;
    if !(0.0..=LONGEST_S).contains(&s) {
        return Err(format!(
            "`{text}`: a time must be between 0 and {LONGEST_S} s (a month)"
        ));
    }
    Ok(std::time::Duration::from_secs_f64(s))
}

/// A time as [`duration`] takes it, in seconds.
pub fn seconds(text: &str) -> Result<f64, String> {
    duration(text).map(|d| d.as_secs_f64())
}

/// A number within `[lo, hi]` (finite).
fn within(text: &str, lo: f64, hi: f64) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number"))?;
    if !(lo..=hi).contains(&v) {
        return Err(format!("`{text}`: must be between {lo} and {hi}"));
    }
    Ok(v)
}

/// Milliseconds a bench waits or looks: 0 to an hour.
pub fn millis(text: &str) -> Result<f64, String> {
    within(text, 0.0, 3.6e6)
}

/// A logger's period, ms: 10 µs to a minute.
pub fn period_ms(text: &str) -> Result<f64, String> {
    within(text, 0.01, 60_000.0)
}

/// A profile's bin width, µs: 10 ns to a second.
pub fn bin_us(text: &str) -> Result<f64, String> {
    within(text, 0.01, 1e6)
}

/// A relative error: above 0, at most 1.
pub fn rel_err(text: &str) -> Result<f64, String> {
    within(text, 0.0, 1.0).and_then(|v| {
        (v > 0.0)
            .then_some(v)
            .ok_or_else(|| format!("`{text}`: must be above 0"))
    })
}

/// An instant on a recording's timeline, s (finite; a recording is at most years long).
pub fn instant_s(text: &str) -> Result<f64, String> {
    within(text, -1e9, 1e9)
}

/// Hours east of UTC: -14 to +14.
pub fn utc_offset_h(text: &str) -> Result<f64, String> {
    within(text, -14.0, 14.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_take_units_and_refuse_nonsense() {
        let s = |t| duration(t).map(|d| d.as_secs_f64());
        assert_eq!(s("10"), Ok(10.0));
        assert_eq!(s("10s"), Ok(10.0));
        assert_eq!(s("500ms"), Ok(0.5));
        assert_eq!(s("250us"), Ok(250e-6));
        assert_eq!(s("2min"), Ok(120.0));
        assert_eq!(s("1.5h"), Ok(5400.0));
        assert_eq!(s("1e-3"), Ok(1e-3));
        for bad in ["-1", "nan", "inf", "1e30", "", "s", "10 parsecs", "1e400"] {
            let e = s(bad).unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
        for bad in ["nan", "inf", "-1", "1e30", "x"] {
            assert!(millis(bad).is_err(), "{bad}");
            assert!(bin_us(bad).is_err(), "{bad}");
        }
        for bad in ["nan", "inf", "-15", "1e30", "x"] {
            assert!(utc_offset_h(bad).is_err(), "{bad}");
        }
        assert_eq!(utc_offset_h("-1"), Ok(-1.0));
        assert!(period_ms("1e-9").is_err());
        for bad in ["0", "-0.05", "1.5", "nan", "x"] {
            assert!(rel_err(bad).is_err(), "{bad}");
        }
        assert_eq!(rel_err("0.05"), Ok(0.05));
        assert_eq!(period_ms("1"), Ok(1.0));
    }
}
