//! Recordings and exports: the recording format a capture writes and everything reads
//! ([`recording`]), its exports to Parquet, CSV and Perfetto ([`export`]), other
//! instruments' traces imported as recordings ([`import`]), a recording summarised
//! ([`inspect`]) and drawn ([`plot`]).
pub mod export;
pub mod import;
pub mod inspect;
pub mod plot;
pub mod recording;
