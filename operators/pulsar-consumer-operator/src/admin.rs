//! Reading a subscription's backlog from the Pulsar admin REST API:
//! `GET <adminUrl>/admin/v2/<persistent|non-persistent>/<tenant>/<namespace>/<topic>/stats`
//! -> `subscriptions[<subscription>].msgBacklog`, or `/partitioned-stats` for a partitioned
//! topic (the broker sums its partitions there; the per-partition figures are summed here
//! when only they are given).
//!
//! The endpoint is whatever a tenant wrote in `spec.autoscaling.adminUrl` (or the host of
//! `spec.serverAddress`), so everything here treats it as hostile:
//! - where: [`crate::target`] refuses loopback, link-local, the API server and the like, on
//!   the resolved addresses, at connect time;
//! - how much: an answer is read only when it is a 2xx, and only up to [`MAX_BODY_BYTES`]
//!   (error bodies are never read); it is parsed by a typed visitor that keeps the one
//!   subscription's `msgBacklog` and skips everything else without building it
//!   ([`backlog_from_stats`]), never into a whole JSON value;
//! - whose: a PulsarConsumer's reads reach the Services of its own namespace, or the
//!   addresses the administrator allows every namespace ([`crate::target::Reach`]), so the
//!   operator does not read another tenant's broker for a tenant;
//! - what is told: every way a read fails (no connection, timeout, TLS, not HTTP, an HTTP
//!   error, not JSON, too large, no such topic or subscription) is one reason and one
//!   message in the status and events ([`REASON_UNAVAILABLE`], [`UNAVAILABLE_MESSAGE`]), so
//!   they do not tell one target from another; only a target the policy refuses has a
//!   reason of its own ([`REASON_TARGET_NOT_ALLOWED`]: it depends on the spec and the
//!   administrator's settings, not on what answers). [`AdminError::detail`] says which
//!   failure it was, for the operator's logs only, and never carries text of the answer.
//!   The poller also makes every failure take as long as a timeout ([`crate::poll`]).
//!
//! HTTP client: hyper-util's client over hyper-rustls (ring, native roots, HTTP/1 only),
//! the very crates kube already builds for its own connection, so the operator gains no new
//! dependency tree (reqwest would add one) and no OpenSSL.

use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};

use http_body_util::{BodyExt, Empty};
use hyper::{
    Request, StatusCode,
    body::{Bytes, Incoming},
    header::{ACCEPT, CONTENT_LENGTH, USER_AGENT},
};
use hyper_rustls::HttpsConnector;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use crate::target::{GuardedConnector, Reach, TargetPolicy, not_allowed_in, service_name};

/// Pulsar's standard web service (admin API) port, for `pulsar://` service URLs.
pub const DEFAULT_ADMIN_PORT: u16 = 8080;
/// Pulsar's standard TLS web service port, for `pulsar+ssl://` service URLs.
pub const DEFAULT_ADMIN_TLS_PORT: u16 = 8443;
/// The largest stats document read; a larger answer is refused without being read further
/// ([`AdminError::TooLarge`]).
///
/// Why 1 MiB: the operator asks for the stats without publishers and consumers and, for a
/// partitioned topic, for the broker's sum only (see [`stats_url`]). Measured on Pulsar
/// 4.2: about 1.1 KiB for the topic plus 1.4 KiB per subscription (a topic of 4 partitions
/// and 3 subscriptions: 5.1 KiB; 36 KiB with the per-partition figures), so a topic with
/// 700 subscriptions fits. A broker that ignores `excludeConsumers` adds about 0.65 KiB
/// per consumer: a subscription with `maxReplicas` (1,000) consumers and 250 more
/// subscriptions still fit. Memory: one read holds at most this much (1.5 times while its
/// buffer grows, when the length is not announced) plus the connection's 64 KiB read
/// buffer, and at most [`crate::options::Options::max_concurrent_polls`] reads run at once:
/// with the default 8, the answers of all autoscaled objects together take at most about
/// 13 MiB (8 x (1.5 MiB + 64 KiB)).
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// How long connecting to the admin API may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The HTTP/1 read buffer of a connection (hyper's default grows to about 400 KiB): also the
/// limit of the answer's head.
const READ_BUFFER_BYTES: usize = 64 << 10;
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
///
/// The query keeps the answer small: no publishers and no consumers (a broker that does not
/// know the parameters ignores them) and, for a partitioned topic, only the broker's sum
/// over the partitions (`perPartition=false`). `msgBacklog` is in the answer either way.
#[must_use]
pub fn stats_url(admin_url: &str, topic: &Topic, partitioned: bool) -> String {
    format!(
        "{}/admin/v2/{}/{}/{}/{}/{}?excludePublishers=true&excludeConsumers=true{}",
        admin_url.trim_end_matches('/'),
        topic.domain,
        encode_segment(&topic.tenant),
        encode_segment(&topic.namespace),
        encode_segment(&topic.name),
        if partitioned {
            "partitioned-stats"
        } else {
            "stats"
        },
        if partitioned {
            "&perPartition=false"
        } else {
            ""
        }
    )
}

