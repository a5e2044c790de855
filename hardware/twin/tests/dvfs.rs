//! The GPU's power model, thermal model and DVFS switching (`[gpu.power_model]`,
//! `[gpu.thermal]`, `gpu.dvfs_switch_latency_s`, `Twin::request_dvfs`) against slow,
//! obviously correct references, and the promise that scenarios without them run exactly
//! as before.
//!
//! Tolerances, and why:
//! - Bit-identity (old scenarios): hashes of the first 100 000 segments and of every
//!   execution record, taken with the code as it was before these models existed, and
//!   every segment's power and every phase's length recomputed with the old formulas
//!   compared with `==`.
//! - The power model by hand: the same products and sums in another order (`k_m * u_m *
//!   f * V^2` with `k_m = w_m / (f0 V0^2)`, against the twin's `w_m * u_m * s` with a
//!   precomputed `s`): a few ulps, so 1e-12 relative.
//! - Temperature, fixed input: each segment's power is held constant, so the exact
//!   solution is an exponential; a classical RK4 with steps of at most 50 µs against
//!   tau = 3 s has a local error of ~(h/tau)^5 / 120 ~ 1e-26 of the swing and a global
//!   one far below rounding; what remains is rounding over ~1e5 steps of a ~60 °C value
//!   (~1e-11 °C). We assert 1e-7 °C.
//! - Temperature, coupled ODE: the twin holds the leakage at each segment's starting
//!   temperature, the reference lets it follow T. With `L'` the largest slope of the
//!   leakage in T, `D` the largest |dT/dt| and `s` the longest segment, the error `e`
//!   obeys `tau e' <= R L' D s - (1 - R L') |e|`, so `|e| <= R L' D s / (1 - R L')`. The
//!   test computes that bound from the run itself and asserts it (plus 1e-7 °C for the
//!   RK4 reference).
//! - DVFS timing: `effective = request + latency` is asserted with `==` on the same f64
//!   arithmetic; a switch inside a phase conserves the phase's work to 1e-9.

use std::sync::{Arc, Mutex};

use railtrace_twin::gpu::{
    DvfsSwitch, Execution, Gpu, HostDvfsRequest, HostLaunch, HostLaunches, SegmentState, Step,
    SwitchCause, CURRENT_DVFS_LEVEL,
};
use railtrace_twin::scenario::{parse, DEFAULT_RIG, DEFAULT_SCENARIO};
use railtrace_twin::trace::{Segment, Util};
use railtrace_twin::Loaded;

fn scenarios_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios")
}

