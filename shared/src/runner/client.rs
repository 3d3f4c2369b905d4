//! The operator's kube client: HTTP/2 to the API server, client-go's flow control, and
//! every request counted.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt as _;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{ClientBuilder, ConfigExt as _, DynBody};
use tower::{BoxError, ServiceBuilder, ServiceExt as _, util::BoxService};

use crate::{
    runner::metrics::Metrics,
    runner::rate_limit::{ClientRateLimit, RateLimitLayer, RetryThrottled, TokenBucket},
};

/// Requests the buffer under the client's own layers holds before callers wait (kube's
/// `Client` buffers 1,024 too).
const CLIENT_BUFFER: usize = 1024;

/// How long an HTTP/2 connection may go without a frame from the API server before it is
/// pinged, and how long the answer may take before the connection counts as dead and every
/// request on it fails (and is made again on a new one): client-go's `ReadIdleTimeout`
/// and `PingTimeout`.
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// The service stack kube's own builder makes: one type for both transports.
type Transport =
    BoxService<http::Request<kube::client::Body>, http::Response<Box<DynBody>>, BoxError>;

/// A kube client for `config` with client-go's flow control, whose every request is
/// counted in `rest_client_requests_total{code,method,host}` (`code` is `<error>` when no
/// response came, as client-go reports it).
///
/// The transport offers HTTP/2 to an HTTPS API server (ALPN, as client-go does; see
/// [`multiplexed`]), so the watches and the writes share one connection; HTTP/1.1 where the
/// server only speaks that, and kube's own transport through a proxy or with an `exec`
/// credential plugin.
///
/// The layers, outermost first: [`RetryThrottled`] sends a request again after a 429 (or
/// a 503 with `Retry-After`); [`RateLimit`](crate::runner::rate_limit::RateLimit) makes each
/// attempt wait for a token of a [`TokenBucket`] of its own for this client (`limit`:
/// `--kube-api-qps`, `--kube-api-burst`); the metrics layer counts each attempt; a buffer
/// makes the service stack cloneable, as retries need.
///
/// Not kube's own retry (`Config::default_retry`): it sits below every layer added here,
/// so a retried attempt would neither wait for a token nor be counted, and it also retries
/// 504s, 15 times, up to 1,000 s apart. It is switched off so nothing is retried twice.
///
/// Must be called inside a tokio runtime (the buffer spawns its worker, as
/// `kube::Client::new` does).
///
/// # Errors
/// When the client cannot be built from `config` (TLS setup, proxy, auth).
pub(crate) fn client(
    mut config: kube::Config,
    metrics: &Metrics,
    limit: ClientRateLimit,
) -> Result<kube::Client, kube::Error> {
    let host = config
        .cluster_url
        .authority()
        .map(ToString::to_string)
        .unwrap_or_default();
    config.default_retry = false;
    // kube's builder knows what a proxy needs, and when a client certificate from an
    // `exec` plugin expires (it marks the client with it); neither is in reach here.
    let transport = if config.proxy_url.is_some() || config.auth_info.exec.is_some() {
        ClientBuilder::try_from(config)?
    } else {
        multiplexed(&config)?
    };
    Ok(transport
        .with_layer(&tower::buffer::BufferLayer::new(CLIENT_BUFFER))
        .with_layer(&metrics.rest_client_layer(Arc::from(host)))
        .with_layer(&RateLimitLayer::new(TokenBucket::new(limit)))
        .with_layer(&tower::retry::RetryLayer::new(RetryThrottled::default()))
        .build())
}

