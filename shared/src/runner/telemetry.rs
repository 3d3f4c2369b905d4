//! Structured logging: JSON (the default, as a zap production logger) or text.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use crate::runner::cli::{LogFormat, RunArgs, TimeEncoding};

/// Installs the global tracing subscriber. `RUST_LOG`, when set, wins over `--log-level`.
/// Calling it twice is harmless (the second call does nothing).
pub(super) fn init(args: &RunArgs) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .and_then(|v| EnvFilter::try_new(v).ok())
        .or_else(|| EnvFilter::try_new(args.effective_log_level()).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let timer = Timer(args.zap_time_encoding);
    let _ = match args.effective_log_format() {
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .with_timer(timer)
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false),
            )
            .try_init(),
        LogFormat::Text => registry
            .with(fmt::layer().with_timer(timer).with_target(false))
            .try_init(),
    };
    if let Some(level) = &args.zap_stacktrace_level {
        tracing::debug!(
            %level,
            "--zap-stacktrace-level accepted and ignored: log lines carry no stack traces"
        );
    }
}

/// Log timestamps in `--zap-time-encoding` (see [`TimeEncoding::format`]).
#[derive(Debug, Clone, Copy)]
struct Timer(Option<TimeEncoding>);

impl fmt::time::FormatTime for Timer {
    fn format_time(&self, w: &mut fmt::format::Writer<'_>) -> std::fmt::Result {
        w.write_str(&TimeEncoding::format(self.0, jiff::Timestamp::now()))
    }
}
