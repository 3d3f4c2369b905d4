//! The tower layer that counts every request of the kube client in
//! `rest_client_requests_total{code,method,host}` (stacked by the client module).

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use axum::http::{Request, Response};
use futures::future::BoxFuture;
use prometheus_client::metrics::{counter::Counter, family::Family};

use super::Labels;

/// The tower layer of the kube client that counts its requests.
#[derive(Debug, Clone)]
pub(crate) struct RestClientMetrics {
    /// `rest_client_requests_total`.
    pub(crate) requests: Family<Labels, Counter>,
    /// The API server's `host:port`, the `host` label.
    pub(crate) host: Arc<str>,
}

impl<S> tower_layer::Layer<S> for RestClientMetrics {
    type Service = RestClientMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RestClientMetricsService {
            inner,
            metrics: self.clone(),
        }
    }
}

/// Counts each request of the inner service by status code, method and host.
#[derive(Debug, Clone)]
pub(crate) struct RestClientMetricsService<S> {
    inner: S,
    metrics: RestClientMetrics,
}

impl<S, ReqBody, ResBody> tower_service::Service<Request<ReqBody>> for RestClientMetricsService<S>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let method = request.method().as_str().to_owned();
        let metrics = self.metrics.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "<error>".to_owned(),
            };
            metrics
                .requests
                .get_or_create(&vec![
                    ("code", code),
                    ("method", method),
                    ("host", metrics.host.to_string()),
                ])
                .inc();
            result
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::runner::metrics::Metrics;

    #[tokio::test]
    async fn the_client_layer_counts_requests_by_code_method_and_host() {
        use tower_layer::Layer;
        use tower_service::Service;
        let m = Metrics::new();
        let layer = RestClientMetrics {
            requests: m.rest_client_requests_total.clone(),
            host: Arc::from("127.0.0.1:6443"),
        };
        let inner = tower::service_fn(|req: Request<()>| async move {
            if req.uri().path() == "/fail" {
                return Err("connection refused");
            }
            let status = if req.uri().path() == "/missing" {
                404
            } else {
                200
            };
            Ok(Response::builder().status(status).body(()).unwrap())
        });
        let mut svc = layer.layer(inner);
        for (method, path) in [
            ("GET", "/ok"),
            ("GET", "/ok"),
            ("PATCH", "/missing"),
            ("GET", "/fail"),
        ] {
            let req = Request::builder()
                .method(method)
                .uri(path)
                .body(())
                .unwrap();
            let _ = svc.call(req).await;
        }
        let text = m.encode();
        for needle in [
            r#"rest_client_requests_total{code="200",method="GET",host="127.0.0.1:6443"} 2"#,
            r#"rest_client_requests_total{code="404",method="PATCH",host="127.0.0.1:6443"} 1"#,
            r#"rest_client_requests_total{code="<error>",method="GET",host="127.0.0.1:6443"} 1"#,
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