/// kube's transport (TLS from `config`, its timeouts, base URI, credentials and extra
/// headers) with HTTP/2 offered next to HTTP/1.1.
///
/// kube 5 speaks HTTP/1.1 only (kube-rs issue 1923: its exec and port-forward upgrades
/// need it; no operator here uses them). Over HTTP/1.1 every open watch holds a TLS
/// connection of its own and a request needs an idle one; the API server closes a
/// connection idle for 90 s, so after a quiet spell the first write pays a new TLS
/// handshake. Over HTTP/2 the watches and the requests share one connection that the
/// watches keep open, and a ping every [`PING_INTERVAL`] without traffic finds a dead one
/// (every stream on it fails and the watches start again on a new one).
fn multiplexed(config: &kube::Config) -> Result<ClientBuilder<Transport>, kube::Error> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    // HTTP/2 writes a request's HEADERS and DATA frames apart: with Nagle's algorithm the
    // second waits for the server's delayed ACK of the first (40 ms on Linux). Go's
    // net.Dial sets TCP_NODELAY too.
    http.set_nodelay(true);
    let mut tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls_pki_types::ServerName::try_from(name.clone()).map_err(|e| {
            kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e))
        })?;
        tls = tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let mut connector = hyper_timeout::TimeoutConnector::new(
        tls.enable_http1().enable_http2().wrap_connector(http),
    );
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        // The pool would drop its handle of the HTTP/2 connection when no request has
        // been made on it for 90 s (its default), though the watches keep it busy, and the
        // next write would open another. Connections a server closes leave the pool anyway.
        .pool_idle_timeout(None)
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector);
    // Every request in a `DEBUG` span `HTTP` ([`request_span`]) with one `requesting` event
    // in it, as kube's own transport logs them: `RUST_LOG` with
    // `shared::runner::client=debug` gives one log line per request (the tests and the
    // bench count an operator's requests from them; xtask's `requests`). Traces export the
    // span whatever the log level, as a child of the reconcile that made the request.
    let request_log = tower_http::trace::TraceLayer::new_for_http()
        .make_span_with(request_span::<kube::client::Body>)
        .on_request(|_: &http::Request<kube::client::Body>, _: &tracing::Span| {
            tracing::debug!("requesting");
        })
        .on_response(
            |response: &http::Response<hyper::body::Incoming>,
             _: Duration,
             span: &tracing::Span| {
                span.record("http.status_code", response.status().as_u16());
                if response.status().is_client_error() || response.status().is_server_error() {
                    span.record("otel.status_code", "error");
                }
            },
        )
        .on_body_chunk(())
        .on_eos(())
        .on_failure(
            |failure: tower_http::classify::ServerErrorsFailureClass,
             _: Duration,
             span: &tracing::Span| {
                span.record("otel.status_code", "error");
                tracing::debug!(%failure, "no answer, or a server error");
            },
        );
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(request_log)
        .service(hyper.map_err(BoxError::from))
        .map_response(boxed_body);
    Ok(ClientBuilder::new(
        BoxService::new(service),
        config.default_namespace.clone(),
    ))
}

/// The `DEBUG` span `HTTP` of one API request: `http.method`, `http.url` (the path and
/// query: the API server's address is the same for every request), `http.status_code`
/// when the answer comes; for traces `otel.name` (`GET pods`, `PATCH podsets/status`),
/// `otel.kind` (`client`) and `otel.status_code` (`error` on a 4xx or 5xx, or no answer).
pub(super) fn request_span<B>(request: &http::Request<B>) -> tracing::Span {
    let uri = request.uri();
    tracing::debug_span!(
        "HTTP",
        http.method = %request.method(),
        http.url = uri.path_and_query().map_or(uri.path(), http::uri::PathAndQuery::as_str),
        http.status_code = tracing::field::Empty,
        otel.name = %format_args!("{} {}", request.method(), resource_of(uri.path())),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
    )
}

/// The resource (and subresource) an API path names: `pods` for
/// `/api/v1/namespaces/a/pods/b`, `podsets/status` for
/// `/apis/batch.tutorial.kubebuilder.io/v1/namespaces/a/podsets/b/status`, `namespaces`
/// for `/api/v1/namespaces/a`; any other path as it is.
fn resource_of(path: &str) -> ApiResource<'_> {
    let rest = if let Some(rest) = path.strip_prefix("/api/") {
        rest.split_once('/').map(|(_version, rest)| rest)
    } else if let Some(rest) = path.strip_prefix("/apis/") {
        rest.splitn(3, '/').nth(2)
    } else {
        None
    };
    let Some(mut rest) = rest.map(|r| r.trim_end_matches('/')) else {
        return ApiResource(path, None);
    };
    // `namespaces/<ns>/<resource>...`, unless the namespace itself is the object.
    if let Some(namespaced) = rest.strip_prefix("namespaces/") {
        match namespaced.split_once('/') {
            Some((_namespace, inner)) => rest = inner,
            None => return ApiResource("namespaces", None),
        }
    }
    // `<resource>[/<name>[/<subresource>]]`
    let mut parts = rest.splitn(3, '/');
    let resource = parts.next().unwrap_or_default();
    let subresource = parts.nth(1).filter(|s| !s.is_empty());
    ApiResource(resource, subresource)
}

/// A resource and its subresource, shown as `pods` or `podsets/status`.
struct ApiResource<'a>(&'a str, Option<&'a str>);

impl std::fmt::Display for ApiResource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)?;
        if let Some(subresource) = self.1 {
            write!(f, "/{subresource}")?;
        }
        Ok(())
    }
}

