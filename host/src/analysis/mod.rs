//! Analysis and reports: a profiling run's clocks aligned, executions binned and profiles
//! stitched ([`stitch`], drawn by [`report_plot`]); a GPU logger identified against the rig
//! ([`calibrate`], giving a [`logger_model`]) and its stitched profile corrected
//! ([`correct`]); power models fitted and validated ([`model`]); a logger against a
//! reference meter over paired traces ([`paired`]) and over a folder of them ([`survey`]).
pub mod calibrate;
pub mod correct;
pub mod logger_model;
pub mod model;
pub mod paired;
#[cfg(feature = "plots")]
pub mod report_plot;
pub mod stitch;
pub mod survey;
