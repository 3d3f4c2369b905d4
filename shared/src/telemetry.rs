//! Structured logging: JSON (the default, as a zap production logger) or text.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use crate::cli::{LogFormat, RunArgs};

/// Installs the global tracing subscriber. `RUST_LOG`, when set, wins over `--log-level`.
/// Calling it twice is harmless (the second call does nothing).
pub fn init(args: &RunArgs) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .and_then(|v| EnvFilter::try_new(v).ok())
        .or_else(|| EnvFilter::try_new(args.effective_log_level()).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match args.effective_log_format() {
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false),
            )
            .try_init(),
        LogFormat::Text => registry.with(fmt::layer().with_target(false)).try_init(),
    };
}
