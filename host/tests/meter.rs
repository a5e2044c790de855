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
    let w = meter.close(id, Duration::from_secs(5)).unwrap();
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
