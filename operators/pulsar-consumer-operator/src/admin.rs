//! Reading a subscription's backlog from the Pulsar admin REST API:
//! `GET <adminUrl>/admin/v2/<persistent|non-persistent>/<tenant>/<namespace>/<topic>/stats`
//! -> `subscriptions[<subscription>].msgBacklog`, or `/partitioned-stats` for a partitioned
//! topic (the broker sums its partitions there; the per-partition figures are summed here
//! when only they are given).
//!
//! The pure parts (topic names, URLs, the JSON) are unit-tested below; [`AdminClient`] does
//! the HTTP.
//!
//! HTTP client: hyper-util's client over hyper-rustls (ring, native roots, HTTP/1 only),
//! the very crates kube already builds for its own connection, so the operator gains no new
//! dependency tree (reqwest would add one) and no OpenSSL.

use std::{sync::OnceLock, time::Duration};

use http_body_util::{BodyExt, Empty, Limited};
use hyper::{
    Request, StatusCode,
    body::Bytes,
    header::{ACCEPT, USER_AGENT},
};
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use serde_json::Value;

/// Pulsar's standard web service (admin API) port, for `pulsar://` service URLs.
pub const DEFAULT_ADMIN_PORT: u16 = 8080;
/// Pulsar's standard TLS web service port, for `pulsar+ssl://` service URLs.
pub const DEFAULT_ADMIN_TLS_PORT: u16 = 8443;
/// The largest stats document read (a topic with many partitions and consumers).
pub const MAX_BODY_BYTES: usize = 8 << 20;
/// How long connecting to the admin API may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A topic as the admin API names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic {
    /// `persistent` or `non-persistent`.
    pub domain: &'static str,
    /// The tenant.
    pub tenant: String,
    /// The namespace.
    pub namespace: String,
    /// The topic's local name.
    pub name: String,
}

/// The topic `spec.topic` names: `my-topic` (in `public/default`), `tenant/ns/topic`, or
/// either with a `persistent://` or `non-persistent://` domain. `None` when malformed.
#[must_use]
pub fn parse_topic(topic: &str) -> Option<Topic> {
    let (domain, rest) = if let Some(rest) = topic.strip_prefix("persistent://") {
        ("persistent", rest)
    } else if let Some(rest) = topic.strip_prefix("non-persistent://") {
        ("non-persistent", rest)
    } else {
        ("persistent", topic)
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let (tenant, namespace, name) = match parts.as_slice() {
        [name] if !topic.contains("://") => ("public", "default", *name),
        [tenant, namespace, name] => (*tenant, *namespace, *name),
        _ => return None,
    };
    if [tenant, namespace, name].iter().any(|p| p.is_empty()) {
        return None;
    }
    Some(Topic {
        domain,
        tenant: tenant.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    })
}

/// The admin URL to use when `spec.autoscaling.adminUrl` is unset: the host of
/// `serverAddress` with port 8080 (`http`) for `pulsar://`, 8443 (`https`) for
/// `pulsar+ssl://`. `None` when the address is malformed.
#[must_use]
pub fn default_admin_url(server_address: &str) -> Option<String> {
    let (scheme, port, rest) = if let Some(rest) = server_address.strip_prefix("pulsar://") {
        ("http", DEFAULT_ADMIN_PORT, rest)
    } else if let Some(rest) = server_address.strip_prefix("pulsar+ssl://") {
        ("https", DEFAULT_ADMIN_TLS_PORT, rest)
    } else {
        return None;
    };
    let (host, _) = rest.rsplit_once(':')?;
    (!host.is_empty()).then(|| format!("{scheme}://{host}:{port}"))
}

/// Percent-encodes one path segment (everything but RFC 3986's unreserved characters).
#[must_use]
pub fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The stats URL of `topic` under `admin_url`; `partitioned` picks `/partitioned-stats`.
#[must_use]
pub fn stats_url(admin_url: &str, topic: &Topic, partitioned: bool) -> String {
    format!(
        "{}/admin/v2/{}/{}/{}/{}/{}",
        admin_url.trim_end_matches('/'),
        topic.domain,
        encode_segment(&topic.tenant),
        encode_segment(&topic.namespace),
        encode_segment(&topic.name),
        if partitioned {
            "partitioned-stats"
        } else {
            "stats"
        }
    )
}

/// Why the backlog could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    /// No answer: connection refused, timeout, TLS failure, a 5xx.
    #[error("the Pulsar admin API at {url} cannot be read: {message}")]
    Unavailable {
        /// The URL asked.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The broker does not know the topic.
    #[error("the topic {0} does not exist (the consumers create it when they subscribe)")]
    TopicNotFound(String),
    /// The topic has no such subscription (yet).
    #[error(
        "the topic {topic} has no subscription {subscription} (a consumer creates it when it subscribes)"
    )]
    SubscriptionNotFound {
        /// The topic.
        topic: String,
        /// The subscription.
        subscription: String,
    },
    /// Any other answer (401/403, not JSON, no `msgBacklog`).
    #[error("unexpected answer from the Pulsar admin API at {url}: {message}")]
    BadResponse {
        /// The URL asked.
        url: String,
        /// What was wrong with it.
        message: String,
    },
}

