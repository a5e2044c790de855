// The property the `logger_model` fuzz target checks, shared with
// `tests/fuzz_regressions.rs` by `include!`: any text, read as a logger model file, is a
// model whose figures are within their bounds or a one-line error, never a panic.

pub fn check_logger_model(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match railtrace::analysis::logger_model::LoggerModel::parse(std::path::Path::new("fuzz.toml"), &text) {
        Ok(m) => assert!(m.period_s.is_finite() && m.period_s > 0.0),
        Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
    }
}
