//! Every option a bench types is checked before anything starts: a value no bench can mean
//! (negative, NaN, infinite, absurdly large, of no known unit) is refused with one error
//! naming the option, never a panic or an allocation the size of the value.

use std::process::{Command, Output};

fn railtrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_railtrace"))
        .args(args)
        .output()
        .unwrap()
}

/// Refused as a usage error (clap's exit status 2) naming `option`, with no panic.
fn refused(args: &[&str], option: &str) {
    let o = railtrace(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(
        err.contains(option),
        "{args:?}: {err:?} should name {option}"
    );
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

const ABSURD: [&str; 6] = ["-1", "nan", "inf", "1e30", "-inf", "ten"];

#[test]
fn absurd_times_are_refused_naming_the_option() {
    let dir = std::env::temp_dir();
    let out = dir.join("railtrace-options-never-written.arrow");
    let o = out.to_str().unwrap();
    for v in ABSURD {
        refused(
            &[
                "capture",
                "--port",
                "/nonexistent",
                "-o",
                o,
                &format!("--duration={v}"),
            ],
            "--duration",
        );
        refused(
            &[
                "capture",
                "--port",
                "/nonexistent",
                "-o",
                o,
                &format!("--reconnect-wait={v}"),
            ],
            "--reconnect-wait",
        );
        refused(&["devices", &format!("--timeout={v}")], "--timeout");
        refused(
            &["info", "--port", "/nonexistent", &format!("--timeout={v}")],
            "--timeout",
        );
        refused(&["twin", "serve", &format!("--seconds={v}")], "--seconds");
        refused(&["profile", "-o", o, "--delay-ms", v, "3"], "--delay-ms");
        refused(
            &["dvfs", "latency", "-o", o, "--wait-ms", v, "50"],
            "--wait-ms",
        );
        refused(
            &["dvfs", "latency", "-o", o, &format!("--window-ms={v}")],
            "--window-ms",
        );
        refused(
            &["report", "p.arrow", &format!("--horizon-ms={v}")],
            "--horizon-ms",
        );
        refused(&["report", "p.arrow", &format!("--bin-us={v}")], "--bin-us");
    }
    // A time zone or an instant may be negative.
    for v in ABSURD.iter().filter(|&&v| v != "-1") {
        refused(
            &["import", "pmd", ".", &format!("--utc-offset={v}")],
            "--utc-offset",
        );
        refused(
            &["plot", "r.arrow", "-o", "p.svg", &format!("--from={v}")],
            "--from",
        );
    }
    // A logger period no logger has: a 4 TB grid otherwise.
    refused(
        &["calibrate", "logger", "p.arrow", "--period-ms", "1e-9"],
        "--period-ms",
    );
    refused(&["demo", "--period-ms", "1e-9"], "--period-ms");
    // No conversion at all is not one conversion.
    refused(
        &[
            "capture",
            "--port",
            "/nonexistent",
            "-o",
            o,
            "--averaging",
            "0",
        ],
        "--averaging",
    );
    assert!(!out.exists());
}

/// A count no machine can hold (it would wrap, or allocate gigabytes, or run for ever) is
/// refused naming the option and its bound, before anything runs.
#[test]
fn counts_past_what_a_run_can_hold_are_refused_with_the_bound() {
    let out = std::env::temp_dir().join("railtrace-options-counts.arrow");
    let o = out.to_str().unwrap();
    for (args, option, bound) in [
        (
            vec!["profile", "-o", o, "--warmup", "4294967295"],
            "--warmup",
            "10000",
        ),
        (
            vec!["profile", "-o", o, "--count", "4294967295"],
            "--count",
            "10000",
        ),
        (vec!["profile", "-o", o, "--count", "0"], "--count", "1"),
        (
            vec!["profile", "-o", o, "--runs", "18446744073709551615"],
            "--runs",
            "1000000",
        ),
        (
            vec!["compare", "x.arrow", "--bootstrap", "4294967295"],
            "--bootstrap",
            "10000",
        ),
        (
            vec!["compare", "x.arrow", "--bootstrap", "2305843009213693952"],
            "--bootstrap",
            "10000",
        ),
        (vec!["demo", "--runs", "0"], "--runs", "1"),
    ] {
        let o = railtrace(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(option) && err.contains(bound),
            "{args:?}: {err}"
        );
    }
    // Each within its bound, but together more executions than a run holds in memory.
    let o = railtrace(&["profile", "-o", o, "--runs", "1000000", "--count", "10000"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("at most 50 000 000"), "{err}");
    assert!(!out.exists());
}

#[test]
fn times_take_units() {
    // A unit is read: 500ms is half a second, not refused; the capture then fails on its
    // port, after the options were taken.
    for d in ["10s", "500ms", "2min", "1.5"] {
        let o = railtrace(&[
            "capture",
            "--port",
            "/dev/railtrace-nonexistent",
            "-o",
            "/tmp/railtrace-x.arrow",
            "--duration",
            d,
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("no such serial port"), "{d}: {err}");
    }
}

/// The twin's GPU has its scenario's logger: a real GPU's named with it is refused in one
/// line, before the twin starts or any file is made.
#[test]
fn a_real_loggers_name_on_the_twin_is_refused() {
    let out = std::env::temp_dir().join("railtrace-options-twin-logger.arrow");
    let o = railtrace(&["profile", "-o", out.to_str().unwrap(), "--logger", "nvml"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("--logger nvml: the twin's GPU has its own logger"),
        "{err}"
    );
    assert!(!out.exists());
}

/// Runs railtrace with `args`, at most 10 s (a command that waits on a pipe for ever is
/// killed and fails the test): its output.
fn soon(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_railtrace"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{args:?} did not end within 10 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Every file a user names is read as a regular file, with a size bound where its format
/// has one: a device that never ends, a pipe no one writes to, a folder or a huge sparse
/// file each get a one-line error at once.
#[test]
fn files_that_are_no_regular_file_or_too_large_are_refused_at_once() {
    let dir = std::env::temp_dir().join(format!("railtrace-options-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("pipe");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let sparse = dir.join("sparse.toml");
    std::fs::File::create(&sparse)
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    let out = dir.join("out.arrow");
    let (f, s, d, o) = (
        fifo.to_str().unwrap(),
        sparse.to_str().unwrap(),
        dir.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    for (args, says) in [
        (vec!["capture", "--port", f, "-o", o], "not a serial port"),
        (vec!["capture", "--port", d, "-o", o], "not a serial port"),
        (vec!["inspect", f], "not a regular file"),
        (vec!["inspect", "/dev/zero"], "not a regular file"),
        (vec!["inspect", d], "not a regular file"),
        (vec!["view", f, "--seconds", "1"], "not a regular file"),
        (
            vec!["capture", "--port", "/dev/null", "--rig", f, "-o", o],
            "not a regular file",
        ),
        (
            vec!["capture", "--port", "/dev/null", "--rig", s, "-o", o],
            "larger than",
        ),
        (
            vec!["correct", "x.arrow", "--logger", "/dev/zero"],
            "not a regular file",
        ),
        (vec!["correct", "x.arrow", "--logger", s], "larger than"),
        (
            vec!["plot", "x.arrow", "-o", "x.svg", "--logger", f],
            "not a regular file",
        ),
    ] {
        let o = soon(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
    assert!(!out.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
