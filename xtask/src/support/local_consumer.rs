//! The Pulsar consumer app as a local process, as the end-to-end tests and
//! the consumer bench start it: configured by its environment, JSON logs in
//! a file of its own.

use anyhow::{Context, Result};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// How one consumer process runs.
pub struct Launch<'a> {
    /// The `pulsar-consumer` binary.
    pub binary: &'a Path,
    /// The broker's service URL (`PULSAR_SERVER`).
    pub server: &'a str,
    /// The topic consumed (`PULSAR_TOPIC`).
    pub topic: &'a str,
    /// The Shared subscription (`PULSAR_SUBSCRIPTION_NAME`).
    pub subscription: &'a str,
    /// The port of its `/metrics` and health endpoints, on 127.0.0.1.
    pub http_port: u16,
    /// Its name (`HOSTNAME`), as a pod's would be.
    pub hostname: &'a str,
    /// Where its standard output and error go (created or truncated).
    pub log_path: &'a Path,
}

/// Starts the consumer `launch` describes, with the log format and level the
/// callers parse (JSON, the app's default level).
///
/// # Errors
/// When the log file cannot be created or the binary cannot start.
pub fn spawn(launch: &Launch<'_>) -> Result<Child> {
    let log = std::fs::File::create(launch.log_path)
        .with_context(|| format!("creating {}", launch.log_path.display()))?;
    Command::new(launch.binary)
        .env("PULSAR_SERVER", launch.server)
        .env("PULSAR_TOPIC", launch.topic)
        .env("PULSAR_SUBSCRIPTION_NAME", launch.subscription)
        .env(
            "HTTP_BIND_ADDRESS",
            format!("127.0.0.1:{}", launch.http_port),
        )
        .env("LOG_FORMAT", "json")
        .env("HOSTNAME", launch.hostname)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", launch.binary.display()))
}
