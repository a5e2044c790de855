//! The interrupt side: one conversion per sample-timer tick, averaged by N, handed to the
//! main loop through a fixed-capacity lock-free queue; trigger edges likewise. Every
//! sample or edge that cannot be handed over is counted, never dropped silently.

use core::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicUsize, Ordering};

use heapless::spsc::{Consumer, Producer};

use crate::hw::{SampleSource, CHANNELS};

/// Trigger input lines the core handles.
pub const TRIGGER_INPUTS: usize = 4;
/// Largest on-device averaging factor accepted (keeps the i32 sums far from overflow).
pub const MAX_AVERAGING: u16 = 1024;

/// One sample of all channels, after averaging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Index since Start (counts every sample produced, sent or dropped).
    pub index: u64,
    /// Device tick of the sample's first conversion.
    pub tick: u64,
    /// Codes of all channels (the main loop keeps the enabled ones).
    pub codes: [i16; CHANNELS],
}

/// A trigger input edge as captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    /// Input line, `0..TRIGGER_INPUTS`.
    pub line: u8,
    /// Rising or falling.
    pub rising: bool,
    /// Edges on this line since Start, this one included.
    pub count: u32,
    /// Capture tick.
    pub tick: u64,
}

/// State shared between the interrupts and the main loop: run control written by the main
/// loop, counters written by the interrupts (each counter has a single writer and wraps;
/// the main loop extends them to 64 bits).
#[derive(Debug, Default)]
pub struct Shared {
    running: AtomicBool,
    generation: AtomicU32,
    averaging: AtomicU16,
    pub(crate) produced: AtomicU32,
    pub(crate) dropped_queue_full: AtomicU32,
    pub(crate) dropped_adc: AtomicU32,
    pub(crate) edges_dropped: AtomicU32,
    pub(crate) high_water: AtomicUsize,
}

impl Shared {
    /// All zero, not running.
    pub const fn new() -> Self {
        Shared {
            running: AtomicBool::new(false),
            generation: AtomicU32::new(0),
            averaging: AtomicU16::new(1),
            produced: AtomicU32::new(0),
            dropped_queue_full: AtomicU32::new(0),
            dropped_adc: AtomicU32::new(0),
            edges_dropped: AtomicU32::new(0),
            high_water: AtomicUsize::new(0),
        }
    }

    /// Starts a new run: sample indices and edge counts restart at 0.
    pub(crate) fn start(&self, averaging: u16) {
        self.averaging.store(averaging.max(1), Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::Release);
        self.running.store(true, Ordering::Release);
    }

    pub(crate) fn stop(&self) {
        self.running.store(false, Ordering::Release);
    }

    /// True between Start and Stop.
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }
}

/// The sample-timer interrupt's state. Call [`Sampler::on_tick`] from the interrupt.
pub struct Sampler<'a, S, const Q: usize> {
    source: S,
    out: Producer<'a, Sample, Q>,
    shared: &'a Shared,
    generation: u32,
    index: u64,
    sums: [i32; CHANNELS],
    count: u16,
    first_tick: u64,
    failed: bool,
}

impl<'a, S: SampleSource, const Q: usize> Sampler<'a, S, Q> {
    /// A sampler converting with `source` into the queue behind `out`.
    pub fn new(source: S, out: Producer<'a, Sample, Q>, shared: &'a Shared) -> Self {
        Sampler {
            source,
            out,
            shared,
            generation: shared.generation.load(Ordering::Acquire),
            index: 0,
            sums: [0; CHANNELS],
            count: 0,
            first_tick: 0,
            failed: false,
        }
    }

