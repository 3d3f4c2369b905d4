//! The HTTP endpoints: `/metrics` on the metrics address, `/healthz` and `/readyz` on the
//! health-probe address (both on one listener when the addresses are equal).

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{
    Router, extract::State, http::StatusCode, http::header, response::IntoResponse, routing::get,
};

use crate::{error::Error, metrics::Metrics};

/// Readiness shared between the runner and `/readyz`.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the process ready (watches synced, or standing by for leadership) or not.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    /// Whether `/readyz` answers 200.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(ready): State<Readiness>) -> impl IntoResponse {
    if ready.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "watches not synced yet")
    }
}

async fn metrics(State(metrics): State<Metrics>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.encode(),
    )
}

fn health_router(ready: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(ready)
}

fn metrics_router(m: Metrics) -> Router {
    Router::new().route("/metrics", get(metrics)).with_state(m)
}

/// Binds the configured listeners and serves them in background tasks.
///
/// # Errors
/// [`Error::Serve`] when an address cannot be bound (in use, no permission).
pub async fn serve(
    metrics_addr: Option<SocketAddr>,
    health_addr: Option<SocketAddr>,
    m: Metrics,
    ready: Readiness,
) -> Result<(), Error> {
    let mut routers: Vec<(&'static str, SocketAddr, Router)> = Vec::new();
    match (metrics_addr, health_addr) {
        (Some(ma), Some(ha)) if ma == ha => {
            routers.push((
                "metrics and health probes",
                ma,
                metrics_router(m).merge(health_router(ready)),
            ));
        }
        (ma, ha) => {
            if let Some(ma) = ma {
                routers.push(("metrics", ma, metrics_router(m)));
            }
            if let Some(ha) = ha {
                routers.push(("health probes", ha, health_router(ready)));
            }
        }
    }
    for (what, addr, router) in routers {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Serve { what, addr, source })?;
        tracing::info!(%addr, "serving {what}");
        tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, router).await {
                tracing::error!(%error, "{what} server stopped");
            }
        });
    }
    Ok(())
}