impl AdminError {
    /// The `ScalingActive=False` reason.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            AdminError::Unavailable { .. } => "AdminAPIUnavailable",
            AdminError::TopicNotFound(_) => "TopicNotFound",
            AdminError::SubscriptionNotFound { .. } => "SubscriptionNotFound",
            AdminError::BadResponse { .. } => "InvalidAdminResponse",
        }
    }
}

/// The backlog of `subscription` in a stats document: `subscriptions[sub].msgBacklog`,
/// or the sum over `partitions[*].subscriptions[sub].msgBacklog` when the document has
/// per-partition figures only. `None` when the subscription is not there.
///
/// # Errors
/// A message when the document is not a stats document.
pub fn backlog_from_stats(stats: &Value, subscription: &str) -> Result<Option<u64>, String> {
    let backlog_of = |subs: &Value| -> Result<Option<u64>, String> {
        match subs.get(subscription) {
            None => Ok(None),
            Some(sub) => sub
                .get("msgBacklog")
                .and_then(Value::as_u64)
                .map(Some)
                .ok_or_else(|| format!("subscription {subscription} has no msgBacklog")),
        }
    };
    if let Some(subs) = stats.get("subscriptions").filter(|s| s.is_object())
        && let Some(backlog) = backlog_of(subs)?
    {
        return Ok(Some(backlog));
    }
    if let Some(partitions) = stats.get("partitions").and_then(Value::as_object)
        && !partitions.is_empty()
    {
        let mut total: Option<u64> = None;
        for p in partitions.values() {
            if let Some(b) = p
                .get("subscriptions")
                .map(backlog_of)
                .transpose()?
                .flatten()
            {
                total = Some(total.unwrap_or(0).saturating_add(b));
            }
        }
        return Ok(total);
    }
    if stats.get("subscriptions").is_some_and(Value::is_object) {
        return Ok(None);
    }
    Err("not a topic stats document (no subscriptions)".to_owned())
}

/// Where to read one PulsarConsumer's backlog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The admin API's base URL.
    pub admin_url: String,
    /// The topic.
    pub topic: Topic,
    /// The subscription.
    pub subscription: String,
}

impl Target {
    /// The topic's full name, for messages.
    #[must_use]
    pub fn topic_name(&self) -> String {
        let t = &self.topic;
        format!("{}://{}/{}/{}", t.domain, t.tenant, t.namespace, t.name)
    }
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// A client of Pulsar admin APIs, shared by all PulsarConsumers (one connection pool). Its
/// TLS roots are loaded on first use, so an operator without autoscaling never loads them.
#[derive(Default)]
pub struct AdminClient {
    http: OnceLock<Result<HttpClient, String>>,
}

impl std::fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminClient").finish_non_exhaustive()
    }
}

