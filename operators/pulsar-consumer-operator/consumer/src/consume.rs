//! The consume loop: subscribe, log and acknowledge each message, reconnect
//! with backoff, stop cleanly on shutdown.
//!
//! Delivery is at-least-once. A message is logged first and acknowledged
//! afterwards; `pulsar_consumer_messages_acked_total` only counts messages
//! whose acknowledgement was handed to the client. A message received but not
//! acknowledged (because the connection went away) is left to the broker,
//! which redelivers it to this or another consumer of the Shared subscription.

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use pulsar::consumer::{InitialPosition as PulsarInitialPosition, Message};
use pulsar::proto::MessageIdData;
use pulsar::{
    ConnectionRetryOptions, Consumer, ConsumerOptions, OperationRetryOptions, Pulsar,
    PulsarBuilder, SubType, TokioExecutor,
};
use tracing::{debug, info, warn};

use crate::Shutdown;
use crate::config::{ConnectionConfig, ConsumeConfig, InitialPosition};
use crate::http::Metrics;

/// Payload bytes logged per message; longer payloads are cut.
pub const MAX_LOGGED_PAYLOAD_BYTES: usize = 4096;

/// Reconnection delays used by the consume loop.
pub const RECONNECT_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(500),
    max: Duration::from_secs(30),
};

/// A session that lasted this long resets the backoff to its initial delay;
/// shorter ones keep growing it, so a flapping broker is not hammered.
const STABLE_SESSION: Duration = Duration::from_secs(30);
/// How often the connection to the broker is checked (ping) while idle.
const CONNECTION_CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// Time allowed for one connection check.
const CONNECTION_CHECK_TIMEOUT: Duration = Duration::from_secs(10);
/// Consecutive failed checks after which the session is rebuilt.
const MAX_FAILED_CHECKS: u32 = 3;
/// Time allowed for closing the consumer.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// The client type used throughout.
pub type Client = Pulsar<TokioExecutor>;
/// The consumer type used throughout (payloads are raw bytes).
pub type RawConsumer = Consumer<Vec<u8>, TokioExecutor>;

/// Capped exponential backoff with "equal jitter": attempt `n` waits between
/// half and all of `min(initial * 2^n, max)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first retry (before jitter).
    pub initial: Duration,
    /// Upper bound of any delay.
    pub max: Duration,
}

impl Backoff {
    /// The delay for attempt `attempt` (0-based) before jitter.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The delay for attempt `attempt` with jitter; `unit` is a random number
    /// in `[0, 1]` (values outside are clamped).
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let base = self.base_delay(attempt);
        let unit = if unit.is_nan() {
            0.0
        } else {
            unit.clamp(0.0, 1.0)
        };
        base / 2 + (base / 2).mul_f64(unit)
    }
}

/// A random number in `[0, 1)`, good enough for jitter (no RNG crate needed:
/// each `RandomState` is freshly keyed).
pub fn jitter_unit() -> f64 {
    let mut hasher = RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    hasher.write_u32(nanos);
    // 53 random bits -> [0, 1).
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Formats a message id as `ledger:entry:partition:batch_index` (the last two
/// are -1 when not applicable), unique within a topic.
pub fn format_message_id(id: &MessageIdData) -> String {
    format!(
        "{}:{}:{}:{}",
        id.ledger_id,
        id.entry_id,
        id.partition(),
        id.batch_index()
    )
}

/// Renders a payload for the log: invalid UTF-8 is replaced (lossy), and a
/// payload longer than `max_bytes` is cut (on a character boundary) with a
/// note of its full size.
pub fn format_payload(data: &[u8], max_bytes: usize) -> Cow<'_, str> {
    if data.len() <= max_bytes {
        return String::from_utf8_lossy(data);
    }
    let mut cut = max_bytes;
    // Do not split a multi-byte character: step back over continuation bytes
    // (at most 3 in UTF-8).
    for _ in 0..3 {
        if cut > 0
            && data
                .get(cut)
                .is_some_and(|b| b & 0b1100_0000 == 0b1000_0000)
        {
            cut -= 1;
        } else {
            break;
        }
    }
    let head = String::from_utf8_lossy(&data[..cut]);
    Cow::Owned(format!("{head}... [truncated, {} bytes total]", data.len()))
}

/// Starts a client builder for the validated connection settings.
pub fn client_builder(
    conn: &ConnectionConfig,
    retry: ConnectionRetryOptions,
) -> std::io::Result<PulsarBuilder<TokioExecutor>> {
    let mut builder = Pulsar::builder(conn.server.url.clone(), TokioExecutor)
        .with_connection_retry_options(retry)
        .with_operation_retry_options(OperationRetryOptions {
            operation_timeout: Duration::from_secs(30),
            retry_delay: Duration::from_millis(500),
            max_retries: Some(10),
        });
    if let Some(path) = &conn.tls_ca_file {
        builder = builder.with_certificate_chain_file(path).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("reading PULSAR_TLS_CA_FILE {}: {e}", path.display()),
            )
        })?;
    }
    Ok(builder)
}

