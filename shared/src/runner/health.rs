//! The HTTP endpoints: `/metrics` on the metrics address, `/healthz` and `/readyz` on the
//! health-probe address (both on one listener when the addresses are equal and metrics
//! are plain HTTP). Every server runs [`serving`]'s loop: header-read and idle
//! timeouts, a head-size limit, a connection limit and a per-peer one, fixed socket
//! buffers and a body limit: [`Limits::PROBES`] for the probes, [`Limits::METRICS`] for
//! `/metrics`. Both together hold at most ~13 MiB with every slot taken (64 KiB metrics
//! answers over TLS), against the 128 MiB limit of the operators' Deployments; before, two
//! listeners of 1,024 connections with 64 KiB heads could take 160 MiB.
//!
//! The probe port is for the kubelet only: no Service of `deploy/` exposes it. Without the
//! optional network policy any pod can still reach it by the pod's IP; a pod that floods it
//! holds at most 8 of its 64 slots, and the kubelet, holding fewer, displaces a connection
//! of whoever holds the most when all are taken (see [`serving`]).

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

use kube::Client;
use serving::Limits;

#[cfg(feature = "secure-metrics")]
use crate::runner::metrics_auth::{self, ApiServerReviewer, Authorizer, CertFiles};
use crate::{error::Error, runner::cli::RunArgs, runner::metrics::Metrics};

/// Readiness shared between the runner and `/readyz`. Only ready or not: what is not ready
/// and why (the namespaces whose watches fail, the API's error) is the runner's log's
/// (`watch status`), never `/readyz`'s, which answers anyone who reaches the pod.
#[derive(Debug, Clone, Default)]
pub(super) struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the process ready (watches synced, or standing by for leadership) or not.
    pub(super) fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    /// Whether `/readyz` answers 200.
    #[must_use]
    pub(super) fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

async fn healthz() -> &'static str {
    "ok"
}

