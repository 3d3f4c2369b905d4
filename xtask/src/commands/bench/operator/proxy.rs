//! Counting an operator's API requests: a plain-HTTP proxy on 127.0.0.1 in front of the
//! API server.
//!
//! The operator under test (the Rust operator or the Go original) gets a kubeconfig whose
//! server is this proxy, and the proxy forwards every request over TLS with the
//! credentials of a kubeconfig it was given (the Rust operator's ServiceAccount token,
//! the admin's for the Go original), recording its verb and resource on the way. Each
//! request is counted as the API server would count it: watches and retries included.
//! Both pay the same extra hop (loopback HTTP/1.1, well under a millisecond) and neither
//! pays for TLS or for a request log; the proxy's CPU is the bench's.
//!
//! Upstream, the proxy speaks HTTP/2 over one connection, as both operators' own clients
//! do in a cluster (client-go, and `shared`'s client): the forwarded watches keep it open,
//! so the first write after a quiet spell does not wait for a new TLS connection (over
//! HTTP/1.1 the API server closes a connection idle for 90 s, and the first scale after
//! the bench's restart phase took 50 ms more than the others).

use anyhow::{Context, Result};
use axum::body::Body as AxumBody;
use axum::http::{Request, Response, StatusCode, header};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::Client;
use kube::client::{ClientBuilder, ConfigExt as _};
use kube::config::{Cluster, Context as KubeContext, Kubeconfig, NamedCluster, NamedContext};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use tower::ServiceExt as _;
use xtask::say_err;
use xtask::support::logged_requests;

/// Headers that belong to one hop (RFC 9110 section 7.6.1), not passed on.
const HOP_BY_HOP: [header::HeaderName; 5] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
    header::TRAILER,
];

/// The largest request body forwarded (a Kubernetes object is at most ~1.5 MiB).
const MAX_BODY: usize = 4 << 20;

/// The running proxy; stops when dropped.
pub(super) struct CountingProxy {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to the API server of
    /// `kubeconfig`, with its credentials.
    pub(super) async fn start(kubeconfig: &Path) -> Result<Self> {
        let client = upstream(kubeconfig).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the counting proxy")?;
        let addr = listener.local_addr()?;
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let router = axum::Router::new().fallback({
            let seen = seen.clone();
            move |request: Request<AxumBody>| forward(client.clone(), seen.clone(), request)
        });
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                say_err!("bench: counting proxy stopped: {e}");
            }
        });
        Ok(Self { addr, seen, task })
    }

    /// Writes a kubeconfig that points at the proxy (no credentials: the proxy adds them).
    pub(super) fn write_kubeconfig(&self, path: &Path) -> Result<()> {
        let config = Kubeconfig {
            clusters: vec![NamedCluster {
                name: "bench-proxy".into(),
                cluster: Some(Cluster {
                    server: Some(format!("http://{}", self.addr)),
                    ..Cluster::default()
                }),
                other: Default::default(),
            }],
            contexts: vec![NamedContext {
                name: "bench-proxy".into(),
                context: Some(KubeContext {
                    cluster: "bench-proxy".into(),
                    ..KubeContext::default()
                }),
                other: Default::default(),
            }],
            current_context: Some("bench-proxy".into()),
            ..Kubeconfig::default()
        };
        xtask::support::kubeconfig::write(&config, path)
    }

    /// Requests forwarded so far (a phase boundary).
    pub(super) fn len(&self) -> usize {
        self.seen.lock().map_or(0, |s| s.len())
    }

    /// The requests from the `from`-th to the `to`-th, by `"<verb> <resource>"`.
    pub(super) fn count(&self, from: usize, to: usize) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        if let Ok(seen) = self.seen.lock() {
            for key in seen.get(from..to.min(seen.len())).unwrap_or_default() {
                *counts.entry(key.clone()).or_insert(0) += 1;
            }
        }
        counts
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A client for the API server of `kubeconfig`, with its credentials, over one HTTP/2
/// connection (offered by ALPN; the API server speaks it), with `TCP_NODELAY` as Go sets
/// it, and kept however long no request starts on it.
async fn upstream(kubeconfig: &Path) -> Result<Client> {
    let config = xtask::support::kubeconfig::config_from(kubeconfig).await?;
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_only()
        .enable_http2()
        .wrap_connector(tcp);
    let http2 = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_idle_timeout(None)
        .build(tls);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        // The auth layer's `Either` answers errors as `BoxError`.
        .service(http2.map_err(tower::BoxError::from));
    Ok(ClientBuilder::new(service, config.default_namespace.clone()).build())
}

/// Records `request` and sends it on; the answer (a watch's stream included) comes back
/// as the API server sent it.
async fn forward(
    client: Client,
    seen: Arc<Mutex<Vec<String>>>,
    request: Request<AxumBody>,
) -> Response<AxumBody> {
    let (parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), ToString::to_string);
    if let Some(r) = logged_requests::classify(parts.method.as_str(), &path)
        && let Ok(mut seen) = seen.lock()
    {
        seen.push(format!("{} {}", r.verb, r.resource));
    }
    let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return failure(StatusCode::BAD_REQUEST, &format!("reading the body: {e}")),
    };
    let mut out = Request::builder().method(parts.method).uri(path);
    for (name, value) in &parts.headers {
        // The client's own host, framing and compression stay on this hop; the bench's
        // client adds its host and credentials.
        if HOP_BY_HOP.contains(name)
            || [
                header::HOST,
                header::CONTENT_LENGTH,
                header::ACCEPT_ENCODING,
            ]
            .contains(name)
        {
            continue;
        }
        out = out.header(name, value);
    }
    let out = match out.body(kube::client::Body::from(bytes.to_vec())) {
        Ok(r) => r,
        Err(e) => return failure(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    match client.send(out).await {
        Ok(answer) => {
            let (mut parts, body) = answer.into_parts();
            for name in &HOP_BY_HOP {
                parts.headers.remove(name);
            }
            Response::from_parts(parts, AxumBody::new(body))
        }
        Err(e) => failure(StatusCode::BAD_GATEWAY, &e.to_string()),
    }
}

/// A plain-text error answer.
fn failure(code: StatusCode, message: &str) -> Response<AxumBody> {
    let mut answer = Response::new(AxumBody::from(format!("bench proxy: {message}\n")));
    *answer.status_mut() = code;
    answer
}
