//! The `lolcow-web` binary: parses the configuration, sets up logging and
//! serves the cow until SIGINT or SIGTERM. See the library docs for details.

use std::io::IsTerminal as _;

use anyhow::Context as _;
use clap::Parser as _;
use lolcow_web::{config::Config, fortune, server};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_ansi(std::io::stdout().is_terminal())
        .init();

    let config = Config::parse();
    let greeting = config
        .greeting()
        .map_or_else(|| fortune::random().to_owned(), str::to_owned);
    let addr = config.socket_addr()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr().context("no local address")?;
    tracing::info!(address = %local, greeting = ?greeting, "lolcow-web listening");

    let limits = config.limits();
    tracing::debug!(?limits, "serving limits");
    shared::serving::serve_plain(
        listener,
        server::router(&greeting),
        limits,
        server::shutdown_signal(),
    )
    .await;
    tracing::info!("lolcow-web stopped");
    Ok(())
}