/// `ScalingActive=False` reason of every read that failed at or after the connection.
pub const REASON_UNAVAILABLE: &str = "AdminAPIUnavailable";
/// `ScalingActive=False` reason: the target is refused ([`AdminError::NotAllowed`]).
pub const REASON_TARGET_NOT_ALLOWED: &str = "AdminTargetNotAllowed";
/// The message of every read that failed at or after the connection, whatever the failure.
pub const UNAVAILABLE_MESSAGE: &str =
    "the Pulsar admin API did not give the subscription's backlog (the operator's log says why)";

/// Why the backlog could not be read. What a tenant sees of it ([`AdminError::reason`] and the
/// `Display` message, which go into the status and events) is the same for every variant
/// but [`AdminError::NotAllowed`]: the variants are for the operator's logs
/// ([`AdminError::detail`]), and none carries text of the answer or of the connection's error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    /// The target is refused by the operator's policy ([`crate::target`]).
    #[error(
        "spec.autoscaling.adminUrl (when unset: the host of spec.serverAddress) is neither a \
         Service of the PulsarConsumer's namespace (<service>.<namespace>[.svc]) nor an \
         address the operator's administrator allows every namespace, or it points at \
         loopback, link-local, unspecified, multicast or broadcast addresses, a cloud \
         metadata service or the Kubernetes API server"
    )]
    NotAllowed,
    /// No connection (refused, unreachable, DNS, TLS).
    #[error("{}", UNAVAILABLE_MESSAGE)]
    Unreachable,
    /// No whole answer in time (seconds).
    #[error("{}", UNAVAILABLE_MESSAGE)]
    Timeout(u64),
    /// The connection broke before a whole answer came, or what came was not HTTP.
    #[error("{}", UNAVAILABLE_MESSAGE)]
    Broken,
    /// A 5xx.
    #[error("{}", UNAVAILABLE_MESSAGE)]
    ServerError(u16),
    /// The operator cannot set up TLS (a local problem).
    #[error("{}", UNAVAILABLE_MESSAGE)]
    Tls,
    /// The broker does not know the topic (a 404).
    #[error("{}", UNAVAILABLE_MESSAGE)]
    TopicNotFound(String),
    /// The topic has no such subscription (yet).
    #[error("{}", UNAVAILABLE_MESSAGE)]
    SubscriptionNotFound {
        /// The topic.
        topic: String,
        /// The subscription.
        subscription: String,
    },
    /// Another status (401, 403, 3xx, ...).
    #[error("{}", UNAVAILABLE_MESSAGE)]
    UnexpectedStatus(u16),
    /// A 2xx larger than [`MAX_BODY_BYTES`].
    #[error("{}", UNAVAILABLE_MESSAGE)]
    TooLarge,
    /// A 2xx that is not a topic stats document.
    #[error("{}", UNAVAILABLE_MESSAGE)]
    NotStats,
}

impl AdminError {
    /// The `ScalingActive=False` reason: [`REASON_TARGET_NOT_ALLOWED`] or
    /// [`REASON_UNAVAILABLE`].
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            AdminError::NotAllowed => REASON_TARGET_NOT_ALLOWED,
            _ => REASON_UNAVAILABLE,
        }
    }

    /// Which failure it was, for the operator's logs (never a status or an event): fixed
    /// words, an HTTP status code, and what the spec names (topic, subscription).
    #[must_use]
    pub fn detail(&self) -> String {
        match self {
            AdminError::NotAllowed => "the target is not allowed".to_owned(),
            AdminError::Unreachable => "no TCP or TLS connection".to_owned(),
            AdminError::Timeout(s) => format!("no whole answer within {s}s"),
            AdminError::Broken => {
                "the connection broke before a whole HTTP answer came (or it is not HTTP)"
                    .to_owned()
            }
            AdminError::ServerError(code) => format!("answered HTTP {code}"),
            AdminError::Tls => "the operator cannot set up TLS".to_owned(),
            AdminError::TopicNotFound(topic) => {
                format!("the topic {topic} does not exist (HTTP 404)")
            }
            AdminError::SubscriptionNotFound {
                topic,
                subscription,
            } => format!("the topic {topic} has no subscription {subscription}"),
            AdminError::UnexpectedStatus(code) => {
                format!("answered HTTP {code}, not a topic's stats")
            }
            AdminError::TooLarge => format!(
                "answered more than {} KiB, more than a topic's stats",
                MAX_BODY_BYTES >> 10
            ),
            AdminError::NotStats => {
                "the answer is not a topic's stats (no subscriptions with a msgBacklog)".to_owned()
            }
        }
    }

    /// A short, fixed name of the failure (a log field).
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            AdminError::NotAllowed => "not_allowed",
            AdminError::Unreachable => "unreachable",
            AdminError::Timeout(_) => "timeout",
            AdminError::Broken => "broken",
            AdminError::ServerError(_) => "server_error",
            AdminError::Tls => "tls_setup",
            AdminError::TopicNotFound(_) => "topic_not_found",
            AdminError::SubscriptionNotFound { .. } => "subscription_not_found",
            AdminError::UnexpectedStatus(_) => "unexpected_status",
            AdminError::TooLarge => "too_large",
            AdminError::NotStats => "not_stats",
        }
    }
}

