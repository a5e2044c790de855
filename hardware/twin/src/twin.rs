//! The whole bench, running: the GPU and its logger, the rig, and the MCU behind its
//! pseudo-terminal, from a [`Scenario`](crate::scenario::Scenario).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::path::Path;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use crate::gpu::{Execution, Gpu};
use crate::logger::{Logger, LoggerSample};
use crate::mcu::{Hardware, Mcu, McuConfig, TwinError, TwinStats};
use crate::random::rng;
use crate::rig::FrontEnd;
use crate::scenario::Loaded;

/// Most logger samples and executions kept for readers (older ones are dropped, counted).
const KEEP: usize = 1_000_000;

/// What the GPU side produced, for the host's logger reader and GPU runner.
#[derive(Debug, Default)]
pub struct GpuOutputs {
    /// The GPU's own power logger's reports, oldest first.
    pub logger: VecDeque<LoggerSample>,
    /// Kernel executions, oldest first.
    pub executions: VecDeque<Execution>,
    /// Reports and executions dropped because nobody read them.
    pub dropped: u64,
}

/// A running twin.
#[derive(Debug)]
pub struct Twin {
    mcu: Mcu,
    outputs: Arc<Mutex<GpuOutputs>>,
}

impl Twin {
    /// Starts the bench of `loaded`.
    pub fn start(loaded: &Loaded) -> Result<Twin, TwinError> {
        let s = loaded.scenario.clone();
        let rig = loaded.rig.clone();
        let outputs = Arc::new(Mutex::new(GpuOutputs::default()));
        let out = outputs.clone();
        let config = McuConfig {
            clock: s.mcu,
            firmware: s.firmware.clone(),
            trigger: s.trigger,
            faults: s.faults,
            seed: s.seed,
        };
        let mcu = Mcu::start(config, move || {
            let bad = |e: crate::gpu::ConfigError| TwinError::Thread(e.to_string());
            let gpu = Gpu::new(s.gpu.clone(), s.kernels.clone(), s.workload.clone(), s.seed)
                .map_err(bad)?;
            let logger = Logger::new(s.logger.clone(), *gpu.clock()).map_err(bad)?;
            let side = Rc::new(RefCell::new((gpu, logger)));
            let feed = side.clone();
            let next_segment = move || {
                let mut side = feed.borrow_mut();
                let seg = side.0.next_segment();
                // Segments come in order and contiguous: the logger cannot refuse them.
                let _ = side.1.push(&seg);
                seg
            };
            let front_end = FrontEnd::new(&rig, &s.rig_truth, next_segment, rng(s.seed, 0x5E45))?;
            let on_time: Box<dyn FnMut(f64)> = Box::new(move |_now_s: f64| {
                let mut side = side.borrow_mut();
                let (gpu, logger) = &mut *side;
                let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
                o.logger.extend(logger.drain_samples());
                o.executions.extend(gpu.drain_executions());
                let (extra_logger, extra_exec) = (
                    o.logger.len().saturating_sub(KEEP),
                    o.executions.len().saturating_sub(KEEP),
                );
                o.logger.drain(..extra_logger);
                o.executions.drain(..extra_exec);
                o.dropped += (extra_logger + extra_exec) as u64;
            });
            Ok(Hardware {
                rig,
                front_end,
                on_time,
            })
        })?;
        Ok(Twin { mcu, outputs })
    }

    /// The rig's serial port (a stable path to the current pseudo-terminal).
    pub fn path(&self) -> &Path {
        self.mcu.path()
    }

    /// Drives the host's trigger output `line` into the rig.
    pub fn trigger(&self, line: u8, high: bool) {
        self.mcu.trigger(line, high);
    }

    /// Takes the logger reports and executions produced so far.
    pub fn take_outputs(&self) -> GpuOutputs {
        std::mem::take(&mut *self.outputs.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// What the twin injected so far.
    pub fn stats(&self) -> &TwinStats {
        self.mcu.stats()
    }

    /// True while the twin runs.
    pub fn is_running(&self) -> bool {
        self.mcu.is_running()
    }

    /// Stops the twin.
    pub fn stop(self) -> Result<(), TwinError> {
        self.mcu.stop()
    }
}