/// The HTTP(S) client: rustls with ring and the system's CA certificates; without any,
/// an empty trust store (plain http works, https fails each read with a clear error).
fn build_client() -> Result<HttpClient, String> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let provider = rustls::crypto::ring::default_provider();
    let builder = match hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(provider.clone())
    {
        Ok(b) => b,
        Err(error) => {
            tracing::warn!(%error, "no CA certificates: https admin URLs cannot be verified");
            let config = rustls::ClientConfig::builder_with_provider(provider.into())
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("cannot set up TLS: {e}"))?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
        }
    };
    let connector = builder.https_or_http().enable_http1().wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(2)
        .build(connector))
}

impl AdminClient {
    /// GET `url`: the status and the body (at most [`MAX_BODY_BYTES`]).
    async fn get(&self, url: &str) -> Result<(StatusCode, Bytes), AdminError> {
        let unavailable = |message: String| AdminError::Unavailable {
            url: url.to_owned(),
            message,
        };
        let request = Request::get(url)
            .header(ACCEPT, "application/json")
            .header(USER_AGENT, crate::OPERATOR.name)
            .body(Empty::<Bytes>::new())
            .map_err(|e| AdminError::BadResponse {
                url: url.to_owned(),
                message: format!("invalid URL: {e}"),
            })?;
        let http = self
            .http
            .get_or_init(build_client)
            .as_ref()
            .map_err(|e| unavailable(e.clone()))?;
        let response = http.request(request).await.map_err(|e| {
            // The innermost cause says what happened (refused, TLS, DNS).
            let mut message = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                message = s.to_string();
                source = s.source();
            }
            unavailable(message)
        })?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|e| unavailable(format!("reading the answer: {e}")))?
            .to_bytes();
        Ok((status, body))
    }

    /// The backlog of the target's subscription. `partitioned` is what was learnt of the
    /// topic before (updated here): one request when it is right, a second one only when the
    /// topic turns out to be (or no longer be) partitioned.
    ///
    /// # Errors
    /// [`AdminError`] when the backlog cannot be read.
    pub async fn backlog(
        &self,
        target: &Target,
        partitioned: &mut bool,
    ) -> Result<u64, AdminError> {
        match self.backlog_once(target, *partitioned).await {
            Err(AdminError::TopicNotFound(_)) => {
                let other = !*partitioned;
                let result = self.backlog_once(target, other).await;
                if !matches!(result, Err(AdminError::TopicNotFound(_))) {
                    *partitioned = other;
                }
                result
            }
            result => result,
        }
    }

    async fn backlog_once(&self, target: &Target, partitioned: bool) -> Result<u64, AdminError> {
        let url = stats_url(&target.admin_url, &target.topic, partitioned);
        let (status, body) = self.get(&url).await?;
        let bad = |message: String| AdminError::BadResponse {
            url: url.clone(),
            message,
        };
        if status == StatusCode::NOT_FOUND {
            return Err(AdminError::TopicNotFound(target.topic_name()));
        }
        if status.is_server_error() {
            return Err(AdminError::Unavailable {
                url: url.clone(),
                message: format!("HTTP {status}: {}", snippet(&body)),
            });
        }
        if !status.is_success() {
            return Err(bad(format!("HTTP {status}: {}", snippet(&body))));
        }
        let stats: Value =
            serde_json::from_slice(&body).map_err(|e| bad(format!("not JSON: {e}")))?;
        backlog_from_stats(&stats, &target.subscription)
            .map_err(bad)?
            .ok_or_else(|| AdminError::SubscriptionNotFound {
                topic: target.topic_name(),
                subscription: target.subscription.clone(),
            })
    }
}

