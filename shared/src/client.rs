//! The operator's kube client: client-go's flow control, and every request counted.

use std::sync::Arc;

use crate::{
    metrics::Metrics,
    rate_limit::{ClientRateLimit, RateLimitLayer, RetryThrottled, TokenBucket},
};

/// Requests the buffer under the client's own layers holds before callers wait (kube's
/// `Client` buffers 1,024 too).
const CLIENT_BUFFER: usize = 1024;

/// A kube client for `config` with client-go's flow control, whose every request is
/// counted in `rest_client_requests_total{code,method,host}` (`code` is `<error>` when no
/// response came, as client-go reports it).
///
/// The layers, outermost first: [`RetryThrottled`] sends a request again after a 429 (or
/// a 503 with `Retry-After`); [`RateLimit`](crate::rate_limit::RateLimit) makes each
/// attempt wait for a token of a [`TokenBucket`] of its own for this client (`limit`:
/// `--kube-api-qps`, `--kube-api-burst`); the metrics layer counts each attempt; a buffer
/// makes kube's service stack cloneable, as retries need.
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
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&tower::buffer::BufferLayer::new(CLIENT_BUFFER))
        .with_layer(&metrics.rest_client_layer(Arc::from(host)))
        .with_layer(&RateLimitLayer::new(TokenBucket::new(limit)))
        .with_layer(&tower::retry::RetryLayer::new(RetryThrottled::default()))
        .build())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

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