/// `ok` or `not ready`, and nothing else: the detail (which namespaces, which API error) is
/// in the log (`watch status`), not in an answer to whoever asks.
async fn readyz(State(ready): State<Readiness>) -> impl IntoResponse {
    if ready.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
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

/// How `/metrics` is served.
#[derive(Debug, Clone)]
pub(super) enum MetricsSecurity {
    /// Plain HTTP, no authentication.
    Plain,
    /// HTTPS, every request authenticated and authorized (see [`crate::runner::metrics_auth`]).
    #[cfg(feature = "secure-metrics")]
    Secure {
        /// The TLS configuration.
        tls: Arc<rustls::ServerConfig>,
        /// Reviews the requests' bearer tokens.
        authorizer: Arc<Authorizer>,
    },
}

/// The servers to start.
#[derive(Debug, Clone)]
pub(super) struct Endpoints {
    /// Where `/metrics` is served (`None`: nowhere).
    pub metrics: Option<SocketAddr>,
    /// How `/metrics` is served.
    pub metrics_security: MetricsSecurity,
    /// Where `/healthz` and `/readyz` are served, always plain HTTP (`None`: nowhere).
    pub health: Option<SocketAddr>,
    /// Timeouts and limits of the probe server.
    pub probe_limits: Limits,
    /// Timeouts and limits of the metrics server (also of one server for both).
    pub metrics_limits: Limits,
}

/// The endpoints the command line asks for; with `--metrics-secure`, loads or generates
/// the certificate and reviews requests with `client`.
///
/// # Errors
/// [`Error::Serve`] when the certificate cannot be read or made.
pub(super) fn endpoints_from_args(args: &RunArgs, client: &Client) -> Result<Endpoints, Error> {
    let metrics = args.metrics_bind_address.0;
    let metrics_security = match metrics {
        Some(addr) if args.metrics_secure => secure_metrics(args, client, addr)?,
        _ => MetricsSecurity::Plain,
    };
    Ok(Endpoints {
        metrics,
        metrics_security,
        health: args.health_probe_bind_address.0,
        probe_limits: Limits::PROBES,
        metrics_limits: Limits::METRICS,
    })
}

/// `--metrics-secure`: the certificate loaded or generated, requests reviewed with `client`.
#[cfg(feature = "secure-metrics")]
fn secure_metrics(
    args: &RunArgs,
    client: &Client,
    addr: SocketAddr,
) -> Result<MetricsSecurity, Error> {
    let files = args.metrics_cert_path.as_ref().map(|dir| CertFiles {
        cert: dir.join(&args.metrics_cert_name),
        key: dir.join(&args.metrics_cert_key),
    });
    let tls = metrics_auth::tls_config(files.as_ref()).map_err(|source| Error::Serve {
        what: "metrics",
        addr,
        source,
    })?;
    match &files {
        Some(files) => {
            tracing::info!(cert = %files.cert.display(), "metrics: HTTPS with the given certificate")
        }
        None => {
            tracing::info!("metrics: HTTPS with a self-signed certificate generated at startup")
        }
    }
    Ok(MetricsSecurity::Secure {
        tls,
        authorizer: Arc::new(Authorizer::new(ApiServerReviewer::new(client.clone()))),
    })
}

/// `--metrics-secure` in a build without the `secure-metrics` feature.
#[cfg(not(feature = "secure-metrics"))]
fn secure_metrics(_: &RunArgs, _: &Client, addr: SocketAddr) -> Result<MetricsSecurity, Error> {
    Err(Error::Serve {
        what: "metrics",
        addr,
        source: std::io::Error::other(
            "--metrics-secure: this build has no HTTPS metrics (shared's feature secure-metrics); pass --metrics-secure=false",
        ),
    })
}

/// Starts the servers the command line asks for (see [`endpoints_from_args`], [`serve`]).
///
/// # Errors
/// [`Error::Serve`] when an address cannot be bound or the certificate cannot be loaded.
pub(super) async fn serve_from_args(
    args: &RunArgs,
    client: &Client,
    m: Metrics,
    ready: Readiness,
) -> Result<(), Error> {
    serve(endpoints_from_args(args, client)?, m, ready).await?;
    Ok(())
}

/// Binds the listeners and serves them in background tasks; returns what is served where
/// (the bound addresses: port 0 picks a free one).
///
/// # Errors
/// [`Error::Serve`] when an address cannot be bound (in use, no permission), or when
/// HTTPS metrics and the plain-HTTP probes are asked for on one address.
pub(super) async fn serve(
    endpoints: Endpoints,
    m: Metrics,
    ready: Readiness,
) -> Result<Vec<(&'static str, SocketAddr)>, Error> {
    let Endpoints {
        metrics: metrics_addr,
        metrics_security,
        health: health_addr,
        probe_limits,
        metrics_limits,
    } = endpoints;
    let secure = !matches!(metrics_security, MetricsSecurity::Plain);
    let mut routers: Vec<(&'static str, SocketAddr, Router, MetricsSecurity, Limits)> = Vec::new();
    match (metrics_addr, health_addr) {
        (Some(ma), Some(ha)) if ma == ha && secure => {
            return Err(Error::Serve {
                what: "metrics and health probes",
                addr: ma,
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "HTTPS metrics (--metrics-secure) and the plain-HTTP probes need two \
                     addresses: set --metrics-bind-address and --health-probe-bind-address apart",
                ),
            });
        }
        (Some(ma), Some(ha)) if ma == ha => {
            routers.push((
                "metrics and health probes",
                ma,
                metrics_router(m).merge(health_router(ready)),
                MetricsSecurity::Plain,
                metrics_limits,
            ));
        }
        (ma, ha) => {
            if let Some(ma) = ma {
                routers.push((
                    "metrics",
                    ma,
                    metrics_router(m),
                    metrics_security,
                    metrics_limits,
                ));
            }
            if let Some(ha) = ha {
                routers.push((
                    "health probes",
                    ha,
                    health_router(ready),
                    MetricsSecurity::Plain,
                    probe_limits,
                ));
            }
        }
    }
    let mut bound = Vec::new();
    for (what, addr, router, security, limits) in routers {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Serve { what, addr, source })?;
        let addr = listener.local_addr().unwrap_or(addr);
        bound.push((what, addr));
        match security {
            MetricsSecurity::Plain => {
                tracing::info!(%addr, "serving {what} (http)");
                tokio::spawn(serving::serve_plain(
                    listener,
                    router,
                    limits,
                    std::future::pending(),
                ));
            }
            #[cfg(feature = "secure-metrics")]
            MetricsSecurity::Secure { tls, authorizer } => {
                tracing::info!(%addr, "serving {what} (https, authenticated and authorized by the API server)");
                let router = router.layer(axum::middleware::from_fn_with_state(
                    authorizer.clone(),
                    metrics_auth::require_authorized,
                ));
                tokio::spawn(serving::serve(
                    listener,
                    router,
                    limits,
                    // Tags each connection with its peer, for the per-peer cap on reviews.
                    metrics_auth::tls_handshake(tls, authorizer),
                    std::future::pending(),
                ));
            }
        }
    }
    Ok(bound)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::runner::metrics_auth::test_files::{FakeReviewer, cert_files, write_self_signed};
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    use tokio::net::TcpStream;

    fn local() -> Option<SocketAddr> {
        Some(SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Sends `request` and reads the answer until the server closes.
    async fn exchange(mut stream: impl AsyncRead + AsyncWrite + Unpin, request: &str) -> String {
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out))
            .await
            .expect("an answer within 5 s");
        String::from_utf8_lossy(&out).into_owned()
    }

    fn get(path: &str, token: Option<&str>) -> String {
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}\r\n")
    }

    /// A connection from 127.0.0.`host`: a peer of its own for the server.
    async fn connect_from(host: u8, addr: SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::from(([127, 0, 0, host], 0)))
            .unwrap();
        socket.connect(addr).await.unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn probes_answer_while_ten_peers_flood_both_listeners() {
        let timeout = Duration::from_millis(1500);
        let short = |limits: Limits| Limits {
            header_read_timeout: timeout,
            ..limits
        };
        let bound = serve(
            Endpoints {
                // Another address than the probes' (equal ones share one listener).
                metrics: Some(SocketAddr::from(([127, 0, 0, 2], 0))),
                metrics_security: MetricsSecurity::Plain,
                health: local(),
                probe_limits: short(Limits::PROBES),
                metrics_limits: short(Limits::METRICS),
            },
            Metrics::new(),
            Readiness::default(),
        )
        .await
        .unwrap();
        let (metrics, probes) = (bound[0].1, bound[1].1);
        let opened = Instant::now();
        // 30 half-written requests from each of 10 peers on each listener: 600 in all,
        // more than every per-peer and listener limit.
        let mut idle = Vec::new();
        for host in 2..12 {
            for _ in 0..30 {
                for addr in [probes, metrics] {
                    let mut s = connect_from(host, addr).await;
                    // Refused ones may be closed already.
                    let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await;
                    idle.push(s);
                }
            }
        }
        // The kubelet (another peer) is answered at once.
        let asked = Instant::now();
        let answer = exchange(connect_from(1, probes).await, &get("/healthz", None)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let answer = exchange(connect_from(1, probes).await, &get("/readyz", None)).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "{:?}",
            asked.elapsed()
        );
        // So is a scraper.
        let answer = exchange(connect_from(1, metrics).await, &get("/metrics", None)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        // Every flooding connection is closed: at once when refused, at the header-read
        // timeout when admitted.
        for s in &mut idle {
            let mut buf = [0_u8; 256];
            let closed = tokio::time::timeout(Duration::from_secs(5), async {
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await;
            assert!(closed.is_ok(), "a half-written connection stayed open");
        }
        assert!(opened.elapsed() >= timeout - Duration::from_millis(200));
    }

    #[tokio::test]
    async fn secure_metrics_answer_401_403_and_200() {
        let (dir, files) = cert_files("health-tls-test");
        let cert = write_self_signed(&files, "localhost");
        let m = Metrics::new();
        m.controller_started("test", 1);
        let bound = serve(
            Endpoints {
                metrics: local(),
                metrics_security: MetricsSecurity::Secure {
                    tls: metrics_auth::tls_config(Some(&files)).unwrap(),
                    authorizer: Arc::new(Authorizer::new(FakeReviewer::default())),
                },
                health: None,
                probe_limits: Limits::PROBES,
                metrics_limits: Limits::METRICS,
            },
            m,
            Readiness::default(),
        )
        .await
        .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let addr = bound[0].1;

        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let https = |request: String| {
            let connector = connector.clone();
            async move {
                let tcp = TcpStream::connect(addr).await.unwrap();
                let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
                let tls = connector.connect(name, tcp).await.unwrap();
                exchange(tls, &request).await
            }
        };
        let answer = https(get("/metrics", None)).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        let answer = https(get("/metrics", Some("forged"))).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        let answer = https(get("/metrics", Some("stranger"))).await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        let answer = https(get("/metrics", Some("reader"))).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            answer.contains("controller_runtime_max_concurrent_reconciles"),
            "{answer}"
        );
        // Plain HTTP on the HTTPS port gets no metrics.
        let answer = exchange(
            TcpStream::connect(addr).await.unwrap(),
            &get("/metrics", None),
        )
        .await;
        assert!(!answer.contains("controller_runtime"), "{answer}");
    }

    #[tokio::test]
    async fn metrics_reviews_count_against_the_connections_peer() {
        use crate::runner::metrics_auth::{MAX_REVIEWS_PER_PEER, test_files::GatedReviewer};
        use std::sync::atomic::Ordering;
        let (dir, files) = cert_files("health-peers-test");
        let cert = write_self_signed(&files, "localhost");
        let (reviewer, asked, gate) = GatedReviewer::shut();
        let authorizer = Arc::new(Authorizer::new(reviewer));
        let bound = serve(
            Endpoints {
                metrics: local(),
                metrics_security: MetricsSecurity::Secure {
                    tls: metrics_auth::tls_config(Some(&files)).unwrap(),
                    authorizer: authorizer.clone(),
                },
                health: None,
                probe_limits: Limits::PROBES,
                metrics_limits: Limits::METRICS,
            },
            Metrics::new(),
            Readiness::default(),
        )
        .await
        .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let addr = bound[0].1;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        // `GET /metrics` with `token` from 127.0.0.`host`, on a task of its own.
        let scrape = |host: u8, token: &str| {
            let (connector, request) = (connector.clone(), get("/metrics", Some(token)));
            tokio::spawn(async move {
                let tcp = connect_from(host, addr).await;
                let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
                let tls = connector.connect(name, tcp).await.unwrap();
                exchange(tls, &request).await
            })
        };
        let reviews_reach = |n: usize| {
            let asked = asked.clone();
            async move {
                let deadline = Instant::now() + Duration::from_secs(5);
                while asked.load(Ordering::SeqCst) < n && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                asked.load(Ordering::SeqCst)
            }
        };
        // One peer's new tokens: its share is reviewed, the next is refused at once.
        let mut held: Vec<_> = (0..MAX_REVIEWS_PER_PEER)
            .map(|i| scrape(2, &format!("token-{i}")))
            .collect();
        assert_eq!(
            reviews_reach(MAX_REVIEWS_PER_PEER).await,
            MAX_REVIEWS_PER_PEER
        );
        let answer = scrape(2, "one-more").await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
        // Another peer is reviewed meanwhile.
        held.push(scrape(3, "other-peer"));
        assert_eq!(
            reviews_reach(MAX_REVIEWS_PER_PEER + 1).await,
            MAX_REVIEWS_PER_PEER + 1
        );
        gate.close();
        for answer in held {
            let answer = answer.await.unwrap();
            assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        }
        assert_eq!(asked.load(Ordering::SeqCst), MAX_REVIEWS_PER_PEER + 1);
        // A closed connection's tag goes with it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while authorizer.tagged_connections() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(authorizer.tagged_connections(), 0);
    }

    /// The status and body of `GET path` on the probe router.
    async fn probe(ready: &Readiness, path: &str) -> (StatusCode, String) {
        use tower::ServiceExt;
        let request = axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .unwrap();
        let answer = health_router(ready.clone()).oneshot(request).await.unwrap();
        let status = answer.status();
        let body = axum::body::to_bytes(answer.into_body(), 4096)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn readyz_answers_a_fixed_text_without_the_detail() {
        // Readiness holds no detail to serve: what is not ready and why is the runner's log's.
        let ready = Readiness::default();
        let (status, body) = probe(&ready, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "not ready");
        ready.set(true);
        let (status, body) = probe(&ready, "/readyz").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "ok");
        assert_eq!(
            probe(&ready, "/healthz").await,
            (StatusCode::OK, "ok".into())
        );
    }

    fn args(flags: &[&str]) -> RunArgs {
        let mut all = vec!["op"];
        all.extend_from_slice(flags);
        crate::runner::cli::Cli::try_parse_from_for("op", all)
            .unwrap()
            .run
    }

    /// A client that never connects (building endpoints makes no request).
    fn offline_client() -> Client {
        let service = tower::service_fn(|_: axum::http::Request<kube::client::Body>| async {
            Err::<axum::http::Response<kube::client::Body>, _>(std::io::Error::other("offline"))
        });
        Client::new(service, "default")
    }

    #[tokio::test]
    async fn endpoints_follow_the_metrics_flags() {
        let client = offline_client();
        let plain = endpoints_from_args(&args(&[]), &client).unwrap();
        assert!(matches!(plain.metrics_security, MetricsSecurity::Plain));
        assert_eq!(plain.metrics, Some(SocketAddr::from(([0, 0, 0, 0], 8080))));
        assert_eq!(plain.probe_limits, Limits::PROBES);
        assert_eq!(plain.metrics_limits, Limits::METRICS);
        let secure = endpoints_from_args(
            &args(&["--metrics-secure", "--metrics-bind-address=:8443"]),
            &client,
        )
        .unwrap();
        assert!(matches!(
            secure.metrics_security,
            MetricsSecurity::Secure { .. }
        ));
        assert_eq!(secure.metrics, Some(SocketAddr::from(([0, 0, 0, 0], 8443))));
        let off = endpoints_from_args(&args(&["--metrics-secure=false"]), &client).unwrap();
        assert!(matches!(off.metrics_security, MetricsSecurity::Plain));
        let err = endpoints_from_args(
            &args(&[
                "--metrics-secure",
                "--metrics-cert-dir=nonexistent-cert-dir",
                "--metrics-cert-name=serving.crt",
            ]),
            &client,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("nonexistent-cert-dir/serving.crt"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn secure_metrics_and_probes_cannot_share_an_address() {
        let addr = Some(SocketAddr::from(([127, 0, 0, 1], 1)));
        let err = serve(
            Endpoints {
                metrics: addr,
                metrics_security: MetricsSecurity::Secure {
                    tls: metrics_auth::tls_config(None).unwrap(),
                    authorizer: Arc::new(Authorizer::new(FakeReviewer::default())),
                },
                health: addr,
                probe_limits: Limits::PROBES,
                metrics_limits: Limits::METRICS,
            },
            Metrics::new(),
            Readiness::default(),
        )
        .await
        .unwrap_err();
        assert!(
            err.to_string().contains("--health-probe-bind-address"),
            "{err}"
        );
    }
}
