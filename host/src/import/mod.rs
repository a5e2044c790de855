//! Importers of recordings made with other instruments, written as railtrace
//! recordings.
pub mod pmd;
