//! The railtrace host library: talking to a rig ([`transport`]), capturing its stream
//! ([`capture`]) into a [`recording`], and importing other instruments' traces
//! ([`import`]).
pub mod analysis;
pub mod calibrate;
pub mod capture;
pub mod correct;
pub mod demo;
pub mod dvfs;
pub mod export;
pub mod gpu;
pub mod import;
pub mod inspect;
pub mod logger_model;
pub mod meter;
pub mod model;
pub mod paired;
pub mod plot;
pub mod profile;
pub mod recording;
pub mod report_plot;
pub mod stop;
pub mod survey;
pub mod transport;
pub mod trigger;
pub mod view;