/// Connection retries inside the client are kept short: the consume loop owns
/// the (longer, jittered) backoff, and needs to see failures to report them.
fn consumer_retry_options() -> ConnectionRetryOptions {
    ConnectionRetryOptions {
        min_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(500),
        max_retries: 1,
        connection_timeout: Duration::from_secs(5),
        keep_alive: Duration::from_secs(30),
        ..ConnectionRetryOptions::default()
    }
}

/// Why a connected session ended.
#[derive(Debug)]
enum SessionEnd {
    /// Shutdown was requested.
    Shutdown,
    /// The connection is gone or unusable; reconnect.
    Lost(String),
}

/// Runs the consumer until shutdown is requested. Connection failures are
/// retried forever; the only errors returned are unrecoverable local ones
/// (such as an unreadable CA file).
pub async fn run(
    cfg: ConsumeConfig,
    metrics: Arc<Metrics>,
    mut shutdown: Shutdown,
) -> anyhow::Result<()> {
    let topic = cfg.connection.topic.as_str();
    let mut failures: u32 = 0;
    let mut attempts: u64 = 0;
    loop {
        if shutdown.is_requested() {
            break;
        }
        if attempts > 0 {
            metrics.reconnects.inc();
        }
        attempts += 1;
        info!(
            server = %cfg.connection.server,
            topic,
            subscription = cfg.subscription.as_str(),
            attempt = attempts,
            "connecting to Pulsar"
        );
        let connected = tokio::select! {
            biased;
            () = shutdown.requested() => break,
            r = connect(&cfg) => r,
        };
        let reason = match connected {
            Ok((client, mut consumer)) => {
                metrics.set_connected(true);
                info!(
                    topic,
                    subscription = cfg.subscription.as_str(),
                    "subscribed (Shared); waiting for messages"
                );
                let started = Instant::now();
                let end = consume_session(&mut consumer, &metrics, &mut shutdown).await;
                metrics.set_connected(false);
                close(consumer, client).await;
                if started.elapsed() >= STABLE_SESSION {
                    failures = 0;
                }
                match end {
                    SessionEnd::Shutdown => break,
                    SessionEnd::Lost(reason) => format!("connection lost: {reason}"),
                }
            }
            Err(e) => match e {
                ConnectError::Local(e) => return Err(e),
                ConnectError::Pulsar(e) => format!("could not connect: {e}"),
            },
        };
        let delay = RECONNECT_BACKOFF.delay(failures, jitter_unit());
        failures = failures.saturating_add(1);
        warn!(
            error = reason.as_str(),
            retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            failures,
            "Pulsar unavailable, retrying"
        );
        tokio::select! {
            biased;
            () = shutdown.requested() => break,
            () = tokio::time::sleep(delay) => {}
        }
    }
    info!(
        received = metrics.messages_received.get(),
        acked = metrics.messages_acked.get(),
        "consumer stopped"
    );
    Ok(())
}

/// A failure to set up a session.
#[derive(Debug)]
enum ConnectError {
    /// A local problem that retrying will not fix.
    Local(anyhow::Error),
    /// A broker/connection problem: retry.
    Pulsar(pulsar::Error),
}

