//! Importers of recordings made with other instruments. The readers parse into plain
//! series here; writing them as railtrace recordings comes with the recording format
//! (issue 5).
pub mod pmd;
