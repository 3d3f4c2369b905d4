//! The HTTP routes of the page and probe listeners, and the graceful-shutdown
//! signal.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::page::{render_html, render_text, wants_plain_text};

const HTML: &str = "text/html; charset=utf-8";
const PLAIN: &str = "text/plain; charset=utf-8";

/// Both renderings of the page, made once at startup.
#[derive(Debug)]
struct Pages {
    html: String,
    text: String,
}

/// Builds the app: `GET /` (HTML or plain text), `GET /healthz`, and a
/// plain-text 404 for everything else.
///
/// `/healthz` stays on the page's port for whoever checked it there: it
/// answers a constant `ok`, reveals nothing and costs what the page costs, so
/// it gives a client of the page nothing the page does not. The kubelet asks
/// the probe listener ([`probe_router`]) instead, which clients of the page
/// cannot fill.
pub fn router(greeting: &str) -> Router {
    let pages = Arc::new(Pages {
        html: render_html(greeting),
        text: render_text(greeting),
    });
    Router::new()
        .route("/", get(index))
        .route("/healthz", get(healthz))
        .fallback(not_found)
        .with_state(pages)
}

/// The probe listener's app: `GET /healthz` and a plain-text 404.
pub fn probe_router() -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .fallback(not_found)
}

async fn index(State(pages): State<Arc<Pages>>, headers: HeaderMap) -> Response {
    let header_str = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let plain = wants_plain_text(header_str(header::ACCEPT), header_str(header::USER_AGENT));
    let (content_type, body) = if plain {
        (PLAIN, pages.text.clone())
    } else {
        (HTML, pages.html.clone())
    };
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::VARY, "Accept, User-Agent"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn healthz() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, PLAIN)], "ok")
}

async fn not_found() -> impl IntoResponse {
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, PLAIN)],
        "no cow here\n",
    )
}

/// Resolves when the process gets SIGINT (Ctrl-C) or, on Unix, SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::warn!(%err, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(err) => {
                tracing::warn!(%err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("got SIGINT, shutting down"),
        () = terminate => tracing::info!("got SIGTERM, shutting down"),
    }
}
