//! A meter on the twin's rig: the energy of a window, taken as the samples arrive, is the
//! integral of the recording's own samples over the same span, and the samples read as
//! they come are the recording's.

use std::time::Duration;

use railtrace::link::capture::Config;
use railtrace::link::meter::Meter;
use railtrace::store::recording::{self, Kind, Rows};

mod common;
use common::TempDir;

#[test]
fn a_windows_energy_is_the_recordings_integral_over_it() {
    let dir = TempDir::new("meter");
    let twin = railtrace_twin::Twin::start(&railtrace_twin::scenario::default_scenario()).unwrap();
    let out = dir.join("run.arrow");
    let config = Config {
        rate_hz: Some(100_000),
        ..Config::new(twin.path(), &out)
    };
    let mut meter = Meter::start(config, Duration::from_secs(10)).unwrap();
    assert_eq!(meter.rails().len(), 4);
    std::thread::sleep(Duration::from_millis(300));
    let id = meter.open("busy");
    std::thread::sleep(Duration::from_millis(700));
    let w = meter.close(id, Duration::from_secs(5), 1.0).unwrap();
    let (t, watts, dropped) = meter.read();
    assert_eq!(watts.len(), 4 * t.len());
    meter.finish().unwrap();
    // What arrived between that read and the end.
    let read = t.len() + meter.read().0.len();
    twin.stop().unwrap();

    assert_eq!(w.name, "busy");
    assert!((w.duration_s - 0.7).abs() < 0.05, "{w:?}");
    // 100 kS/s over the window, to the sample.
    assert!(
        (w.samples as f64 - w.duration_s * 1e5).abs() <= 2.0,
        "{w:?}"
    );
    // The twin's GPU idles at 140 W and runs its kernels at up to ~620 W.
    assert!(w.mean_w > 140.0 && w.mean_w < 620.0, "{w:?}");
    assert_eq!(dropped, 0);
    // Nothing missing: every sample slot has its sample.
    assert_eq!((w.gaps, w.missing_s, w.coverage), (0, 0.0, 1.0), "{w:?}");
    assert_eq!(w.samples_expected, w.samples);

    // The same from the recording, summed here: every sample in [start, end) times its
    // period. Both take the recording's own f32 total of each sample and sum in f64, so
    // they agree to rounding.
    let (mut energy, mut n, mut recorded) = (0.0f64, 0u64, 0usize);
    for b in recording::open(&out).unwrap() {
        let b = b.unwrap();
        let rows = Rows::new(&b);
        let (time, total) = (rows.f64("time_s"), rows.f32("total_w"));
        for i in 0..rows.len() {
            if rows.kind(i) != Kind::Sample {
                continue;
            }
            recorded += 1;
            let ts = time.value(i);
            if ts >= w.start_s && ts < w.end_s {
                energy += f64::from(total.value(i)) * 1e-5;
                n += 1;
            }
        }
    }
    assert_eq!(n, w.samples);
    assert!(
        (energy - w.energy_j).abs() < 1e-6 * energy,
        "{energy} J vs {w:?}"
    );
    // Read as they came: every sample the recording holds.
    assert_eq!(read, recorded);
}

/// A window across a link outage: the samples it lacks are counted from the capture's gap
/// row, its mean power is that of the samples it has (never the missing time divided in),
/// and its energy is NaN when they cover less than asked, else their energy with the
/// missing time at that mean.
#[test]
fn a_window_across_a_gap_says_what_it_lacks_and_its_energy_is_nan_below_the_coverage_asked() {
    let dir = TempDir::new("meter-gap");
    // The link goes away 1.0 s into the twin's run for 0.5 s; the device samples on.
    let twin = common::twin_with_faults("disconnect_after_s = 1.0\ndisconnected_s = 0.5");
    let out = dir.join("run.arrow");
    let config = Config {
        rate_hz: Some(100_000),
        ..Config::new(twin.path(), &out)
    };
    let mut meter = Meter::start(config, Duration::from_secs(10)).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let (strict, lenient) = (meter.open("strict"), meter.open("lenient"));
    std::thread::sleep(Duration::from_millis(1500));
    let strict = meter.close(strict, Duration::from_secs(15), 0.99).unwrap();
    let lenient = meter.close(lenient, Duration::from_secs(15), 0.0).unwrap();
    meter.finish().unwrap();
    twin.stop().unwrap();

    for w in [&strict, &lenient] {
        assert_eq!(w.gaps, 1, "{w:?}");
        // About the outage's half second missing of 1.5 s (the device's samples from the
        // link's loss to its return, as the capture's own test bounds them).
        assert!((0.4..0.7).contains(&w.missing_s), "{w:?}");
        assert!((w.coverage - (1.0 - w.missing_s / w.duration_s)).abs() < 1e-12);
        // Every sample slot of the window: those received and those the gap counts.
        let slots = w.duration_s * 1e5;
        assert!((w.samples_expected as f64 - slots).abs() <= 3.0, "{w:?}");
        assert!((w.samples as f64 - (w.duration_s - w.missing_s) * 1e5).abs() <= 3.0);
    }
    assert!(strict.energy_j.is_nan(), "{strict:?}");
    // The mean of the samples there are, from the recording itself.
    let (mut sum, mut n) = (0.0f64, 0u64);
    for b in recording::open(&out).unwrap() {
        let b = b.unwrap();
        let rows = Rows::new(&b);
        let (time, total) = (rows.f64("time_s"), rows.f32("total_w"));
        for i in 0..rows.len() {
            let t = time.value(i);
            if rows.kind(i) == Kind::Sample && t >= lenient.start_s && t < lenient.end_s {
                sum += f64::from(total.value(i));
                n += 1;
            }
        }
    }
    assert_eq!(n, lenient.samples);
    let mean = sum / n as f64;
    // Their mean over the time they cover: the sample count and the covered time agree to
    // a few samples of 150 000.
    assert!(
        (lenient.mean_w - mean).abs() < 1e-4 * mean,
        "{mean} W vs {lenient:?}"
    );
    assert!(
        (lenient.energy_j - lenient.mean_w * lenient.duration_s).abs() < 1e-3 * lenient.energy_j,
        "{lenient:?}"
    );
}
