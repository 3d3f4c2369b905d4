//! The health and metrics HTTP endpoints.
//!
//! - `GET /healthz`: `200 ok` while the consumer is connected to the broker,
//!   `503` otherwise (still connecting, reconnecting, or shutting down).
//! - `GET /metrics`: the counters below in the Prometheus/OpenMetrics text
//!   format.
//!
//! Served by `serving`'s loop with [`LIMITS`]: a client that opens
//! connections and never finishes its request (or trickles it) is closed at the
//! header-read timeout, one client address holds at most 8 of the 64 slots, and
//! heads over 8 KiB are refused, so neither the kubelet's readiness probe nor a
//! scraper can be kept out, and the listener never holds more than ~3.6 MiB
//! against the container's 128 MiB limit.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serving::Limits;

/// The HTTP server's limits: the kubelet's probe and scrapers, as the
/// operators' probe and metrics listeners ([`Limits::PROBES`]); 4 s to finish
/// at shutdown (the binary waits 5).
pub const LIMITS: Limits = Limits {
    shutdown_grace: std::time::Duration::from_secs(4),
    ..Limits::PROBES
};

/// Content type of the metrics exposition.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The consumer's metrics, shared between the consume loop and the HTTP
/// handlers. All metric names start with `pulsar_consumer_`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Messages handed to the application by the client (redeliveries count
    /// again): `pulsar_consumer_messages_received_total`.
    pub messages_received: Counter,
    /// Messages acknowledged after processing:
    /// `pulsar_consumer_messages_acked_total`.
    pub messages_acked: Counter,
    /// Errors reported by the client for single messages (for example an
    /// unsupported compression codec): `pulsar_consumer_message_errors_total`.
    pub message_errors: Counter,
    /// 1 while connected to the broker, else 0: `pulsar_consumer_connected`.
    pub connected: Gauge,
    /// Connection attempts made after a failed attempt or a lost connection:
    /// `pulsar_consumer_reconnects_total`.
    pub reconnects: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates the metrics and registers them.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("pulsar_consumer");
        let messages_received = Counter::default();
        let messages_acked = Counter::default();
        let message_errors = Counter::default();
        let connected = Gauge::default();
        let reconnects = Counter::default();
        registry.register(
            "messages_received",
            "Messages received from the broker (redeliveries included)",
            messages_received.clone(),
        );
        registry.register(
            "messages_acked",
            "Messages acknowledged after they were processed",
            messages_acked.clone(),
        );
        registry.register(
            "message_errors",
            "Errors the client reported for single messages",
            message_errors.clone(),
        );
        registry.register(
            "connected",
            "1 while the consumer is connected to the broker, 0 otherwise",
            connected.clone(),
        );
        registry.register(
            "reconnects",
            "Connection attempts after a failed attempt or a lost connection",
            reconnects.clone(),
        );
        Metrics {
            registry,
            messages_received,
            messages_acked,
            message_errors,
            connected,
            reconnects,
        }
    }

    /// Whether the consumer is currently connected.
    pub fn is_connected(&self) -> bool {
        self.connected.get() > 0
    }

    /// Records the connection state.
    pub fn set_connected(&self, connected: bool) {
        self.connected.set(i64::from(connected));
    }

    /// Renders all metrics in the OpenMetrics text format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Builds the router serving `/healthz` and `/metrics`.
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics_handler))
        .with_state(metrics)
}

async fn healthz(State(metrics): State<Arc<Metrics>>) -> Response {
    if metrics.is_connected() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not connected to the Pulsar broker\n",
        )
            .into_response()
    }
}

async fn metrics_handler(State(metrics): State<Arc<Metrics>>) -> Response {
    match metrics.encode() {
        Ok(body) => ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], body).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "could not encode metrics");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// A bound HTTP listener, ready to serve.
pub struct Server {
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
}

impl Server {
    /// Binds the listen address; fails at once if it is taken or invalid.
    pub async fn bind(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        Ok(Server { listener, metrics })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, then finishes in-flight requests
    /// (within [`LIMITS`]' grace period).
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        serving::serve_plain(self.listener, router(self.metrics), LIMITS, shutdown).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn metric_names() {
        let m = Metrics::new();
        m.messages_received.inc();
        m.messages_acked.inc();
        m.set_connected(true);
        let text = m.encode().unwrap();
        for line in [
            "pulsar_consumer_messages_received_total 1",
            "pulsar_consumer_messages_acked_total 1",
            "pulsar_consumer_message_errors_total 0",
            "pulsar_consumer_connected 1",
            "pulsar_consumer_reconnects_total 0",
            "# TYPE pulsar_consumer_messages_acked counter",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    /// A connection from 127.0.0.`host`: a client address of its own.
    async fn connect_from(host: u8, addr: SocketAddr) -> tokio::net::TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::from(([127, 0, 0, host], 0)))
            .unwrap();
        socket.connect(addr).await.unwrap()
    }

    /// Sends `request` and reads until the server closes (empty: closed unanswered).
    async fn exchange(mut stream: tokio::net::TcpStream, request: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _ = stream.write_all(request.as_bytes()).await;
        let mut out = Vec::new();
        let mut buf = [0_u8; 4096];
        let read = async {
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&buf[..n]);
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), read)
            .await
            .expect("closed within 5 s");
        String::from_utf8_lossy(&out).into_owned()
    }

    fn get(path: &str, extra: &str) -> String {
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n")
    }

    #[tokio::test]
    async fn the_server_has_the_shared_loops_limits() {
        let server = Server::bind(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            Arc::new(Metrics::new()),
        )
        .await
        .unwrap();
        let addr = server.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.serve(async {
            let _ = stopped.await;
        }));
        // One client address flooding with half-written requests holds 8 slots...
        let mut flood = Vec::new();
        for _ in 0..100 {
            let mut s = connect_from(2, addr).await;
            let _ = tokio::io::AsyncWriteExt::write_all(&mut s, b"GET /healthz HTTP/1.1\r\n").await;
            flood.push(s);
        }
        assert_eq!(
            exchange(connect_from(2, addr).await, &get("/healthz", "")).await,
            ""
        );
        // ...and the kubelet and scrapers are answered.
        let health = exchange(connect_from(1, addr).await, &get("/healthz", "")).await;
        assert!(health.starts_with("HTTP/1.1 503"), "{health}");
        assert!(
            health.ends_with("not connected to the Pulsar broker\n"),
            "{health}"
        );
        let metrics = exchange(connect_from(1, addr).await, &get("/metrics", "")).await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(metrics.contains("pulsar_consumer_connected 0"), "{metrics}");
        // Heads over 8 KiB are refused.
        let big = format!("X-Pad: {}\r\n", "a".repeat(9000));
        let refused = exchange(connect_from(1, addr).await, &get("/healthz", &big)).await;
        assert!(
            refused.is_empty() || refused.starts_with("HTTP/1.1 431"),
            "{refused}"
        );
        assert!(!refused.contains("not connected"), "{refused}");
        drop(flood);
        stop.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), serving)
            .await
            .expect("the server stops at shutdown")
            .unwrap();
    }

    #[test]
    fn connected_flag() {
        let m = Metrics::new();
        assert!(!m.is_connected());
        m.set_connected(true);
        assert!(m.is_connected());
        m.set_connected(false);
        assert!(!m.is_connected());
    }
}
