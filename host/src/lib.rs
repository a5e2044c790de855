//! The railtrace host library, its modules grouped by the stage of the data flow:
//! - [`link`]: the device link and capture: talking to a rig, capturing its stream into a
//!   recording, a capture in the background read as it goes (the energy over windows),
//!   the trigger outputs a host drives, the live view;
//! - [`store`]: recordings and exports: the recording format, Parquet/CSV/Perfetto
//!   exports, imports of other instruments' traces, summaries and pictures of a recording;
//! - [`gpu`]: GPU runners and loggers (the twin's, AMD's, NVIDIA's), and the stages that
//!   drive a GPU beside the rig: the profiling run and the DVFS latency run;
//! - [`analysis`]: analysis and reports: the profiling run's analysis, the logger's
//!   calibration and the correction of its profile, power models, paired traces;
//! - [`demo`]: the whole job on the digital twin, the stages composed.
pub mod analysis;
#[cfg(all(feature = "plots", feature = "parquet"))]
pub mod demo;
pub mod gpu;
pub mod link;
pub mod store;