    /// The sample source, e.g. to inspect a simulated ADC.
    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    /// One tick of the sample timer at device tick `tick`: one conversion, and every N-th
    /// tick one sample queued (or counted as dropped). Bounded work: one conversion, a
    /// loop over 8 channels, one queue push.
    pub fn on_tick(&mut self, tick: u64) {
        let shared = self.shared;
        if !shared.running.load(Ordering::Acquire) {
            return;
        }
        let generation = shared.generation.load(Ordering::Acquire);
        if generation != self.generation {
            self.generation = generation;
            self.index = 0;
            self.count = 0;
            self.source.restart();
        }
        if self.count == 0 {
            self.first_tick = tick;
            self.sums = [0; CHANNELS];
            self.failed = false;
        }
        match self.source.convert() {
            Ok(codes) => {
                for (sum, code) in self.sums.iter_mut().zip(codes) {
                    *sum += i32::from(code);
                }
            }
            Err(_) => self.failed = true,
        }
        self.count += 1;
        let n = shared.averaging.load(Ordering::Relaxed).max(1);
        if self.count < n {
            return;
        }
        let sample = Sample {
            index: self.index,
            tick: self.first_tick,
            codes: if n == 1 {
                self.sums.map(|s| s as i16) // one conversion: the sum is the code
            } else {
                self.sums.map(|s| mean_rounded(s, n))
            },
        };
        self.index += 1;
        self.count = 0;
        shared.produced.fetch_add(1, Ordering::Relaxed);
        if self.failed {
            shared.dropped_adc.fetch_add(1, Ordering::Relaxed);
        } else if self.out.enqueue(sample).is_ok() {
            shared
                .high_water
                .fetch_max(self.out.len(), Ordering::Relaxed);
        } else {
            shared.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `sum / n` rounded to nearest, ties away from zero (SPEC.md §4.2).
pub fn mean_rounded(sum: i32, n: u16) -> i16 {
    let n = i32::from(n.max(1));
    let half = n / 2;
    let q = if sum >= 0 {
        (sum + half) / n
    } else {
        (sum - half) / n
    };
    q.clamp(i32::from(i16::MIN), i32::from(i16::MAX)) as i16
}

/// The trigger-capture interrupt's state. Call [`EdgeCapture::on_edge`] from the timer's
/// input-capture interrupt.
pub struct EdgeCapture<'a, const E: usize> {
    out: Producer<'a, Edge, E>,
    shared: &'a Shared,
    generation: u32,
    counts: [u32; TRIGGER_INPUTS],
}

impl<'a, const E: usize> EdgeCapture<'a, E> {
    /// A capture feeding the queue behind `out`.
    pub fn new(out: Producer<'a, Edge, E>, shared: &'a Shared) -> Self {
        EdgeCapture {
            out,
            shared,
            generation: shared.generation.load(Ordering::Acquire),
            counts: [0; TRIGGER_INPUTS],
        }
    }

    /// An edge on input `line` captured at `tick`.
    pub fn on_edge(&mut self, line: u8, rising: bool, tick: u64) {
        let Some(count) = self.count(line) else {
            // A line the core has no counter for is a board wiring error: count it lost.
            self.shared.edges_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        *count = count.wrapping_add(1);
        let edge = Edge {
            line,
            rising,
            count: *count,
            tick,
        };
        if self.out.enqueue(edge).is_err() {
            self.shared.edges_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An edge on input `line` that the hardware lost (an input capture overwritten
    /// before it was read): counted in the line's edge count and as dropped.
    pub fn lost(&mut self, line: u8) {
        if let Some(count) = self.count(line) {
            *count = count.wrapping_add(1);
        }
        self.shared.edges_dropped.fetch_add(1, Ordering::Relaxed);
    }

    fn count(&mut self, line: u8) -> Option<&mut u32> {
        let generation = self.shared.generation.load(Ordering::Acquire);
        if generation != self.generation {
            self.generation = generation;
            self.counts = [0; TRIGGER_INPUTS];
        }
        self.counts.get_mut(usize::from(line))
    }
}

/// The main loop's ends of the two queues.
pub struct Queues<'a, const Q: usize, const E: usize> {
    /// Samples from the sample-timer interrupt.
    pub samples: Consumer<'a, Sample, Q>,
    /// Edges from the capture interrupt.
    pub edges: Consumer<'a, Edge, E>,
}

impl<S, const Q: usize> core::fmt::Debug for Sampler<'_, S, Q> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sampler")
            .field("index", &self.index)
            .field("queued", &self.out.len())
            .finish_non_exhaustive()
    }
}

impl<const E: usize> core::fmt::Debug for EdgeCapture<'_, E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("EdgeCapture")
            .field("counts", &self.counts)
            .finish_non_exhaustive()
    }
}

impl<const Q: usize, const E: usize> core::fmt::Debug for Queues<'_, Q, E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Queues")
            .field("samples", &self.samples.len())
            .field("edges", &self.edges.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::ErrorKind;
    use heapless::spsc::Queue;

    /// The slow reference: the exact mean in f64, rounded half away from zero.
    fn mean_reference(values: &[i16]) -> i16 {
        let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / values.len() as f64;
        mean.round() as i16 // f64::round rounds half away from zero
    }

    #[test]
    fn averaging_matches_the_exact_mean_rounded_half_away_from_zero() {
        let mut x: u32 = 7;
        for n in [1u16, 2, 3, 4, 5, 8, 16, 100, 1024] {
            for _ in 0..200 {
                let values: Vec<i16> = (0..n)
                    .map(|_| {
                        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                        (x >> 8) as i16
                    })
                    .collect();
                let sum: i32 = values.iter().map(|&v| i32::from(v)).sum();
                assert_eq!(
                    mean_rounded(sum, n),
                    mean_reference(&values),
                    "n={n} {values:?}"
                );
            }
        }
        // Ties, both signs.
        assert_eq!(mean_rounded(3, 2), 2);
        assert_eq!(mean_rounded(-3, 2), -2);
        assert_eq!(mean_rounded(-32768 * 4, 4), -32768);
    }

    struct Flaky {
        n: u32,
        fail_every: u32,
    }
    impl SampleSource for Flaky {
        type Error = ErrorKind;
        fn convert(&mut self) -> Result<[i16; CHANNELS], ErrorKind> {
            self.n += 1;
            if self.n % self.fail_every == 0 {
                Err(ErrorKind::Timeout)
            } else {
                Ok([self.n as i16; CHANNELS])
            }
        }
    }

    #[test]
    fn every_lost_sample_is_counted_and_shows_as_an_index_gap() {
        let shared = Shared::new();
        let mut q: Queue<Sample, 8> = Queue::new();
        let (p, mut c) = q.split();
        let mut s = Sampler::new(
            Flaky {
                n: 0,
                fail_every: 5,
            },
            p,
            &shared,
        );
        s.on_tick(0); // not running: nothing happens
        assert_eq!(shared.produced.load(Ordering::Relaxed), 0);
        shared.start(1);
        for t in 1..=20 {
            s.on_tick(t);
        }
        // 20 samples: conversions 5, 10, 15, 20 failed; the queue holds 7, so of the 16
        // good ones 7 were queued and 9 dropped.
        assert_eq!(shared.produced.load(Ordering::Relaxed), 20);
        assert_eq!(shared.dropped_adc.load(Ordering::Relaxed), 4);
        assert_eq!(shared.dropped_queue_full.load(Ordering::Relaxed), 9);
        assert_eq!(shared.high_water.load(Ordering::Relaxed), 7);
        let indices: Vec<u64> = core::iter::from_fn(|| c.dequeue())
            .map(|s| s.index)
            .collect();
        assert_eq!(indices, vec![0, 1, 2, 3, 5, 6, 7]);
        // A new run restarts the indices.
        shared.start(2);
        s.on_tick(100);
        s.on_tick(101);
        let first = c.dequeue().unwrap();
        assert_eq!((first.index, first.tick), (0, 100));
    }

    #[test]
    fn edges_are_counted_per_line_and_lost_edges_counted() {
        let shared = Shared::new();
        let mut q: Queue<Edge, 3> = Queue::new();
        let (p, mut c) = q.split();
        let mut cap = EdgeCapture::new(p, &shared);
        cap.on_edge(1, true, 10);
        cap.on_edge(1, false, 20);
        cap.on_edge(0, true, 30); // queue (capacity 2) full
        cap.on_edge(9, true, 40); // no such line
        assert_eq!(shared.edges_dropped.load(Ordering::Relaxed), 2);
        assert_eq!(c.dequeue().map(|e| e.count), Some(1));
        assert_eq!(
            c.dequeue().map(|e| (e.line, e.rising, e.count, e.tick)),
            Some((1, false, 2, 20))
        );
        cap.on_edge(0, false, 50);
        // Line 0's lost edge still counted: this is its second.
        assert_eq!(c.dequeue().map(|e| e.count), Some(2));
    }
}