fn load(name: &str) -> Loaded {
    railtrace_twin::load_scenario(&scenarios_dir().join(format!("{name}.toml")))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn dvfs_text() -> String {
    std::fs::read_to_string(scenarios_dir().join("dvfs.toml")).unwrap()
}

fn gpu_of(l: &Loaded) -> Gpu {
    let s = &l.scenario;
    Gpu::new(s.gpu.clone(), s.kernels.clone(), s.workload.clone(), s.seed).unwrap()
}

/// Segments with their states up to true time `until_s`, and the executions and DVFS
/// switches behind them. The segments of an execution whose end has not been reached
/// are left out, so that every segment is either idle or in a recorded execution.
fn run_until(
    gpu: &mut Gpu,
    until_s: f64,
) -> (
    Vec<(Segment, SegmentState)>,
    Vec<Execution>,
    Vec<DvfsSwitch>,
) {
    let (mut segs, mut execs, mut switches) = (Vec::new(), Vec::new(), Vec::new());
    let mut complete = 0;
    while gpu.now_s() < until_s {
        let (seg, state) = gpu.next_segment_with_state();
        execs.extend(gpu.drain_executions());
        switches.extend(gpu.drain_dvfs_switches());
        segs.push((seg, state));
        if seg.util == gpu.config().idle_util || execs.last().is_some_and(|e| e.end_s == seg.end_s)
        {
            complete = segs.len();
        }
    }
    segs.truncate(complete);
    (segs, execs, switches)
}

// ------------------------------------------------------------- bit-identity ----

fn fnv(h: &mut u64, x: u64) {
    for b in x.to_le_bytes() {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(0x100_0000_01b3);
    }
}

/// FNV-1a of the first `n` segments and of the executions behind them, and the end of
/// the last segment.
fn hash_run(gpu: &mut Gpu, n: usize) -> (u64, u64, f64) {
    let mut hs = 0xcbf2_9ce4_8422_2325u64;
    let mut he = 0xcbf2_9ce4_8422_2325u64;
    let mut last = 0.0;
    for _ in 0..n {
        let s = gpu.next_segment();
        for v in [
            s.start_s,
            s.end_s,
            s.power_w,
            s.util.compute,
            s.util.memory,
            s.util.other,
        ] {
            fnv(&mut hs, v.to_bits());
        }
        last = s.end_s;
        for e in gpu.drain_executions() {
            for v in [
                e.launch_s,
                e.start_s,
                e.end_s,
                e.time_factor,
                e.power_factor,
                e.energy_j,
            ] {
                fnv(&mut he, v.to_bits());
            }
            for v in &e.phase_bounds_s {
                fnv(&mut he, v.to_bits());
            }
            fnv(&mut he, e.kernel as u64);
            fnv(&mut he, e.train);
            fnv(&mut he, u64::from(e.index_in_train));
            fnv(&mut he, e.dvfs_level as u64);
            fnv(&mut he, e.mode as u64);
            fnv(&mut he, u64::from(e.outlier));
        }
    }
    (hs, he, last)
}

fn mixed_levels_workload() -> Vec<Step> {
    let at = |count, min_delay_s, max_delay_s, dvfs: Option<&str>| Step::Launch {
        kernel: "gemm".into(),
        count,
        min_delay_s,
        max_delay_s,
        dvfs: dvfs.map(Into::into),
    };
    vec![
        at(5, 0.1e-3, 0.3e-3, Some("mid")),
        Step::Idle { duration_s: 2e-3 },
        at(3, 0.0, 0.2e-3, None),
        at(4, 0.0, 0.0, Some("low")),
        at(2, 0.0, 0.0, Some("low")),
    ]
}

fn host_driven(gpu: &mut Gpu) {
    let host = Arc::new(Mutex::new(HostLaunches::default()));
    {
        let mut h = host.lock().unwrap();
        h.active = true;
        for i in 0..200u32 {
            h.queue.push_back(HostLaunch {
                at_s: 0.05 + f64::from(i) * 7.3e-3,
                kernel: 0,
                count: 1 + i % 5,
                dvfs: (i % 3) as usize,
            });
        }
    }
    gpu.set_host_launches(host);
}

#[test]
fn scenarios_without_the_new_sections_give_the_same_timeline_as_before() {
    // Taken with the twin before the power model, thermal model and DVFS switching
    // existed (same code: `hash_run`).
    let golden = [
        (
            "default",
            (9382052358517945957, 5274018002056238543, 16.41296201383592),
        ),
        (
            "a100-partial-window",
            (
                16897233005768755717,
                6082980155797529663,
                415.04711014068977,
            ),
        ),
        (
            "faulty-link",
            (9382052358517945957, 5274018002056238543, 16.41296201383592),
        ),
    ];
    for (name, want) in golden {
        let mut gpu = gpu_of(&load(name));
        assert_eq!(hash_run(&mut gpu, 100_000), want, "{name}");
    }
    let s = railtrace_twin::default_scenario().scenario;
    let mut workload = s.workload.clone();
    workload.steps = mixed_levels_workload();
    let mut gpu = Gpu::new(s.gpu.clone(), s.kernels.clone(), workload, 7).unwrap();
    assert_eq!(
        hash_run(&mut gpu, 100_000),
        (2996788682392609908, 7190330088252273541, 13.454742405302015),
        "a workload mixing DVFS levels"
    );
    let mut gpu = Gpu::new(s.gpu.clone(), s.kernels.clone(), s.workload.clone(), 3).unwrap();
    host_driven(&mut gpu);
    assert_eq!(
        hash_run(&mut gpu, 100_000),
        (18268065180960726808, 5340484771268410648, 6.404021237530156),
        "host launches at explicit levels"
    );
}

#[test]
fn without_a_power_model_every_segment_has_the_old_power_and_length() {
    let s = railtrace_twin::default_scenario().scenario;
    let mut workload = s.workload.clone();
    workload.steps = mixed_levels_workload();
    let mut gpu = Gpu::new(s.gpu.clone(), s.kernels.clone(), workload, 11).unwrap();
    let scales = gpu.dvfs_scales().to_vec();
    let idle = s.gpu.idle_power_w;
    let (segs, execs, switches) = run_until(&mut gpu, 2.0);
    assert!(execs.len() > 1000);
    assert!(execs.iter().any(|e| e.dvfs_level == 1) && execs.iter().any(|e| e.dvfs_level == 2));
    // Every change of level is a launch's, at once (no latency).
    assert!(!switches.is_empty());
    for w in &switches {
        assert_eq!(w.cause, SwitchCause::Launch);
        assert_eq!(w.request_s, w.effective_s);
        assert_ne!(w.from, w.to);
    }
    let mut e = 0;
    let mut checked = 0;
    for (seg, state) in &segs {
        assert_eq!(state.temperature_c, None);
        while e < execs.len() && execs[e].end_s <= seg.start_s {
            e += 1;
        }
        let inside = e < execs.len() && execs[e].start_s <= seg.start_s;
        if !inside {
            assert_eq!(seg.power_w, idle, "idle at {}", seg.start_s);
            continue;
        }
        let x = &execs[e];
        assert_eq!(state.dvfs_level, x.dvfs_level);
        let j = x
            .phase_bounds_s
            .windows(2)
            .position(|b| b[0] == seg.start_s)
            .expect("one segment per phase");
        let p = &s.kernels[x.kernel].phases[j];
        let (time_scale, power_scale) = scales[x.dvfs_level];
        let want = (idle + (p.power_w - idle) * power_scale * x.power_factor).max(0.0);
        assert_eq!(seg.power_w, want);
        let busy = p.util.compute + p.util.memory;
        let c = if busy > 0.0 {
            p.util.compute / busy
        } else {
            1.0
        };
        let duration = p.duration_s * (c * time_scale + (1.0 - c)) * x.time_factor;
        assert_eq!(seg.end_s, seg.start_s + duration);
        assert_eq!(x.phase_bounds_s[j + 1], seg.end_s);
        checked += 1;
    }
    assert!(checked > 2000);
}

// -------------------------------------------------------------- power model ----

/// The power model written out by hand from the documented formula.
fn by_hand(l: &Loaded, util: &Util, state: &SegmentState, power_factor: f64) -> f64 {
    let m = l.scenario.gpu.power_model.as_ref().unwrap();
    let r = &l.scenario.gpu.dvfs[0];
    let (f, v) = (state.frequency_hz.unwrap(), state.voltage_v.unwrap());
    let t = state.temperature_c.unwrap();
    let f0v02 = r.frequency_hz * r.voltage_v * r.voltage_v;
    let k = |w: f64| w / f0v02;
    let dynamic = k(m.compute_w) * util.compute * f * v * v
        + k(m.memory_w) * util.memory * f * v * v
        + k(m.other_w) * util.other * f * v * v;
    m.static_w
        + k(m.clock_w) * f * v * v
        + power_factor * dynamic
        + m.leak_w * (v / r.voltage_v) * (m.leak_per_c * (t - m.t_ref_c)).exp()
}

#[test]
fn with_a_power_model_every_segment_has_the_formulas_power() {
    let l = load("dvfs");
    let mut gpu = gpu_of(&l);
    // The first sweep: every kernel at every level, with switches between them.
    let (segs, execs, switches) = run_until(&mut gpu, 0.12);
    let g = &l.scenario.gpu;
    let mut seen = [[false; 4]; 3];
    let mut e = 0;
    let (mut idle, mut busy) = (0, 0);
    for (seg, state) in &segs {
        let level = &g.dvfs[state.dvfs_level];
        assert_eq!(state.frequency_hz, Some(level.frequency_hz));
        assert_eq!(state.voltage_v, Some(level.voltage_v));
        while e < execs.len() && execs[e].end_s <= seg.start_s {
            e += 1;
        }
        let inside = e < execs.len() && execs[e].start_s <= seg.start_s;
        let (util, pf) = if inside {
            seen[state.dvfs_level][execs[e].kernel] = true;
            busy += 1;
            (seg.util, execs[e].power_factor)
        } else {
            idle += 1;
            assert_eq!(seg.util, g.idle_util);
            (g.idle_util, 1.0)
        };
        let want = by_hand(&l, &util, state, pf);
        assert!(
            (seg.power_w - want).abs() <= 1e-12 * want,
            "at {}: {} vs {want}",
            seg.start_s,
            seg.power_w
        );
        let model = gpu
            .model_power_w(&util, state.dvfs_level, state.temperature_c.unwrap(), pf)
            .unwrap();
        assert_eq!(seg.power_w, model);
    }
    assert!(idle > 20 && busy > 500, "{idle} idle, {busy} busy segments");
    assert_eq!(seen, [[true; 4]; 3], "every kernel at every level");
    // Every train at another level asked for its switch at its launch and waited for it.
    assert!(switches.len() >= 2);
    for w in &switches {
        assert_eq!(w.cause, SwitchCause::Launch);
        assert_eq!(w.effective_s, w.request_s + g.dvfs_switch_latency_s);
        let first = execs.iter().find(|x| x.launch_s == w.request_s).unwrap();
        assert_eq!(first.start_s, w.effective_s);
        assert_eq!(first.dvfs_level, w.to);
    }
}

#[test]
fn without_a_thermal_model_the_leakage_is_taken_at_t_ref() {
    let mut l = load("dvfs");
    l.scenario.gpu.thermal = None;
    let mut gpu = gpu_of(&l);
    let (segs, _, _) = run_until(&mut gpu, 0.05);
    let m = l.scenario.gpu.power_model.clone().unwrap();
    for (seg, state) in &segs {
        assert_eq!(state.temperature_c, Some(m.t_ref_c));
        // No pieces cut for the thermal model: idle stretches stay whole.
        assert!(seg.duration_s() < 2.1e-3);
    }
    let idle = segs[0].0.power_w;
    assert!((idle - (m.static_w + m.clock_w + m.leak_w)).abs() < 1e-12 * idle);
}

// ------------------------------------------------------------------ thermal ----

/// One classical RK4 step of `tau T' = rhs(T)`.
fn rk4(t: f64, h: f64, tau: f64, rhs: impl Fn(f64) -> f64) -> f64 {
    let d = |x: f64| rhs(x) / tau;
    let k1 = d(t);
    let k2 = d(t + 0.5 * h * k1);
    let k3 = d(t + 0.5 * h * k2);
    let k4 = d(t + h * k3);
    t + h / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
}

#[test]
fn the_temperature_follows_the_thermal_ode() {
    let l = load("dvfs");
    let g = &l.scenario.gpu;
    let th = g.thermal.clone().unwrap();
    let m = g.power_model.clone().unwrap();
    let v0 = g.dvfs[0].voltage_v;
    let leak = |v: f64, t: f64| m.leak_w * (v / v0) * (m.leak_per_c * (t - m.t_ref_c)).exp();
    let mut gpu = gpu_of(&l);
    // The cold sweep and most of the ~4.1 s of gemm at high.
    let (segs, _, _) = run_until(&mut gpu, 4.0);
    let t0 = segs[0].1.temperature_c.unwrap();
    assert_eq!(t0, th.initial_c.unwrap());
    let h = 50e-6;
    // (1) The segments' powers as given: the exact solution, by RK4.
    // (2) The leakage following T within each segment (the physical ODE).
    let (mut fixed, mut coupled) = (t0, t0);
    let (mut worst_fixed, mut worst_coupled) = (0.0f64, 0.0f64);
    let (mut slope_leak, mut rate, mut longest) = (0.0f64, 0.0f64, 0.0f64);
    for (i, (seg, state)) in segs.iter().enumerate() {
        let twin = state.temperature_c.unwrap();
        worst_fixed = worst_fixed.max((twin - fixed).abs());
        worst_coupled = worst_coupled.max((twin - coupled).abs());
        let v = state.voltage_v.unwrap();
        let rest = seg.power_w - leak(v, twin);
        let n = (seg.duration_s() / h).ceil().max(1.0);
        let step = seg.duration_s() / n;
        for _ in 0..n as usize {
            fixed = rk4(fixed, step, th.tau_s, |t| {
                th.ambient_c + th.r_c_per_w * seg.power_w - t
            });
            coupled = rk4(coupled, step, th.tau_s, |t| {
                th.ambient_c + th.r_c_per_w * (rest + leak(v, t)) - t
            });
        }
        let next = segs
            .get(i + 1)
            .map_or(twin, |(_, s)| s.temperature_c.unwrap());
        slope_leak = slope_leak.max(leak(v, twin.max(next)) * m.leak_per_c);
        rate = rate.max((th.ambient_c + th.r_c_per_w * seg.power_w - twin).abs() / th.tau_s);
        longest = longest.max(seg.duration_s());
    }
    // Measured: ~4e-12 °C (fixed input), ~5e-6 °C (coupled) against a bound of ~1.2e-4 °C.
    assert!(longest <= th.max_step_s * (1.0 + 1e-9));
    assert!(
        worst_fixed < 1e-7,
        "{worst_fixed} °C against the fixed-input ODE"
    );
    let loop_gain = th.r_c_per_w * slope_leak;
    assert!(loop_gain < 0.5);
    let bound = th.r_c_per_w * slope_leak * rate * longest / (1.0 - loop_gain) + 1e-7;
    assert!(
        worst_coupled <= bound,
        "{worst_coupled} °C against the coupled ODE, bound {bound} °C"
    );
    // The die heats visibly under sustained load: by ~17 °C in 3.9 s (1 - exp(-1.3) of
    // the ~23 °C between idle and gemm), towards ~30 °C above ambient when settled.
    let last = segs.last().unwrap().1.temperature_c.unwrap();
    assert!(last - t0 > 12.0, "from {t0} to {last} °C");
    let recent: Vec<&Segment> = segs
        .iter()
        .map(|(s, _)| s)
        .filter(|s| s.start_s > 3.99)
        .collect();
    let mean_w = recent.iter().map(|s| s.energy_j()).sum::<f64>()
        / recent.iter().map(|s| s.duration_s()).sum::<f64>();
    let rise = th.r_c_per_w * mean_w;
    assert!(
        (20.0..=40.0).contains(&rise),
        "{rise} °C above ambient at {mean_w} W"
    );
}

// --------------------------------------------------------------------- DVFS ----

#[test]
fn a_dvfs_request_takes_effect_exactly_the_latency_later() {
    let l = load("dvfs");
    let g = &l.scenario.gpu;
    let latency = g.dvfs_switch_latency_s;
    assert_eq!(latency, 1e-3);
    let mut gpu = gpu_of(&l);
    let (gemm, stream) = (
        gpu.kernel_index("gemm").unwrap(),
        gpu.kernel_index("stream").unwrap(),
    );
    let host = Arc::new(Mutex::new(HostLaunches::default()));
    {
        let mut h = host.lock().unwrap();
        h.active = true;
        for (at_s, level) in [(0.010, 2), (0.0205, 0)] {
            h.dvfs_requests.push_back(HostDvfsRequest { at_s, level });
        }
        for (at_s, kernel, count, dvfs) in [
            (0.020, gemm, 50, CURRENT_DVFS_LEVEL),
            (0.060, stream, 5, 1),
            (0.080, stream, 2, 1),
        ] {
            h.queue.push_back(HostLaunch {
                at_s,
                kernel,
                count,
                dvfs,
            });
        }
    }
    gpu.set_host_launches(host);
    assert_eq!(gpu.request_dvfs(0.5, 7), None, "no level 7");
    let (segs, execs, switches) = run_until(&mut gpu, 0.1);
    let want = [
        (0.010, 0, 2, SwitchCause::Request),
        (0.0205, 2, 0, SwitchCause::Request),
        (0.060, 0, 1, SwitchCause::Launch),
    ];
    assert_eq!(switches.len(), want.len(), "{switches:?}");
    for (w, (at, from, to, cause)) in switches.iter().zip(want) {
        assert_eq!(
            *w,
            DvfsSwitch {
                request_s: at,
                effective_s: at + latency,
                from,
                to,
                cause
            }
        );
        // The power and the level change at exactly that instant.
        let i = segs
            .iter()
            .position(|(s, _)| s.start_s == w.effective_s)
            .expect("a segment starts at the switch");
        let (before, after) = (&segs[i - 1], &segs[i]);
        assert_eq!(before.0.end_s, w.effective_s);
        assert_eq!((before.1.dvfs_level, after.1.dvfs_level), (from, to));
        assert!(segs[..i]
            .iter()
            .rev()
            .take_while(|(s, _)| s.start_s >= w.request_s)
            .all(|(_, st)| st.dvfs_level == from));
    }
    // At idle the step is the model's idle power at the two levels.
    let i = segs.iter().position(|(s, _)| s.start_s == 0.011).unwrap();
    for (seg, state) in &segs[i - 1..=i] {
        assert!(seg.util == g.idle_util);
        let want = by_hand(&l, &g.idle_util, state, 1.0);
        assert!((seg.power_w - want).abs() < 1e-12 * want);
    }
    let step = segs[i].0.power_w - segs[i - 1].0.power_w;
    assert!(
        (-30.0..-20.0).contains(&step),
        "high -> low at idle: {step} W"
    );

    // The train launched at 20 ms ran at the current level (low) until 21.5 ms, then at
    // high, the phase under way finishing its work at the new speed.
    let train: Vec<&Execution> = execs.iter().filter(|e| e.launch_s == 0.020).collect();
    assert_eq!(train.len(), 50);
    assert_eq!(train[0].start_s, 0.020 + g.launch_overhead_s);
    assert_eq!(train[0].dvfs_level, 2);
    assert_eq!(train.last().unwrap().dvfs_level, 0);
    let t_sw = 0.0205 + latency;
    let x = train
        .iter()
        .find(|e| e.start_s < t_sw && t_sw < e.end_s)
        .expect("the switch lands inside an execution");
    let j = x
        .phase_bounds_s
        .windows(2)
        .position(|b| b[0] < t_sw && t_sw < b[1])
        .expect("inside a phase");
    let p = &l.scenario.kernels[gemm].phases[j];
    let scales = gpu.dvfs_scales();
    let c = p.util.compute / (p.util.compute + p.util.memory);
    let full = |level: usize| p.duration_s * (c * scales[level].0 + 1.0 - c) * x.time_factor;
    let (a, b) = (x.phase_bounds_s[j], x.phase_bounds_s[j + 1]);
    let work = (t_sw - a) / full(2) + (b - t_sw) / full(0);
    assert!(
        (work - 1.0).abs() < 1e-9,
        "the phase did {work} of its work"
    );

    // The launch at 60 ms named mid: the switch was asked for at the launch and the
    // first execution waited for it; the one at 80 ms found the GPU at mid already.
    let at60: Vec<&Execution> = execs.iter().filter(|e| e.launch_s == 0.060).collect();
    assert_eq!(at60.len(), 5);
    assert_eq!(at60[0].start_s, 0.060 + latency);
    assert!(at60.iter().all(|e| e.dvfs_level == 1));
    let at80: Vec<&Execution> = execs.iter().filter(|e| e.launch_s == 0.080).collect();
    assert_eq!(at80[0].start_s, 0.080 + g.launch_overhead_s);
    assert!(at80.iter().all(|e| e.dvfs_level == 1));
}

#[test]
fn a_request_lands_exactly_during_idle_steps_delays_and_trains() {
    // The scenario's own workload (the host never takes over): the timeline is generated
    // one piece ahead, so a request made at the time reached takes effect exactly the
    // latency later wherever that falls.
    let l = load("dvfs");
    let latency = l.scenario.gpu.dvfs_switch_latency_s;
    let mut gpu = gpu_of(&l);
    let (mut asked, mut segs, mut switches) = (Vec::new(), Vec::new(), Vec::new());
    // In a sweep (random delays, switches of the steps), in the gemm burn, in the 4 s
    // idle, in the attention burn.
    for (at, level) in [
        (0.03, 2),
        (0.05, 1),
        (2.0, 2),
        (2.3, 0),
        (6.0, 0),
        (10.0, 0),
    ] {
        let (s, _, w) = run_until(&mut gpu, at);
        segs.extend(s);
        switches.extend(w);
        let now = gpu.now_s();
        let request_s = now - 0.3 * latency;
        let effective = gpu.request_dvfs(request_s, level).unwrap();
        assert_eq!(effective, request_s + latency, "at {at} s");
        asked.push(request_s);
    }
    let (s, _, w) = run_until(&mut gpu, 10.1);
    segs.extend(s);
    switches.extend(w);
    for request_s in asked {
        let w = switches
            .iter()
            .find(|w| w.request_s == request_s)
            .expect("recorded");
        assert_eq!(w.cause, SwitchCause::Request);
        assert_eq!(w.effective_s, request_s + latency);
        // The level changes at exactly that instant, inside a phase or an idle stretch.
        let i = segs
            .iter()
            .position(|(s, _)| s.start_s == w.effective_s)
            .expect("a segment starts at the switch");
        assert_eq!(segs[i].1.dvfs_level, w.to);
        assert_eq!(segs[i - 1].0.end_s, w.effective_s);
    }
}

#[test]
fn a_request_on_the_running_twin_shows_in_its_truth() {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, UInt32Type};
    use arrow_array::{Array, RecordBatch};

    let mut l = load("dvfs");
    l.scenario.workload.steps = vec![Step::Idle { duration_s: 0.1e-3 }];
    let dir = std::env::temp_dir().join(format!("railtrace-dvfs-{}", std::process::id()));
    let twin = railtrace_twin::Twin::start_with(&l, Some(&dir)).unwrap();
    assert_eq!(twin.dvfs_levels(), ["high", "mid", "low"]);
    let err = twin.request_dvfs("turbo").unwrap_err();
    assert!(err.to_string().contains("high, mid, low"), "{err}");
    let pause = || std::thread::sleep(std::time::Duration::from_millis(60));
    pause();
    let at_low = twin.request_dvfs("low").unwrap();
    pause();
    let at_mid = twin.request_dvfs("mid").unwrap();
    pause();
    let at_launch = twin.launch("gemm", 5, None).unwrap();
    pause();
    let outputs = twin.take_outputs();
    twin.stop().unwrap();

    let read = |name: &str| -> Vec<RecordBatch> {
        let file = std::fs::File::open(dir.join(name)).unwrap();
        arrow_ipc::reader::StreamReader::try_new(file, None)
            .unwrap()
            .map(|b| b.unwrap())
            .collect()
    };
    let f64s = |b: &[RecordBatch], c: &str| -> Vec<Option<f64>> {
        b.iter()
            .flat_map(|b| {
                let a = b.column_by_name(c).unwrap().as_primitive::<Float64Type>();
                (0..a.len())
                    .map(|i| (!a.is_null(i)).then(|| a.value(i)))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let u32s = |b: &[RecordBatch], c: &str| -> Vec<u32> {
        b.iter()
            .flat_map(|b| {
                b.column_by_name(c)
                    .unwrap()
                    .as_primitive::<UInt32Type>()
                    .values()
                    .to_vec()
            })
            .collect()
    };
    let strs = |b: &[RecordBatch], c: &str| -> Vec<String> {
        b.iter()
            .flat_map(|b| {
                let a = b.column_by_name(c).unwrap().as_string::<i32>();
                (0..a.len())
                    .map(|i| a.value(i).to_string())
                    .collect::<Vec<_>>()
            })
            .collect()
    };

    let d = read("dvfs.arrow");
    let (req, eff) = (f64s(&d, "request_s"), f64s(&d, "effective_s"));
    assert_eq!(req, [Some(at_low), Some(at_mid)]);
    assert_eq!(eff, [Some(at_low + 1e-3), Some(at_mid + 1e-3)]);
    assert_eq!(strs(&d, "from"), ["high", "low"]);
    assert_eq!(strs(&d, "to"), ["low", "mid"]);
    assert_eq!(u32s(&d, "to_level"), [2, 1]);
    assert_eq!(strs(&d, "cause"), ["request", "request"]);
    assert_eq!(outputs.dvfs_switches.len(), 2);

    let g = read("gpu_power.arrow");
    let starts = f64s(&g, "start_s");
    let powers = f64s(&g, "power_w");
    let levels = u32s(&g, "dvfs_level");
    let temps = f64s(&g, "temperature_c");
    let freqs = f64s(&g, "frequency_hz");
    assert!(temps.iter().all(Option::is_some) && freqs.iter().all(Option::is_some));
    for (at, from, to) in [(at_low, 0, 2), (at_mid, 2, 1)] {
        let i = starts
            .iter()
            .position(|s| *s == Some(at + 1e-3))
            .expect("a segment starts at the switch");
        assert_eq!((levels[i - 1], levels[i]), (from, to));
        let state = |k: usize| SegmentState {
            dvfs_level: levels[k] as usize,
            frequency_hz: freqs[k],
            voltage_v: f64s(&g, "voltage_v")[k],
            temperature_c: temps[k],
        };
        for k in [i - 1, i] {
            let want = by_hand(&l, &Util::IDLE, &state(k), 1.0);
            let got = powers[k].unwrap();
            assert!((got - want).abs() < 1e-12 * want, "{got} vs {want}");
        }
    }
    // The launch without a level ran at the level in effect: mid.
    let e = read("executions.arrow");
    let launches = f64s(&e, "launch_s");
    let exec_levels = u32s(&e, "dvfs_level");
    let ours: Vec<u32> = launches
        .iter()
        .zip(&exec_levels)
        .filter(|(l, _)| l.is_some_and(|l| l >= at_launch))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(ours, [1; 5]);
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------------------------- errors ----

fn broken(text: &str, from: &str, to: &str) -> railtrace_twin::ScenarioError {
    assert!(text.contains(from), "{from}");
    let text = text.replacen(from, to, 1);
    parse("s.toml", &text, |_| {
        Ok(("rig.toml".into(), DEFAULT_RIG.into()))
    })
    .unwrap_err()
}

/// The line of the first line of `text` that starts with `start`.
fn line_of(text: &str, start: &str) -> usize {
    text.lines().position(|l| l.starts_with(start)).unwrap() + 1
}

#[test]
fn bad_values_are_refused_with_the_field_named() {
    let d = dvfs_text();
    for (from, to, field, says) in [
        (
            "compute_w = 430.0",
            "compute_w = -1.0",
            "gpu.power_model.compute_w",
            ">= 0",
        ),
        (
            "leak_per_c = 0.015",
            "leak_per_c = 2.0",
            "gpu.power_model.leak_per_c",
            "0 to 1",
        ),
        (
            "static_w = 85.0",
            "static_w = nan",
            "gpu.power_model.static_w",
            "finite",
        ),
        ("tau_s = 3.0", "tau_s = 0.0", "gpu.thermal.tau_s", "> 0"),
        (
            "r_c_per_w = 0.05",
            "r_c_per_w = -0.05",
            "gpu.thermal.r_c_per_w",
            ">= 0",
        ),
        (
            "max_step_s = 0.5e-3",
            "max_step_s = 0.0",
            "gpu.thermal.max_step_s",
            "> 0",
        ),
        (
            "initial_c = 42.0",
            "initial_c = -300.0",
            "gpu.thermal.initial_c",
            "-273.15",
        ),
        (
            "dvfs_switch_latency_s = 1e-3",
            "dvfs_switch_latency_s = -1e-3",
            "gpu.dvfs_switch_latency_s",
            ">= 0",
        ),
        (
            "launch_overhead_s = 5e-6",
            "idle_power_w = 140.0\nlaunch_overhead_s = 5e-6",
            "gpu.idle_power_w",
            "does not apply with [gpu.power_model]",
        ),
        (
            "duration_s = 150e-6",
            "duration_s = 150e-6\npower_w = 600.0",
            "kernels[0].phases[0].power_w",
            "does not apply with [gpu.power_model]",
        ),
        (
            "voltage_v = 0.85",
            "voltage_v = 0.85\npower_scale = 0.6",
            "gpu.dvfs[1].power_scale",
            "does not apply with [gpu.power_model]",
        ),
    ] {
        let e = broken(&d, from, to);
        assert_eq!(e.field, field, "{e}");
        assert!(e.message.contains(says), "{e}");
        assert!(
            e.message.contains(field),
            "the message names the field: {e}"
        );
        let key = field.rsplit('.').next().unwrap();
        let key = key.split('[').next().unwrap();
        if d.lines().any(|l| l.starts_with(&format!("{key} ="))) && !field.starts_with("kernels") {
            assert_eq!(e.line, Some(line_of(&d, &format!("{key} ="))), "{e}");
        }
    }
    // A power model without levels; a missing or unknown key.
    let without: String = {
        let start = d.find("[[gpu.dvfs]]").unwrap();
        let end = d.find("# P = static_w").unwrap();
        format!("{}{}", &d[..start], &d[end..])
    };
    let e = parse("s.toml", &without, |_| Ok(("r".into(), DEFAULT_RIG.into()))).unwrap_err();
    assert_eq!(e.field, "gpu.dvfs", "{e}");
    assert!(e.message.contains("at least one [[gpu.dvfs]]"), "{e}");
    let e = broken(&d, "static_w = 85.0\n", "");
    assert_eq!(e.field, "gpu.power_model", "{e}");
    assert!(e.message.contains("missing field `static_w`"), "{e}");
    let e = broken(&d, "tau_s = 3.0", "tau = 3.0");
    assert_eq!(e.field, "gpu.thermal.tau", "{e}");
    assert!(e.message.contains("unknown field"), "{e}");

    // The old power path needs its powers.
    let e = broken(DEFAULT_SCENARIO, "idle_power_w = 140.0\n", "");
    assert_eq!(e.field, "gpu.idle_power_w", "{e}");
    assert!(
        e.message.contains("required without [gpu.power_model]"),
        "{e}"
    );
    let e = broken(DEFAULT_SCENARIO, "power_w = 620.0\n", "");
    assert_eq!(e.field, "kernels[0].phases[0].power_w", "{e}");
    assert!(
        e.message.contains("required without [gpu.power_model]"),
        "{e}"
    );
    // A thermal model alone is fine: it follows the phases' power_w.
    let with_thermal = DEFAULT_SCENARIO.replacen(
        "[gpu.clock]",
        "[gpu.thermal]\nambient_c = 30.0\nr_c_per_w = 0.05\ntau_s = 2.0\n\n[gpu.clock]",
        1,
    );
    let l = parse("s.toml", &with_thermal, |_| {
        Ok(("r".into(), DEFAULT_RIG.into()))
    })
    .unwrap();
    let mut gpu = gpu_of(&l);
    let (segs, _, _) = run_until(&mut gpu, 0.05);
    assert_eq!(segs[0].1.temperature_c, Some(30.0));
    assert!(segs.last().unwrap().1.temperature_c.unwrap() > 30.0);
    assert!(segs
        .iter()
        .all(|(s, _)| s.duration_s() <= 1e-3 * (1.0 + 1e-9)));
}