/// Creates a client and a Shared-subscription consumer.
async fn connect(cfg: &ConsumeConfig) -> Result<(Client, RawConsumer), ConnectError> {
    let builder = client_builder(&cfg.connection, consumer_retry_options())
        .map_err(|e| ConnectError::Local(e.into()))?;
    let client = builder.build().await.map_err(ConnectError::Pulsar)?;
    let initial_position = match cfg.initial_position {
        InitialPosition::Earliest => PulsarInitialPosition::Earliest,
        InitialPosition::Latest => PulsarInitialPosition::Latest,
    };
    let mut builder = client
        .consumer()
        .with_topic(cfg.connection.topic.as_str())
        .with_subscription(cfg.subscription.as_str())
        .with_subscription_type(SubType::Shared)
        .with_options(ConsumerOptions::default().with_initial_position(initial_position));
    // In Kubernetes HOSTNAME is the pod name, which makes broker stats readable.
    if let Ok(name) = std::env::var("HOSTNAME")
        && !name.trim().is_empty()
    {
        builder = builder.with_consumer_name(name.trim());
    }
    let consumer = builder.build().await.map_err(ConnectError::Pulsar)?;
    Ok((client, consumer))
}

/// Receives, logs and acknowledges messages until shutdown or until the
/// connection is lost. A message taken from the stream is always fully
/// handled (logged and acknowledged) before shutdown is looked at again.
async fn consume_session(
    consumer: &mut RawConsumer,
    metrics: &Metrics,
    shutdown: &mut Shutdown,
) -> SessionEnd {
    let mut check = tokio::time::interval_at(
        tokio::time::Instant::now() + CONNECTION_CHECK_INTERVAL,
        CONNECTION_CHECK_INTERVAL,
    );
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failed_checks = 0u32;
    loop {
        tokio::select! {
            biased;
            () = shutdown.requested() => return SessionEnd::Shutdown,
            item = consumer.next() => match item {
                None => return SessionEnd::Lost("the consumer stream ended".into()),
                Some(Err(e)) => {
                    // Errors for single messages (for example an unsupported
                    // compression codec); the connection itself is fine. The
                    // message is not acknowledged, so the broker keeps it.
                    metrics.message_errors.inc();
                    warn!(error = %e, "the client reported an error for a message");
                }
                Some(Ok(message)) => {
                    if let Err(e) = handle_message(consumer, &message, metrics).await {
                        return SessionEnd::Lost(format!("acknowledgement failed: {e}"));
                    }
                    failed_checks = 0;
                    metrics.set_connected(true);
                }
            },
            _ = check.tick() => {
                match tokio::time::timeout(CONNECTION_CHECK_TIMEOUT, consumer.check_connection()).await {
                    Ok(Ok(())) => {
                        failed_checks = 0;
                        metrics.set_connected(true);
                    }
                    outcome => {
                        let error = match outcome {
                            Ok(Err(e)) => e.to_string(),
                            _ => "timed out".to_owned(),
                        };
                        failed_checks += 1;
                        metrics.set_connected(false);
                        warn!(error, failed_checks, "broker connection check failed");
                        if failed_checks >= MAX_FAILED_CHECKS {
                            return SessionEnd::Lost(format!(
                                "{failed_checks} connection checks failed in a row"
                            ));
                        }
                    }
                }
            }
        }
    }
}

/// Logs one message, then acknowledges it. Counts it as acked only once the
/// acknowledgement was accepted by the client.
async fn handle_message(
    consumer: &mut RawConsumer,
    message: &Message<Vec<u8>>,
    metrics: &Metrics,
) -> Result<(), pulsar::error::ConsumerError> {
    metrics.messages_received.inc();
    let id = format_message_id(message.message_id());
    let payload = format_payload(&message.payload.data, MAX_LOGGED_PAYLOAD_BYTES);
    info!(
        topic = message.topic.as_str(),
        id = id.as_str(),
        payload = payload.as_ref(),
        "message received"
    );
    consumer.ack(message).await?;
    metrics.messages_acked.inc();
    debug!(id = id.as_str(), "message acknowledged");
    Ok(())
}

