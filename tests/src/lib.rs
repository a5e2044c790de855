//! End-to-end tests across crates live in `tests/tests/`; this library holds what they share.
