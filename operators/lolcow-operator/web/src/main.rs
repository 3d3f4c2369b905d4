//! The `lolcow-web` binary: parses the configuration, sets up logging and
//! serves the cow (and, with a probe port, `/healthz` on a listener of its
//! own) until SIGINT or SIGTERM. See the library docs for details.

use std::io::IsTerminal as _;

use anyhow::Context as _;
use clap::Parser as _;
use lolcow_web::{config::Config, fortune, server};
use serving::{Limits, serve_plain};
use tokio::net::TcpListener;
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
    let probe_addr = config.probe_addr()?;
    let listener = bind(addr).await?;
    let probe_listener = match probe_addr {
        Some(addr) => Some(bind(addr).await?),
        None => None,
    };
    let local = listener.local_addr().context("no local address")?;
    tracing::info!(address = %local, greeting = ?greeting, "lolcow-web listening");
    if let Some(probes) = &probe_listener {
        let probes = probes.local_addr().context("no local address")?;
        tracing::info!(address = %probes, "serving /healthz for probes");
    }

    let limits = config.limits();
    tracing::debug!(?limits, "serving limits");
    // Both listeners stop at the first signal.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    let probes = probe_listener.map(|listener| {
        tokio::spawn(serve_plain(
            listener,
            server::probe_router(),
            Limits::PROBES,
            until_stopped(stopped.clone()),
        ))
    });
    tokio::spawn(async move {
        server::shutdown_signal().await;
        stop.send_replace(true);
    });
    serve_plain(
        listener,
        server::router(&greeting),
        limits,
        until_stopped(stopped),
    )
    .await;
    if let Some(probes) = probes {
        let _ = probes.await;
    }
    tracing::info!("lolcow-web stopped");
    Ok(())
}

async fn bind(addr: std::net::SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))
}