/// Closes the consumer (which first flushes the acknowledgements queued in
/// the client, they travel on the same channel) and drops the client.
async fn close(mut consumer: RawConsumer, client: Client) {
    match tokio::time::timeout(CLOSE_TIMEOUT, consumer.close()).await {
        Ok(Ok(())) => debug!("consumer closed"),
        Ok(Err(e)) => debug!(error = %e, "could not close the consumer cleanly"),
        Err(_) => debug!("timed out closing the consumer"),
    }
    drop(consumer);
    drop(client);
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        let b = Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
        };
        assert_eq!(b.base_delay(0), Duration::from_millis(500));
        assert_eq!(b.base_delay(1), Duration::from_secs(1));
        assert_eq!(b.base_delay(2), Duration::from_secs(2));
        assert_eq!(b.base_delay(5), Duration::from_secs(16));
        assert_eq!(b.base_delay(6), Duration::from_secs(30));
        assert_eq!(b.base_delay(40), Duration::from_secs(30));
        assert_eq!(b.base_delay(u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn backoff_jitter_bounds() {
        let b = RECONNECT_BACKOFF;
        for attempt in [0, 1, 3, 10, 1000] {
            let base = b.base_delay(attempt);
            assert_eq!(b.delay(attempt, 0.0), base / 2);
            assert_eq!(b.delay(attempt, 1.0), base);
            assert_eq!(b.delay(attempt, -5.0), base / 2);
            assert_eq!(b.delay(attempt, 7.0), base);
            assert_eq!(b.delay(attempt, f64::NAN), base / 2);
            let mid = b.delay(attempt, 0.5);
            assert!(mid > base / 2 && mid < base, "{mid:?} vs {base:?}");
            assert!(b.delay(attempt, jitter_unit()) <= b.max);
        }
    }

    #[test]
    fn jitter_is_in_unit_range_and_varies() {
        let samples: Vec<f64> = (0..64).map(|_| jitter_unit()).collect();
        assert!(samples.iter().all(|u| (0.0..1.0).contains(u)));
        let first = samples[0];
        assert!(samples.iter().any(|u| *u != first));
    }

    #[test]
    fn payload_short_utf8() {
        assert_eq!(format_payload(b"hello", 10), "hello");
        assert_eq!(format_payload(b"", 10), "");
        assert!(matches!(
            format_payload(b"hello", 5),
            Cow::Borrowed("hello")
        ));
    }

    #[test]
    fn payload_lossy() {
        assert_eq!(format_payload(b"a\xffb", 10), "a\u{FFFD}b");
    }

    #[test]
    fn payload_truncated() {
        let data = vec![b'x'; 10_000];
        let out = format_payload(&data, 100);
        assert!(out.starts_with(&"x".repeat(100)));
        assert!(!out.starts_with(&"x".repeat(101)));
        assert!(out.ends_with("... [truncated, 10000 bytes total]"), "{out}");
    }

    #[test]
    fn payload_truncation_keeps_characters_whole() {
        // "é" is two bytes; cutting after 3 bytes would split the second one.
        let data = "ééé".as_bytes();
        assert_eq!(data.len(), 6);
        let out = format_payload(data, 3);
        assert_eq!(out, "é... [truncated, 6 bytes total]");
        // A 4-byte character cut in its middle.
        let data = "a😀b".as_bytes();
        let out = format_payload(data, 3);
        assert_eq!(out, "a... [truncated, 6 bytes total]");
    }

    #[test]
    fn message_id_format() {
        let id = MessageIdData {
            ledger_id: 12,
            entry_id: 34,
            ..Default::default()
        };
        assert_eq!(format_message_id(&id), "12:34:-1:-1");
        let id = MessageIdData {
            ledger_id: 12,
            entry_id: 34,
            partition: Some(2),
            batch_index: Some(7),
            ..Default::default()
        };
        assert_eq!(format_message_id(&id), "12:34:2:7");
    }
}