/// An answer with its body boxed, as kube's stack returns it.
fn boxed_body<B>(response: http::Response<B>) -> http::Response<Box<DynBody>>
where
    B: hyper::body::Body<Data = hyper::body::Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    response.map(|body| Box::new(body.map_err(Into::into)) as Box<DynBody>)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[test]
    fn a_request_span_is_named_by_its_method_and_resource() {
        for (path, resource) in [
            ("/api/v1/namespaces/a/pods", "pods"),
            ("/api/v1/namespaces/a/pods/b", "pods"),
            ("/api/v1/namespaces/a/pods/b/log", "pods/log"),
            ("/api/v1/namespaces/a", "namespaces"),
            ("/api/v1/namespaces", "namespaces"),
            ("/api/v1/nodes/n/", "nodes"),
            (
                "/apis/batch.tutorial.kubebuilder.io/v1/namespaces/a/podsets/b/status",
                "podsets/status",
            ),
            (
                "/apis/coordination.k8s.io/v1/namespaces/a/leases/l",
                "leases",
            ),
            (
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/x",
                "customresourcedefinitions",
            ),
            ("/version", "/version"),
        ] {
            assert_eq!(resource_of(path).to_string(), resource, "{path}");
        }
    }

    /// Over HTTPS the client offers HTTP/2 (ALPN) as client-go does: a watch that stays
    /// open and the requests made while it runs share one connection.
    #[cfg(feature = "secure-metrics")]
    #[tokio::test]
    async fn over_https_a_watch_and_the_requests_beside_it_share_one_http2_connection() {
        use std::sync::Mutex;

        use futures::StreamExt as _;
        use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
        use hyper::body::{Bytes, Frame};
        use hyper_util::rt::TokioIo;
        use k8s_openapi::api::core::v1::ConfigMap;

        type Answer = BoxBody<Bytes, std::convert::Infallible>;
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
        let key = rustls_pki_types::PrivateKeyDer::Pkcs8(signing_key.serialize_der().into());
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .unwrap();
        // An API server that speaks HTTP/2 only: a client that did not offer it fails.
        tls.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicU64::new(0));
        let seen = Arc::new(Mutex::new(Vec::<(http::Version, String)>::new()));
        let (accepted, requests) = (connections.clone(), seen.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                let (acceptor, requests) = (acceptor.clone(), requests.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let answer = hyper::service::service_fn(move |request: http::Request<_>| {
                        let query = request.uri().query().unwrap_or_default().to_owned();
                        requests
                            .lock()
                            .unwrap()
                            .push((request.version(), query.clone()));
                        let body: Answer = if query.contains("watch=true") {
                            let event = r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"default","resourceVersion":"1"}}}
"#;
                            let first =
                                futures::stream::iter([Ok(Frame::data(Bytes::from(event)))]);
                            BodyExt::boxed(StreamBody::new(first.chain(futures::stream::pending())))
                        } else {
                            let cm = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"default"}}"#;
                            Full::new(Bytes::from(cm)).boxed()
                        };
                        let response = http::Response::builder()
                            .header("content-type", "application/json")
                            .body(body);
                        async move { response }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), answer)
                        .await;
                });
            }
        });

        let mut config = kube::Config::new(format!("https://{addr}").parse().unwrap());
        config.root_cert = Some(vec![cert.der().to_vec()]);
        let client = client(config, &Metrics::new(), ClientRateLimit::default()).unwrap();
        let api = kube::Api::<ConfigMap>::namespaced(client, "default");
        let mut watch = api
            .watch(&kube::api::WatchParams::default(), "0")
            .await
            .unwrap()
            .boxed();
        assert!(matches!(
            watch.next().await,
            Some(Ok(kube::api::WatchEvent::Added(_)))
        ));
        for _ in 0..2 {
            api.get("x").await.unwrap();
        }
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert!(
            seen.iter().all(|(v, _)| *v == http::Version::HTTP_2),
            "{seen:?}"
        );
        assert_eq!(connections.load(Ordering::SeqCst), 1);
        drop(watch);
    }

    /// The whole client stack against a local HTTP server: a 429 is answered again after
    /// its `Retry-After`, the caller gets the second answer, and both attempts are counted
    /// (kube's own retry, below the metrics layer, would have hidden the 429).
    #[tokio::test]
    async fn the_client_retries_a_429_and_counts_every_attempt() {
        use axum::{http::StatusCode, response::IntoResponse};
        use k8s_openapi::api::core::v1::ConfigMap;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(AtomicU64::new(0));
        let counter = calls.clone();
        let app = axum::Router::new().route(
            "/api/v1/namespaces/default/configmaps/x",
            axum::routing::get(move || {
                let counter = counter.clone();
                async move {
                    let json = [("content-type", "application/json")];
                    if counter.fetch_add(1, Ordering::SeqCst) == 0 {
                        let status = r#"{"apiVersion":"v1","kind":"Status","status":"Failure","reason":"TooManyRequests","code":429}"#;
                        (
                            StatusCode::TOO_MANY_REQUESTS,
                            [("content-type", "application/json"), ("retry-after", "1")],
                            status,
                        )
                            .into_response()
                    } else {
                        let cm = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"default"},"data":{"k":"v"}}"#;
                        (StatusCode::OK, json, cm).into_response()
                    }
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });

        let m = Metrics::new();
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let client = client(config, &m, ClientRateLimit::default()).unwrap();
        let started = std::time::Instant::now();
        let cm = kube::Api::<ConfigMap>::namespaced(client, "default")
            .get("x")
            .await
            .unwrap();
        assert!(started.elapsed() >= std::time::Duration::from_secs(1));
        assert_eq!(
            cm.data.unwrap_or_default().get("k").map(String::as_str),
            Some("v")
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let text = m.encode();
        for code in ["429", "200"] {
            let needle = format!(
                r#"rest_client_requests_total{{code="{code}",method="GET",host="{addr}"}} 1"#
            );
            assert!(text.contains(&needle), "missing {needle} in\n{text}");
        }
    }
}