/// The backlog of `subscription` in a stats document: `subscriptions[sub].msgBacklog`, or
/// the sum over `partitions[*].subscriptions[sub].msgBacklog` when the document has
/// per-partition figures only. `Ok(None)` when the subscription is not there.
///
/// Typed and lazy: a serde visitor walks the document once and keeps only those numbers;
/// every other key and value is skipped ([`IgnoredAny`]) without being built, so parsing
/// allocates nothing but serde_json's scratch for an escaped string. Nesting is limited by
/// serde_json's recursion limit (128).
///
/// # Errors
/// [`AdminError::NotStats`] when the document is not a topic stats document (not JSON, not
/// an object, no `subscriptions`, the subscription without a `msgBacklog` that is a whole
/// number).
pub fn backlog_from_stats(body: &[u8], subscription: &str) -> Result<Option<u64>, AdminError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let stats = StatsSeed {
        subscription,
        partitions: true,
    }
    .deserialize(&mut de)
    .and_then(|stats| de.end().map(|()| stats))
    .map_err(|e| {
        tracing::debug!(error = %e, "the admin API's answer is not a stats document");
        AdminError::NotStats
    })?;
    match stats.subscription {
        Some(Found::NoBacklog) => return Err(AdminError::NotStats),
        Some(Found::Backlog(b)) => return Ok(Some(b)),
        _ => {}
    }
    if let Some(p) = stats.partitions.filter(|p| p.count > 0) {
        return if p.no_backlog {
            Err(AdminError::NotStats)
        } else {
            Ok(p.total)
        };
    }
    if stats.subscription.is_some() {
        return Ok(None);
    }
    Err(AdminError::NotStats)
}

/// What one `subscriptions` object says of the subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// Not there.
    Absent,
    /// There, with this `msgBacklog`.
    Backlog(u64),
    /// There, without `msgBacklog`.
    NoBacklog,
}

/// What a stats document (the topic's, or one partition's) says.
#[derive(Debug, Default)]
struct Stats {
    /// `None`: no `subscriptions` key.
    subscription: Option<Found>,
    /// `None`: no `partitions` key.
    partitions: Option<Partitions>,
}

/// What the `partitions` object says.
#[derive(Debug, Default)]
struct Partitions {
    /// Partitions listed.
    count: usize,
    /// The sum of the backlogs of those that have the subscription.
    total: Option<u64>,
    /// A partition has the subscription without `msgBacklog`.
    no_backlog: bool,
}

/// A map key, compared with `names` without being allocated: the index of the one it is.
struct KeyIn<'a>(&'a [&'a str]);

impl<'de> DeserializeSeed<'de> for KeyIn<'_> {
    type Value = Option<usize>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for KeyIn<'_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|name| *name == v))
    }
}

/// A stats document; `partitions`: whether its `partitions` are read (the topic's, not a
/// partition's).
struct StatsSeed<'a> {
    subscription: &'a str,
    partitions: bool,
}

impl<'de> DeserializeSeed<'de> for StatsSeed<'_> {
    type Value = Stats;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for StatsSeed<'_> {
    type Value = Stats;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a topic stats object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut stats = Stats::default();
        while let Some(key) = map.next_key_seed(KeyIn(&["subscriptions", "partitions"]))? {
            match key {
                Some(0) => {
                    let found = map.next_value_seed(SubscriptionsSeed(self.subscription))?;
                    // A repeated key: the first one that has the subscription counts.
                    if matches!(stats.subscription, None | Some(Found::Absent)) {
                        stats.subscription = Some(found);
                    }
                }
                Some(1) if self.partitions => {
                    let p = map.next_value_seed(PartitionsSeed(self.subscription))?;
                    let all = stats.partitions.get_or_insert_with(Partitions::default);
                    all.count += p.count;
                    all.no_backlog |= p.no_backlog;
                    all.total = sum(all.total, p.total);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(stats)
    }
}

/// `a + b`, saturating, where `None` is "nothing yet".
fn sum(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (a, b) => a.or(b),
    }
}

/// A `subscriptions` object: the entry of the subscription.
struct SubscriptionsSeed<'a>(&'a str);

