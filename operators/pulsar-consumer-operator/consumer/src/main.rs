//! `pulsar-consumer`: the workload of the PulsarConsumer operator.
//!
//! - `pulsar-consumer [consume]` (the default) subscribes to `PULSAR_TOPIC`
//!   with a Shared subscription named `PULSAR_SUBSCRIPTION_NAME` (so replicas
//!   split the messages), logs every message as `message received` with the
//!   fields `topic`, `id` and `payload`, then acknowledges it. It reconnects
//!   with capped, jittered exponential backoff, serves `GET /healthz` and
//!   `GET /metrics` on `HTTP_BIND_ADDRESS`, and exits 0 on SIGTERM/SIGINT
//!   after finishing the message in hand.
//! - `pulsar-consumer produce` sends `--count` messages (`PULSAR_MESSAGE`,
//!   numbered when more than one) and prints how many the broker confirmed.
//!
//! Every flag can also be set through the environment variable of the same
//! name (`--pulsar-server` / `PULSAR_SERVER`, ...); `--log-format json`
//! (`LOG_FORMAT`) writes one JSON object per line. Logs of `consume` go to
//! standard output, those of `produce` to standard error (its standard output
//! carries the result). `RUST_LOG` overrides the default log filter.
//!
//! Exit codes: 0 on success or clean shutdown, 1 on a runtime failure, 2 on a
//! configuration error.

mod config;
mod consume;
mod http;
mod produce;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

use crate::config::{Cli, Command, ConfigError, ConsumeConfig, LogFormat, ProduceConfig};
use crate::http::{Metrics, Server};

/// Default log filter: our own logs at info, everything else (notably the
/// client library, which logs each of its internal retries) from warnings up.
/// (A `pulsar=warn` directive would also match `pulsar_consumer`: filter
/// targets match by prefix.)
const DEFAULT_LOG_FILTER: &str = "warn,pulsar_consumer=info";
/// Time allowed for the HTTP server to finish after shutdown.
const HTTP_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Exit code of a configuration error.
const EXIT_CONFIG: u8 = 2;

/// A cloneable handle telling whether shutdown was requested.
#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// Creates the sending side and a first handle.
    pub fn channel() -> (watch::Sender<bool>, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (tx, Shutdown(rx))
    }

    /// Whether shutdown has been requested.
    pub fn is_requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Completes once shutdown is requested (or the sender is gone).
    pub async fn requested(&mut self) {
        // An error means the sender was dropped: treat it as shutdown too.
        let _ = self.0.wait_for(|requested| *requested).await;
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Consume(cli.consume));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pulsar-consumer: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match command {
        Command::Consume(args) => match args.validate() {
            Ok(cfg) => {
                init_logging(cli.log_format, false);
                runtime.block_on(run_consume(cfg))
            }
            Err(e) => config_error(&e),
        },
        Command::Produce(args) => match args.validate() {
            Ok(cfg) => {
                init_logging(cli.log_format, true);
                runtime.block_on(run_produce(cfg))
            }
            Err(e) => config_error(&e),
        },
    }
}

fn config_error(e: &ConfigError) -> ExitCode {
    eprintln!("pulsar-consumer: configuration error: {e}");
    ExitCode::from(EXIT_CONFIG)
}

/// Installs the tracing subscriber (also capturing the `log` records of the
/// Pulsar client).
fn init_logging(format: LogFormat, to_stderr: bool) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER));
    // Colours only on a terminal: Kubernetes log collectors get plain text.
    let ansi = if to_stderr {
        std::io::stderr().is_terminal()
    } else {
        std::io::stdout().is_terminal()
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    let result = match (format, to_stderr) {
        (LogFormat::Text, false) => builder.try_init(),
        (LogFormat::Text, true) => builder.with_writer(std::io::stderr).try_init(),
        (LogFormat::Json, false) => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
        (LogFormat::Json, true) => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .try_init(),
    };
    if let Err(e) = result {
        eprintln!("pulsar-consumer: could not set up logging: {e}");
    }
}

/// Sends `true` on the shutdown channel at the first SIGTERM or SIGINT.
fn spawn_signal_handler(tx: watch::Sender<bool>) -> std::io::Result<()> {
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        info!(
            signal = name,
            "shutdown requested; finishing the message in hand"
        );
        let _ = tx.send(true);
    });
    Ok(())
}

async fn run_consume(cfg: ConsumeConfig) -> ExitCode {
    let (tx, shutdown) = Shutdown::channel();
    if let Err(e) = spawn_signal_handler(tx.clone()) {
        error!(error = %e, "cannot install signal handlers");
        return ExitCode::FAILURE;
    }
    let metrics = Arc::new(Metrics::new());
    let server = match Server::bind(cfg.http_bind_address, metrics.clone()).await {
        Ok(server) => server,
        Err(e) => {
            error!(error = %e, address = %cfg.http_bind_address, "cannot listen on HTTP_BIND_ADDRESS");
            return ExitCode::FAILURE;
        }
    };
    match server.local_addr() {
        Ok(addr) => info!(address = %addr, "serving /healthz and /metrics"),
        Err(e) => warn!(error = %e, "cannot read the HTTP listen address"),
    }
    let mut http_shutdown = shutdown.clone();
    let http = tokio::spawn(server.serve(async move { http_shutdown.requested().await }));

    let result = consume::run(cfg, metrics, shutdown).await;
    // Stops the HTTP server too, whatever ended the consume loop.
    let _ = tx.send(true);
    match tokio::time::timeout(HTTP_SHUTDOWN_TIMEOUT, http).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(error = %e, "HTTP server task failed"),
        Err(_) => warn!("HTTP server did not stop in time"),
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = format!("{e:#}"), "consumer failed");
            ExitCode::FAILURE
        }
    }
}

async fn run_produce(cfg: ProduceConfig) -> ExitCode {
    match produce::run(&cfg).await {
        Ok(sent) => {
            let noun = if sent == 1 { "message" } else { "messages" };
            println!("sent {sent} {noun} to {}", cfg.connection.topic);
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!(error = format!("{e:#}"), "produce failed");
            eprintln!("pulsar-consumer: produce failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}
