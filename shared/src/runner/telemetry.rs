//! Structured logging: JSON (the default, as a zap production logger) or text; and, when
//! an OTLP endpoint is set, traces ([`otel`]).

mod otel;

use tracing_subscriber::{EnvFilter, Layer as _, fmt, prelude::*};

use crate::runner::cli::{LogFormat, RunArgs, TimeEncoding};

pub(crate) use otel::record_trace_id;

/// What [`init`] set up that needs a word at exit: the trace exporter, if any.
#[must_use = "call `shutdown` at exit, so the last spans are sent"]
pub(super) struct Telemetry {
    /// The tracer provider when traces are exported.
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

/// Installs the global tracing subscriber. `RUST_LOG`, when set, wins over `--log-level`.
/// Calling it twice is harmless (the second call does nothing).
///
/// With an OTLP endpoint (`--otlp-endpoint`, `OTEL_EXPORTER_OTLP_ENDPOINT` or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), spans are also exported as traces under their own
/// filter ([`otel::ExportFilter`]), whatever the log level; `operator` is the default
/// `service.name`. Must be called inside the tokio runtime.
///
/// # Errors
/// A message naming the variable or flag whose value is not usable.
pub(super) fn init(args: &RunArgs, operator: &'static str) -> Result<Telemetry, String> {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .and_then(|v| EnvFilter::try_new(v).ok())
        .or_else(|| EnvFilter::try_new(args.effective_log_level()).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let config = otel::Config::from_env(args.otlp_endpoint.as_deref(), operator)?;
    let provider = config.as_ref().map(otel::provider).transpose()?;
    let traces = provider.as_ref().map(|p| otel::layer(p, operator));
    let registry = tracing_subscriber::registry().with(traces);
    let timer = Timer(args.zap_time_encoding);
    let _ = match args.effective_log_format() {
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .with_timer(timer)
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_filter(filter),
            )
            .try_init(),
        LogFormat::Text => registry
            .with(
                fmt::layer()
                    .with_timer(timer)
                    .with_target(false)
                    .with_filter(filter),
            )
            .try_init(),
    };
    if let Some(level) = &args.zap_stacktrace_level {
        tracing::debug!(
            %level,
            "--zap-stacktrace-level accepted and ignored: log lines carry no stack traces"
        );
    }
    if let Some(config) = &config {
        tracing::info!(endpoint = %config.endpoint, "exporting traces over OTLP/HTTP");
        if let Some(warning) = &config.sampler_warning {
            tracing::warn!("{warning}");
        }
    }
    Ok(Telemetry { provider })
}

impl Telemetry {
    /// Sends the spans not exported yet and stops the exporter, waiting at most
    /// [`otel::SHUTDOWN_WAIT`]: a collector that is gone does not hold up the exit.
    ///
    /// The SDK's shutdown blocks its thread until the exporting task (on this runtime)
    /// answers, so it runs on a thread of its own while this one keeps the runtime going;
    /// after the wait that thread is left to end with the process.
    pub(super) async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("otel-shutdown".into())
            .spawn(move || {
                let _ = tx.send(provider.shutdown());
            });
        if let Err(error) = spawned {
            tracing::warn!(%error, "cannot flush the last spans");
            return;
        }
        match tokio::time::timeout(otel::SHUTDOWN_WAIT, rx).await {
            Ok(Ok(Ok(()))) => tracing::debug!("traces flushed"),
            Ok(Ok(Err(error))) => tracing::warn!(%error, "the last spans were not all exported"),
            Ok(Err(_)) => tracing::warn!("the last spans were not all exported"),
            Err(_) => tracing::warn!(
                wait = ?otel::SHUTDOWN_WAIT,
                "the trace collector did not take the last spans in time; they are dropped"
            ),
        }
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