impl<'de> DeserializeSeed<'de> for SubscriptionsSeed<'_> {
    type Value = Found;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for SubscriptionsSeed<'_> {
    type Value = Found;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object of subscriptions")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = Found::Absent;
        while let Some(key) = map.next_key_seed(KeyIn(&[self.0]))? {
            if key.is_some() && found == Found::Absent {
                found = map.next_value_seed(SubscriptionSeed)?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// One subscription's stats: its `msgBacklog`.
struct SubscriptionSeed;

impl<'de> DeserializeSeed<'de> for SubscriptionSeed {
    type Value = Found;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for SubscriptionSeed {
    type Value = Found;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a subscription's stats object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = Found::NoBacklog;
        while let Some(key) = map.next_key_seed(KeyIn(&["msgBacklog"]))? {
            if key.is_some() && found == Found::NoBacklog {
                found = Found::Backlog(map.next_value::<u64>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// A `partitions` object (partition name -> its stats): the sum of their backlogs.
struct PartitionsSeed<'a>(&'a str);

impl<'de> DeserializeSeed<'de> for PartitionsSeed<'_> {
    type Value = Partitions;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for PartitionsSeed<'_> {
    type Value = Partitions;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object of partitions")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut p = Partitions::default();
        while map.next_key::<IgnoredAny>()?.is_some() {
            let stats = map.next_value_seed(StatsSeed {
                subscription: self.0,
                partitions: false,
            })?;
            p.count += 1;
            match stats.subscription {
                Some(Found::Backlog(b)) => p.total = sum(p.total, Some(b)),
                Some(Found::NoBacklog) => p.no_backlog = true,
                Some(Found::Absent) | None => {}
            }
        }
        Ok(p)
    }
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

type HttpClient = Client<HttpsConnector<GuardedConnector>, Empty<Bytes>>;

/// The two HTTP clients, one per [`Reach`].
struct Clients {
    /// Services of the PulsarConsumer's namespace.
    namespace: HttpClient,
    /// Addresses the administrator allows every namespace.
    granted: HttpClient,
}

/// A client of Pulsar admin APIs, shared by all PulsarConsumers. Its TLS roots are loaded on
/// first use, so an operator without autoscaling never loads them.
pub struct AdminClient {
    policy: Arc<TargetPolicy>,
    cluster_domain: Arc<str>,
    http: OnceLock<Option<Clients>>,
}

impl std::fmt::Debug for AdminClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminClient")
            .field("policy", &self.policy)
            .field("cluster_domain", &self.cluster_domain)
            .finish_non_exhaustive()
    }
}

impl Default for AdminClient {
    /// A client with the default [`TargetPolicy`].
    fn default() -> Self {
        Self::new(TargetPolicy::default())
    }
}

/// The TLS settings of both clients: rustls with ring and the system's CA certificates
/// (without any, an empty trust store: plain http works, https fails each read), HTTP/1.1
/// offered by ALPN.
fn tls_config() -> Option<Arc<rustls::ClientConfig>> {
    use hyper_rustls::ConfigBuilderExt;
    let builder = || {
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .inspect_err(|error| tracing::warn!(%error, "cannot set up TLS"))
        .ok()
    };
    let mut config = match builder()?.with_native_roots() {
        Ok(b) => b.with_no_client_auth(),
        Err(error) => {
            tracing::warn!(%error, "no CA certificates: https admin URLs cannot be verified");
            builder()?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth()
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Some(Arc::new(config))
}

/// One HTTP(S) client, connecting only where `policy` allows for `reach`. No connection is
/// kept between reads: an idle pool keyed by what tenants choose (host and port) would grow
/// with them, and one connection per read every few seconds costs a broker nothing.
fn build_client(
    policy: Arc<TargetPolicy>,
    reach: Reach,
    tls: Arc<rustls::ClientConfig>,
) -> HttpClient {
    let http = GuardedConnector::new(policy, reach, |http| {
        http.enforce_http(false);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    });
    // http and https alike (the scheme of the URL decides).
    let connector = HttpsConnector::from((http, tls));
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .http1_max_buf_size(READ_BUFFER_BYTES)
        .http1_max_headers(64)
        .build(connector)
}

/// The body of a 2xx answer, at most [`MAX_BODY_BYTES`]: refused at once when the announced
/// length is larger, else read until it grows larger.
async fn read_capped(mut body: Incoming, announced: Option<u64>) -> Result<Vec<u8>, AdminError> {
    if announced.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(AdminError::TooLarge);
    }
    let initial = announced
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(16 << 10);
    let mut buf = Vec::with_capacity(initial.min(MAX_BODY_BYTES));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| {
            tracing::debug!(%error, "reading the admin API's answer");
            AdminError::Broken
        })?;
        if let Ok(data) = frame.into_data() {
            if buf.len().saturating_add(data.len()) > MAX_BODY_BYTES {
                return Err(AdminError::TooLarge);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf)
}

impl AdminClient {
    /// A client connecting only where `policy` allows, in the cluster whose DNS domain
    /// `/etc/resolv.conf` tells ([`crate::target::cluster_domain`]).
    #[must_use]
    pub fn new(policy: TargetPolicy) -> Self {
        Self::in_cluster_domain(policy, &crate::target::cluster_domain())
    }

    /// A client connecting only where `policy` allows, in a cluster whose DNS domain is
    /// `cluster_domain` (`cluster.local`).
    #[must_use]
    pub fn in_cluster_domain(policy: TargetPolicy, cluster_domain: &str) -> Self {
        Self {
            policy: Arc::new(policy),
            cluster_domain: cluster_domain.trim_matches('.').into(),
            http: OnceLock::new(),
        }
    }

    /// How a PulsarConsumer of `namespace` may reach `admin_url`: by [`Reach::Namespace`]
    /// when its host is a Service name of `namespace`, else only where the administrator
    /// allows ([`Reach::Granted`]; a literal IP address always).
    #[must_use]
    pub fn reach(&self, admin_url: &str, namespace: &str) -> Reach {
        let host = admin_url
            .parse::<hyper::Uri>()
            .ok()
            .and_then(|u| u.host().map(str::to_owned));
        match host.and_then(|h| service_name(&h, &self.cluster_domain)) {
            Some(service) if service.namespace == namespace.to_ascii_lowercase() => {
                Reach::Namespace {
                    cluster_domain: Arc::clone(&self.cluster_domain),
                }
            }
            _ => Reach::Granted,
        }
    }

    /// GET `url` by `reach`: the answer's head, its body not read yet.
    async fn send(
        &self,
        url: &str,
        reach: &Reach,
    ) -> Result<hyper::Response<Incoming>, AdminError> {
        let request = Request::get(url)
            .header(ACCEPT, "application/json")
            .header(USER_AGENT, crate::OPERATOR.name)
            .body(Empty::<Bytes>::new())
            .map_err(|error| {
                // The schema only admits URLs that make a request; an object stored before
                // it did may not.
                tracing::debug!(%error, "invalid admin URL");
                AdminError::Unreachable
            })?;
        let clients = self
            .http
            .get_or_init(|| {
                let tls = tls_config()?;
                let client =
                    |reach| build_client(Arc::clone(&self.policy), reach, Arc::clone(&tls));
                Some(Clients {
                    namespace: client(Reach::Namespace {
                        cluster_domain: Arc::clone(&self.cluster_domain),
                    }),
                    granted: client(Reach::Granted),
                })
            })
            .as_ref()
            .ok_or(AdminError::Tls)?;
        let http = match reach {
            Reach::Namespace { .. } => &clients.namespace,
            Reach::Granted => &clients.granted,
        };
        http.request(request).await.map_err(|error| {
            if let Some(refused) = not_allowed_in(&error) {
                tracing::debug!(%url, %refused, "target not allowed");
                return AdminError::NotAllowed;
            }
            // The whole chain, for whoever debugs a real broker; never into the status.
            let mut chain = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(s) = source {
                chain.push_str(": ");
                chain.push_str(&s.to_string());
                source = s.source();
            }
            tracing::debug!(%url, error = %chain, "the admin API cannot be read");
            if error.is_connect() {
                AdminError::Unreachable
            } else {
                AdminError::Broken
            }
        })
    }

    /// The backlog of the target's subscription, for a PulsarConsumer of `namespace` (which
    /// decides where the read may go: [`Self::reach`]). `partitioned` is what was learnt of
    /// the topic before (updated here): one request when it is right, a second one only
    /// when the topic turns out to be (or no longer be) partitioned.
    ///
    /// # Errors
    /// [`AdminError`] when the backlog cannot be read.
    pub async fn backlog(
        &self,
        target: &Target,
        namespace: &str,
        partitioned: &mut bool,
    ) -> Result<u64, AdminError> {
        let reach = self.reach(&target.admin_url, namespace);
        match self.backlog_once(target, &reach, *partitioned).await {
            Err(AdminError::TopicNotFound(_)) => {
                let other = !*partitioned;
                let result = self.backlog_once(target, &reach, other).await;
                if !matches!(result, Err(AdminError::TopicNotFound(_))) {
                    *partitioned = other;
                }
                result
            }
            result => result,
        }
    }

    async fn backlog_once(
        &self,
        target: &Target,
        reach: &Reach,
        partitioned: bool,
    ) -> Result<u64, AdminError> {
        let url = stats_url(&target.admin_url, &target.topic, partitioned);
        let response = self.send(&url, reach).await?;
        let status = response.status();
        // The body of an error is never read: the connection is dropped with it.
        if status == StatusCode::NOT_FOUND {
            return Err(AdminError::TopicNotFound(target.topic_name()));
        }
        if status.is_server_error() {
            return Err(AdminError::ServerError(status.as_u16()));
        }
        if !status.is_success() {
            return Err(AdminError::UnexpectedStatus(status.as_u16()));
        }
        let announced = response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let body = read_capped(response.into_body(), announced).await?;
        backlog_from_stats(&body, &target.subscription)?.ok_or_else(|| {
            AdminError::SubscriptionNotFound {
                topic: target.topic_name(),
                subscription: target.subscription.clone(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

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
    fn stats_urls_are_encoded_and_ask_for_little() {
        let topic = parse_topic("persistent://acme/orders/in #1").unwrap();
        assert_eq!(
            stats_url("http://127.0.0.1:18080/", &topic, false),
            "http://127.0.0.1:18080/admin/v2/persistent/acme/orders/in%20%231/stats\
             ?excludePublishers=true&excludeConsumers=true"
        );
        let topic = parse_topic("non-persistent://a/b/c").unwrap();
        assert_eq!(
            stats_url("https://h:8443", &topic, true),
            "https://h:8443/admin/v2/non-persistent/a/b/c/partitioned-stats\
             ?excludePublishers=true&excludeConsumers=true&perPartition=false"
        );
        assert_eq!(encode_segment("a-b_c.d~e"), "a-b_c.d~e");
        assert_eq!(encode_segment("ä/?"), "%C3%A4%2F%3F");
    }

    fn parse(stats: &serde_json::Value, sub: &str) -> Result<Option<u64>, AdminError> {
        backlog_from_stats(stats.to_string().as_bytes(), sub)
    }

    #[test]
    fn backlog_of_a_subscription() {
        let stats = json!({
            "msgRateIn": 0.0,
            "publishers": [{"producerName": "p", "metadata": {"mine": {"msgBacklog": 1}}}],
            "subscriptions": {
                "other": {"msgBacklog": 5, "consumers": [{"msgBacklog": 9}]},
                "mine": {"type": "Shared", "consumers": [], "msgBacklog": 20000},
            },
            "partitions": {}
        });
        assert_eq!(parse(&stats, "mine"), Ok(Some(20_000)));
        assert_eq!(parse(&stats, "other"), Ok(Some(5)));
        assert_eq!(parse(&stats, "missing"), Ok(None));
        assert_eq!(parse(&json!({"subscriptions": {}}), "mine"), Ok(None));
        // Keys written with escapes are still keys.
        let escaped = br#"{"subscriptions": {"m\u0069ne": {"msg\u0042acklog": 3}}}"#;
        assert_eq!(backlog_from_stats(escaped, "mine"), Ok(Some(3)));
    }

    #[test]
    fn what_is_not_a_stats_document() {
        for bad in [
            json!({"subscriptions": {"mine": {}}}),
            json!({"subscriptions": {"mine": {"msgBacklog": -1}}}),
            json!({"subscriptions": {"mine": {"msgBacklog": 1.5}}}),
            json!({"subscriptions": {"mine": {"msgBacklog": "7"}}}),
            json!({"subscriptions": {"mine": 7}}),
            json!({"subscriptions": [1, 2]}),
            json!({"reason": "x"}),
            json!([1, 2]),
            json!("subscriptions"),
            json!(null),
        ] {
            assert_eq!(parse(&bad, "mine"), Err(AdminError::NotStats), "{bad}");
        }
        for bad in [
            &b"<html>"[..],
            b"",
            b"{\"subscriptions\": {}",
            b"{\"subscriptions\": {}} trailing",
        ] {
            assert_eq!(
                backlog_from_stats(bad, "mine"),
                Err(AdminError::NotStats),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // Nesting deeper than serde_json's limit is refused, not a stack overflow.
        let deep = format!("{{\"x\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(
            backlog_from_stats(deep.as_bytes(), "mine"),
            Err(AdminError::NotStats)
        );
    }

    #[test]
    fn partitions_are_summed_when_only_they_are_given() {
        let stats = json!({
            "partitions": {
                "persistent://public/default/t-partition-0": {"subscriptions": {"mine": {"msgBacklog": 3}}},
                "persistent://public/default/t-partition-1": {"subscriptions": {"mine": {"msgBacklog": 4}, "x": {"msgBacklog": 100}}},
                "persistent://public/default/t-partition-2": {"subscriptions": {}},
                "persistent://public/default/t-partition-3": {"msgRateIn": 1.0}
            },
            "subscriptions": {},
        });
        assert_eq!(parse(&stats, "mine"), Ok(Some(7)));
        assert_eq!(parse(&stats, "missing"), Ok(None));
        // The broker's own sum wins when it is there.
        let summed = json!({
            "subscriptions": {"mine": {"msgBacklog": 7}},
            "partitions": {"p0": {"subscriptions": {"mine": {"msgBacklog": 3}}}}
        });
        assert_eq!(parse(&summed, "mine"), Ok(Some(7)));
        // Partitions inside a partition are not read.
        let nested = json!({
            "partitions": {"p0": {"subscriptions": {}, "partitions": {"q": {"subscriptions": {"mine": {"msgBacklog": 1}}}}}}
        });
        assert_eq!(parse(&nested, "mine"), Ok(None));
        // A partition with the subscription but no msgBacklog: not stats.
        let broken = json!({"partitions": {"p0": {"subscriptions": {"mine": {}}}}});
        assert_eq!(parse(&broken, "mine"), Err(AdminError::NotStats));
        // No partitions and no subscriptions: not stats.
        assert_eq!(
            parse(&json!({"partitions": {}}), "mine"),
            Err(AdminError::NotStats)
        );
    }

    #[test]
    fn every_failure_reads_alike_but_a_refused_target() {
        let failures = [
            AdminError::Unreachable,
            AdminError::Timeout(5),
            AdminError::Broken,
            AdminError::ServerError(503),
            AdminError::Tls,
            AdminError::TopicNotFound("persistent://a/b/c".into()),
            AdminError::SubscriptionNotFound {
                topic: "persistent://a/b/c".into(),
                subscription: "s".into(),
            },
            AdminError::UnexpectedStatus(401),
            AdminError::TooLarge,
            AdminError::NotStats,
        ];
        for e in &failures {
            assert_eq!(e.reason(), REASON_UNAVAILABLE, "{e:?}");
            assert_eq!(e.to_string(), UNAVAILABLE_MESSAGE, "{e:?}");
        }
        // The logs tell them apart.
        let details: std::collections::HashSet<String> =
            failures.iter().map(AdminError::detail).collect();
        assert_eq!(details.len(), failures.len());
        let kinds: std::collections::HashSet<&str> =
            failures.iter().map(AdminError::kind).collect();
        assert_eq!(kinds.len(), failures.len());
        assert_eq!(AdminError::ServerError(503).detail(), "answered HTTP 503");
        assert!(AdminError::TooLarge.detail().contains("1024 KiB"));
        // A refused target depends on the spec alone: a reason of its own, naming the field.
        assert_eq!(AdminError::NotAllowed.reason(), REASON_TARGET_NOT_ALLOWED);
        assert!(
            AdminError::NotAllowed
                .to_string()
                .contains("spec.autoscaling.adminUrl")
        );
    }

    #[test]
    fn reads_reach_their_namespaces_services_or_what_is_granted() {
        let client = AdminClient::in_cluster_domain(TargetPolicy::default(), "cluster.local");
        let namespace = Reach::Namespace {
            cluster_domain: "cluster.local".into(),
        };
        for own in [
            "http://broker.team-a:8080",
            "http://broker.team-a.svc:8080/",
            "https://broker.team-a.svc.cluster.local:8443",
            "http://broker-0.brokers.team-a.svc:8080",
        ] {
            assert_eq!(client.reach(own, "team-a"), namespace, "{own}");
        }
        for other in [
            "http://pulsar-broker.pulsar:8080",
            "http://broker.team-b.svc:8080",
            "http://broker.team-a.svc.evil.example:8080",
            "http://broker:8080",
            "http://10.0.0.7:8080",
            "http://[fd00::7]:8080",
            "http://example.com:8080",
            "not a url",
        ] {
            assert_eq!(client.reach(other, "team-a"), Reach::Granted, "{other}");
        }
    }

    /// A one-route-per-path HTTP server on 127.0.0.1 answering `(status, body)` for the
    /// paths it knows (the query left out) and 404 otherwise; counts the connections.
    async fn fake_admin(routes: Vec<(&'static str, u16, Vec<u8>)>) -> (String, Arc<AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let count = Arc::new(AtomicUsize::new(0));
        let seen = count.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                seen.fetch_add(1, SeqCst);
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
                    let target = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                    let path = target.split('?').next().unwrap_or("").to_owned();
                    let (code, body) = routes
                        .iter()
                        .find(|(p, _, _)| *p == path)
                        .map(|(_, c, b)| (*c, b.clone()))
                        .unwrap_or((404, br#"{"reason":"Topic not found"}"#.to_vec()));
                    let head = format!(
                        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(head.as_bytes()).await;
                    let _ = conn.write_all(&body).await;
                });
            }
        });
        (url, count)
    }

    /// The namespace of the PulsarConsumers of these tests.
    const NS: &str = "team-a";

    fn target(url: &str, topic: &str) -> Target {
        Target {
            admin_url: url.to_owned(),
            topic: parse_topic(topic).unwrap(),
            subscription: "sub".to_owned(),
        }
    }

    /// A client that may connect to the fake admin API on loopback.
    fn loopback_client() -> AdminClient {
        AdminClient::new(TargetPolicy::new(
            vec!["127.0.0.0/8".parse().unwrap()],
            None,
        ))
    }

    #[tokio::test]
    async fn reads_the_backlog_over_http() {
        let stats = json!({"subscriptions": {"sub": {"msgBacklog": 42}}}).to_string();
        let (url, count) = fake_admin(vec![(
            "/admin/v2/persistent/public/default/t/stats",
            200,
            stats.into_bytes(),
        )])
        .await;
        let client = loopback_client();
        let mut partitioned = false;
        let b = client
            .backlog(&target(&url, "t"), NS, &mut partitioned)
            .await;
        assert_eq!(b, Ok(42));
        assert!(!partitioned);
        assert_eq!(count.load(SeqCst), 1, "one request");
    }

    #[tokio::test]
    async fn finds_a_partitioned_topic_once_and_remembers() {
        let stats = json!({"subscriptions": {"sub": {"msgBacklog": 7}}}).to_string();
        let (url, count) = fake_admin(vec![(
            "/admin/v2/non-persistent/a/b/p/partitioned-stats",
            200,
            stats.into_bytes(),
        )])
        .await;
        let client = loopback_client();
        let t = target(&url, "non-persistent://a/b/p");
        let mut partitioned = false;
        assert_eq!(client.backlog(&t, NS, &mut partitioned).await, Ok(7));
        assert!(partitioned);
        assert_eq!(count.load(SeqCst), 2);
        // Next time: one request.
        assert_eq!(client.backlog(&t, NS, &mut partitioned).await, Ok(7));
        assert_eq!(count.load(SeqCst), 3);
    }

    /// The marker an endpoint answers in the tests below: it must never be in a message.
    const MARKER: &str = "SECRET-MARKER-7d1f";

    #[tokio::test]
    async fn reports_why_it_cannot_read_without_the_answers_text() {
        let marked = |s: &str| format!("{s} {MARKER}").into_bytes();
        let huge = {
            // An 8 MiB `[0,0,...]`, the answer that took the operator over its limit.
            let mut b = b"[0".to_vec();
            b.extend(std::iter::repeat_n(&b",0"[..], 4 << 20).flatten());
            b.push(b']');
            b
        };
        let (url, _) = fake_admin(vec![
            (
                "/admin/v2/persistent/public/default/nosub/stats",
                200,
                json!({"subscriptions": {"other": {"msgBacklog": 1}}, "x": MARKER})
                    .to_string()
                    .into_bytes(),
            ),
            (
                "/admin/v2/persistent/public/default/broken/stats",
                503,
                marked("boom"),
            ),
            (
                "/admin/v2/persistent/public/default/denied/stats",
                401,
                marked("no"),
            ),
            (
                "/admin/v2/persistent/public/default/html/stats",
                200,
                marked("<html>"),
            ),
            ("/admin/v2/persistent/public/default/huge/stats", 200, huge),
        ])
        .await;
        let client = loopback_client();
        let read = |topic: &'static str| {
            let client = &client;
            let url = url.clone();
            async move {
                let mut partitioned = false;
                client
                    .backlog(&target(&url, topic), NS, &mut partitioned)
                    .await
                    .unwrap_err()
            }
        };
        let mut errors = Vec::new();
        for topic in ["missing", "nosub", "broken", "denied", "html", "huge"] {
            let e = read(topic).await;
            assert_eq!(e.reason(), REASON_UNAVAILABLE, "{topic}: {e:?}");
            assert_eq!(e.to_string(), UNAVAILABLE_MESSAGE, "{topic}: {e:?}");
            errors.push(e);
        }
        // Which failure it was is known (for the log).
        assert_eq!(
            errors[0],
            AdminError::TopicNotFound("persistent://public/default/missing".into())
        );
        assert!(matches!(errors[1], AdminError::SubscriptionNotFound { .. }));
        assert_eq!(errors[2], AdminError::ServerError(503));
        assert_eq!(errors[3], AdminError::UnexpectedStatus(401));
        assert_eq!(errors[4], AdminError::NotStats);
        assert_eq!(errors[5], AdminError::TooLarge);
        for e in &errors {
            assert!(!e.to_string().contains(MARKER), "{e}");
            assert!(!e.detail().contains(MARKER), "{e:?}");
        }

        // Nothing listens: unreachable, with no text of the connection error.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut partitioned = false;
        let e = client
            .backlog(
                &target(&format!("http://127.0.0.1:{closed}"), "t"),
                NS,
                &mut partitioned,
            )
            .await
            .unwrap_err();
        assert_eq!(e, AdminError::Unreachable);
    }

    #[tokio::test]
    async fn a_huge_answer_without_a_length_is_cut_off() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // Chunked, endless: reading stops at the cap.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let sent = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&sent);
        tokio::spawn(async move {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let mut head = [0u8; 4096];
            let _ = conn.read(&mut head).await;
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                .await;
            let chunk = format!("{:x}\r\n{}\r\n", 64 << 10, "0".repeat(64 << 10));
            while conn.write_all(chunk.as_bytes()).await.is_ok() {
                counter.fetch_add(64 << 10, SeqCst);
            }
        });
        let mut partitioned = false;
        let e = loopback_client()
            .backlog(&target(&url, "t"), NS, &mut partitioned)
            .await
            .unwrap_err();
        assert_eq!(e, AdminError::TooLarge);
        // What the server got out before the connection was dropped: the cap and what the
        // socket buffers held, not an endless stream.
        assert!(
            sent.load(SeqCst) < 16 * MAX_BODY_BYTES,
            "{}",
            sent.load(SeqCst)
        );
    }

    #[tokio::test]
    async fn refused_targets_are_not_connected_to() {
        let (url, count) = fake_admin(Vec::new()).await;
        let port = url.rsplit_once(':').unwrap().1.to_owned();
        let client = AdminClient::default();
        for admin_url in [
            url.clone(),
            format!("http://localhost:{port}"),
            // Names the resolver reads as IPv4 loopback (the schema admits them as names).
            format!("http://127.1:{port}"),
            format!("http://2130706433:{port}"),
            format!("http://[::ffff:127.0.0.1]:{port}"),
            format!("http://0.0.0.0:{port}"),
            format!("http://kubernetes.default.svc:{port}"),
            // Another namespace's Service, and one of this namespace under a foreign domain.
            format!("http://broker.team-b.svc:{port}"),
            format!("http://broker.{NS}.svc.evil.example:{port}"),
        ] {
            let mut partitioned = false;
            let e = client
                .backlog(&target(&admin_url, "t"), NS, &mut partitioned)
                .await
                .unwrap_err();
            assert_eq!(e, AdminError::NotAllowed, "{admin_url}");
            assert_eq!(e.reason(), "AdminTargetNotAllowed");
        }
        // The API server's Service, from its own namespace: refused by its name.
        let mut partitioned = false;
        let e = client
            .backlog(
                &target(&format!("https://kubernetes.default.svc:{port}"), "t"),
                "default",
                &mut partitioned,
            )
            .await
            .unwrap_err();
        assert_eq!(e, AdminError::NotAllowed);
        assert_eq!(count.load(SeqCst), 0, "no connection reached the endpoint");
    }
}