/// The start of a body, for error messages.
fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn topics_in_every_form() {
        let t = |domain: &'static str, tenant: &str, ns: &str, name: &str| Topic {
            domain,
            tenant: tenant.into(),
            namespace: ns.into(),
            name: name.into(),
        };
        assert_eq!(
            parse_topic("my-topic"),
            Some(t("persistent", "public", "default", "my-topic"))
        );
        assert_eq!(
            parse_topic("acme/orders/in"),
            Some(t("persistent", "acme", "orders", "in"))
        );
        assert_eq!(
            parse_topic("persistent://acme/orders/in"),
            Some(t("persistent", "acme", "orders", "in"))
        );
        assert_eq!(
            parse_topic("non-persistent://public/default/t-partition-0"),
            Some(t("non-persistent", "public", "default", "t-partition-0"))
        );
        for bad in [
            "",
            "a/b",
            "persistent://a",
            "persistent://a/b",
            "a/b/c/d",
            "persistent://a//c",
        ] {
            assert_eq!(parse_topic(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn admin_url_defaults_to_the_standard_ports() {
        assert_eq!(
            default_admin_url("pulsar://broker.pulsar:6650").as_deref(),
            Some("http://broker.pulsar:8080")
        );
        assert_eq!(
            default_admin_url("pulsar+ssl://broker:6651").as_deref(),
            Some("https://broker:8443")
        );
        assert_eq!(
            default_admin_url("pulsar://[::1]:6650").as_deref(),
            Some("http://[::1]:8080")
        );
        assert_eq!(default_admin_url("http://x:1"), None);
        assert_eq!(default_admin_url("pulsar://nohost"), None);
    }

    #[test]
    fn stats_urls_are_encoded() {
        let topic = parse_topic("persistent://acme/orders/in #1").unwrap_or_else(|| panic!());
        assert_eq!(
            stats_url("http://127.0.0.1:18080/", &topic, false),
            "http://127.0.0.1:18080/admin/v2/persistent/acme/orders/in%20%231/stats"
        );
        let topic = parse_topic("non-persistent://a/b/c").unwrap_or_else(|| panic!());
        assert_eq!(
            stats_url("https://h:8443", &topic, true),
            "https://h:8443/admin/v2/non-persistent/a/b/c/partitioned-stats"
        );
        assert_eq!(encode_segment("a-b_c.d~e"), "a-b_c.d~e");
        assert_eq!(encode_segment("ä/?"), "%C3%A4%2F%3F");
    }

    #[test]
    fn backlog_of_a_subscription() {
        let stats = json!({
            "msgRateIn": 0.0,
            "subscriptions": {
                "mine": {"msgBacklog": 20000, "type": "Shared"},
                "other": {"msgBacklog": 5}
            }
        });
        assert_eq!(backlog_from_stats(&stats, "mine"), Ok(Some(20_000)));
        assert_eq!(backlog_from_stats(&stats, "missing"), Ok(None));
        assert!(backlog_from_stats(&json!({"subscriptions": {"mine": {}}}), "mine").is_err());
        assert!(backlog_from_stats(&json!({"reason": "x"}), "mine").is_err());
        assert!(backlog_from_stats(&json!([1, 2]), "mine").is_err());
    }

    #[test]
    fn partitions_are_summed_when_only_they_are_given() {
        let stats = json!({
            "subscriptions": {},
            "partitions": {
                "persistent://public/default/t-partition-0": {"subscriptions": {"mine": {"msgBacklog": 3}}},
                "persistent://public/default/t-partition-1": {"subscriptions": {"mine": {"msgBacklog": 4}}},
                "persistent://public/default/t-partition-2": {"subscriptions": {}}
            }
        });
        assert_eq!(backlog_from_stats(&stats, "mine"), Ok(Some(7)));
        assert_eq!(backlog_from_stats(&stats, "missing"), Ok(None));
        // The broker's own sum wins when it is there.
        let summed = json!({
            "subscriptions": {"mine": {"msgBacklog": 7}},
            "partitions": {"p0": {"subscriptions": {"mine": {"msgBacklog": 3}}}}
        });
        assert_eq!(backlog_from_stats(&summed, "mine"), Ok(Some(7)));
    }

    #[test]
    fn error_reasons() {
        let u = AdminError::Unavailable {
            url: "http://x:1/a".into(),
            message: "Connection refused".into(),
        };
        assert_eq!(u.reason(), "AdminAPIUnavailable");
        assert!(u.to_string().contains("http://x:1/a"));
        assert_eq!(
            AdminError::TopicNotFound("t".into()).reason(),
            "TopicNotFound"
        );
        let s = AdminError::SubscriptionNotFound {
            topic: "persistent://a/b/c".into(),
            subscription: "s".into(),
        };
        assert_eq!(s.reason(), "SubscriptionNotFound");
        assert!(s.to_string().contains("no subscription s"));
        assert_eq!(snippet(&[b'x'; 300]).len(), 203);
    }

    /// A one-route-per-path HTTP server on 127.0.0.1 answering `(status, body)` for the
    /// paths it knows and 404 otherwise; counts the requests.
    async fn fake_admin(
        routes: Vec<(&'static str, u16, String)>,
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = count.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let routes = routes.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&buf).to_string();
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                    let (code, body) = routes
                        .iter()
                        .find(|(p, _, _)| *p == path)
                        .map(|(_, c, b)| (*c, b.clone()))
                        .unwrap_or((404, r#"{"reason":"Topic not found"}"#.to_owned()));
                    let response = format!(
                        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = conn.write_all(response.as_bytes()).await;
                });
            }
        });
        (url, count)
    }

    fn target(url: &str, topic: &str) -> Target {
        Target {
            admin_url: url.to_owned(),
            topic: parse_topic(topic).unwrap(),
            subscription: "sub".to_owned(),
        }
    }

    #[tokio::test]
    async fn reads_the_backlog_over_http() {
        let stats = json!({"subscriptions": {"sub": {"msgBacklog": 42}}}).to_string();
        let (url, count) = fake_admin(vec![(
            "/admin/v2/persistent/public/default/t/stats",
            200,
            stats,
        )])
        .await;
        let client = AdminClient::default();
        let mut partitioned = false;
        let b = client.backlog(&target(&url, "t"), &mut partitioned).await;
        assert_eq!(b, Ok(42));
        assert!(!partitioned);
        assert_eq!(
            count.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one request"
        );
    }

    #[tokio::test]
    async fn finds_a_partitioned_topic_once_and_remembers() {
        let stats = json!({"subscriptions": {"sub": {"msgBacklog": 7}}}).to_string();
        let (url, count) = fake_admin(vec![(
            "/admin/v2/non-persistent/a/b/p/partitioned-stats",
            200,
            stats,
        )])
        .await;
        let client = AdminClient::default();
        let t = target(&url, "non-persistent://a/b/p");
        let mut partitioned = false;
        assert_eq!(client.backlog(&t, &mut partitioned).await, Ok(7));
        assert!(partitioned);
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 2);
        // Next time: one request.
        assert_eq!(client.backlog(&t, &mut partitioned).await, Ok(7));
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn reports_why_it_cannot_read() {
        let (url, _) = fake_admin(vec![
            (
                "/admin/v2/persistent/public/default/nosub/stats",
                200,
                json!({"subscriptions": {"other": {"msgBacklog": 1}}}).to_string(),
            ),
            (
                "/admin/v2/persistent/public/default/broken/stats",
                500,
                "boom".to_owned(),
            ),
            (
                "/admin/v2/persistent/public/default/denied/stats",
                401,
                "no".to_owned(),
            ),
            (
                "/admin/v2/persistent/public/default/html/stats",
                200,
                "<html>".to_owned(),
            ),
        ])
        .await;
        let client = AdminClient::default();
        let reason = |topic: &'static str| {
            let client = &client;
            let url = url.clone();
            async move {
                let mut partitioned = false;
                client
                    .backlog(&target(&url, topic), &mut partitioned)
                    .await
                    .map_err(|e| e.reason())
            }
        };
        assert_eq!(reason("missing").await, Err("TopicNotFound"));
        assert_eq!(reason("nosub").await, Err("SubscriptionNotFound"));
        assert_eq!(reason("broken").await, Err("AdminAPIUnavailable"));
        assert_eq!(reason("denied").await, Err("InvalidAdminResponse"));
        assert_eq!(reason("html").await, Err("InvalidAdminResponse"));

        // Nothing listens.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut partitioned = false;
        let e = client
            .backlog(
                &target(&format!("http://127.0.0.1:{closed}"), "t"),
                &mut partitioned,
            )
            .await
            .unwrap_err();
        assert_eq!(e.reason(), "AdminAPIUnavailable");
        assert!(e.to_string().contains(&closed.to_string()), "{e}");
    }
}
