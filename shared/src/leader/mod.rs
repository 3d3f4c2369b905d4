//! Leader election, so only one replica reconciles.
//!
//! Mode `lease` follows client-go's `leaderelection` package on a `coordination.k8s.io/v1`
//! Lease: candidates retry every `retry_period`; a lease counts as expired when its record
//! has not changed for `lease_duration` *as observed locally* (immune to clock skew between
//! nodes); writes use optimistic concurrency (resourceVersion), so two candidates can
//! never both win. The leader renews every `retry_period` and gives up, at once, when it
//! has not renewed for `renew_deadline` or sees another holder. On shutdown it releases the
//! lease (empty holder, 1 s duration) so a successor takes over without waiting.
//!
//! Mode `for-life` is operator-sdk's leader-for-life: the leader creates a ConfigMap lock
//! owned by its own Pod (found through `POD_NAME` and `POD_NAMESPACE`, from the downward
//! API) and never gives it up; the lock goes when that Pod object is deleted (garbage
//! collection, or a candidate that finds the owner gone). There is no split brain even when
//! a node is cut off (a lease could expire while the old leader still runs), at the price
//! of slower takeover.
//!
//! Layout: this file holds the configuration, timing helpers, [`Elector`] and
//! [`Leadership`]; `lease.rs` and `for_life.rs` hold each mode. In both, what to do is
//! decided by a pure function of what was read (and, for the lease, of the local
//! observation and clock), unit-tested without a cluster; the async loops only read,
//! decide and perform the write the decision names.

mod for_life;
mod lease;

use std::{
    hash::{BuildHasher, Hasher},
    time::Duration,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use tokio::{sync::oneshot, task::JoinHandle};

pub use for_life::ForLifeLock;
pub use lease::LeaseLock;

use crate::cli::LeaderElectionMode;

/// Timing and identity of an election.
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    /// Name of the Lease (`--leader-election-id`).
    pub lease_name: String,
    /// Namespace of the Lease.
    pub namespace: String,
    /// This replica's identity (pod name plus a random suffix).
    pub identity: String,
    /// Validity of the lease without renewal (15 s).
    pub lease_duration: Duration,
    /// How long the leader retries renewing before giving up (10 s).
    pub renew_deadline: Duration,
    /// Interval between attempts (2 s).
    pub retry_period: Duration,
}

/// client-go's `JitterFactor`: a candidate waits between `retry_period` and
/// `retry_period * (1 + JITTER_FACTOR)` before its next attempt, so candidates that started
/// together do not keep hitting the API server in lockstep.
pub const JITTER_FACTOR: f64 = 1.2;

/// Checks the election timing as client-go's `NewLeaderElector` does: every duration is
/// positive, `lease_duration > renew_deadline > retry_period * JITTER_FACTOR`.
///
/// # Errors
/// A message naming the offending command-line flag(s).
pub fn validate_timing(
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
) -> Result<(), String> {
    for (flag, value) in [
        ("--leader-elect-lease-duration", lease_duration),
        ("--leader-elect-renew-deadline", renew_deadline),
        ("--leader-elect-retry-period", retry_period),
    ] {
        if value.is_zero() {
            return Err(format!("{flag} must be greater than zero"));
        }
    }
    if lease_duration <= renew_deadline {
        return Err(format!(
            "--leader-elect-lease-duration ({lease_duration:?}) must be greater than \
             --leader-elect-renew-deadline ({renew_deadline:?})"
        ));
    }
    if renew_deadline.as_secs_f64() <= retry_period.as_secs_f64() * JITTER_FACTOR {
        return Err(format!(
            "--leader-elect-renew-deadline ({renew_deadline:?}) must be greater than \
             --leader-elect-retry-period ({retry_period:?}) x {JITTER_FACTOR}"
        ));
    }
    Ok(())
}

/// `base` stretched by `unit * factor * base` (client-go's `wait.Jitter`); `unit` is a
/// random number in `[0, 1)` (clamped), passed in so the arithmetic is testable.
#[must_use]
pub fn jitter(base: Duration, factor: f64, unit: f64) -> Duration {
    let extra = base.as_secs_f64() * factor * unit.clamp(0.0, 1.0);
    base.saturating_add(Duration::try_from_secs_f64(extra).unwrap_or(Duration::ZERO))
}

/// A hasher keyed at random by the standard library and fed the current time: the seed
/// of [`random_unit`] and [`default_identity`] (plenty for spreading retries and telling
/// replicas apart; not for anything secret).
fn random_hasher() -> std::collections::hash_map::DefaultHasher {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h
}

/// A random number in `[0, 1)`.
fn random_unit() -> f64 {
    // The top 53 bits as a fraction: exactly representable in an f64.
    #[allow(clippy::cast_precision_loss)]
    let unit = (random_hasher().finish() >> 11) as f64 / (1u64 << 53) as f64;
    unit
}

/// Rounds `d` up to whole seconds, at least 1: the Lease's `leaseDurationSeconds` is an
/// integer, and rounding down would let a candidate take over before the leader's deadline.
#[must_use]
pub fn lease_duration_seconds(d: Duration) -> i32 {
    let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
}

/// `t` truncated to the microsecond precision a `MicroTime` is stored with, so the spec
/// this replica writes equals the spec the API server hands back.
#[must_use]
pub fn micro_time(t: jiff::Timestamp) -> MicroTime {
    let micros = t.as_microsecond();
    MicroTime(jiff::Timestamp::from_microsecond(micros).unwrap_or(t))
}

/// A unique identity: `$POD_NAME`/`$HOSTNAME` plus a random suffix (as controller-runtime does).
#[must_use]
pub fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "operator".to_owned());
    let mut h = random_hasher();
    h.write_u32(std::process::id());
    format!("{host}_{:016x}", h.finish())
}

/// A candidate for leadership.
#[derive(Debug)]
pub enum Elector {
    /// A `coordination.k8s.io/v1` Lease.
    Lease(LeaseLock),
    /// A ConfigMap owned by this replica's Pod, held for the Pod's life.
    ForLife(ForLifeLock),
}

impl Elector {
    /// A candidate in `mode`.
    #[must_use]
    pub fn new(client: Client, mode: LeaderElectionMode, config: LeaderConfig) -> Self {
        match mode {
            LeaderElectionMode::Lease => Elector::Lease(LeaseLock::new(client, config)),
            LeaderElectionMode::ForLife => Elector::ForLife(ForLifeLock::new(client, config)),
        }
    }

    /// Waits until this replica leads. Errors talking to the API are logged and retried.
    pub async fn acquire(&mut self) {
        match self {
            Elector::Lease(lock) => lock.acquire().await,
            Elector::ForLife(lock) => lock.acquire().await,
        }
    }

    /// Keeps the leadership (renewing in a background task) until released or lost.
    #[must_use]
    pub fn keep_leading(self) -> Leadership {
        match self {
            Elector::Lease(lock) => lock.keep_leading(),
            Elector::ForLife(lock) => lock.keep_leading(),
        }
    }
}

/// Held leadership: resolve [`Leadership::lost`] to learn of a loss; [`Leadership::release`] on shutdown.
#[derive(Debug)]
pub struct Leadership {
    lost: oneshot::Receiver<String>,
    stop: oneshot::Sender<()>,
    /// The renewal task; it returns the lock to release, if the mode releases one.
    task: JoinHandle<Option<LeaseLock>>,
}

impl Leadership {
    /// Resolves with the reason when leadership is lost (renewal failed or another holder).
    /// Never resolves for a leader-for-life.
    pub async fn lost(&mut self) -> String {
        match (&mut self.lost).await {
            Ok(reason) => reason,
            Err(_) => std::future::pending().await,
        }
    }

    /// Stops renewing and hands the lease back so a successor can take over at once.
    pub async fn release(self) {
        let _ = self.stop.send(());
        match self.task.await {
            Ok(Some(mut lock)) => lock.release().await,
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "lease renewal task failed; lease not released"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn identities_are_unique() {
        assert_ne!(default_identity(), default_identity());
    }

    #[test]
    fn timing_validated_as_client_go() {
        let s = Duration::from_secs;
        assert!(validate_timing(s(15), s(10), s(2)).is_ok());
        let cases = [
            (
                s(0),
                s(10),
                s(2),
                "--leader-elect-lease-duration must be greater than zero",
            ),
            (
                s(15),
                s(0),
                s(2),
                "--leader-elect-renew-deadline must be greater than zero",
            ),
            (
                s(15),
                s(10),
                s(0),
                "--leader-elect-retry-period must be greater than zero",
            ),
            (
                s(10),
                s(10),
                s(2),
                "--leader-elect-lease-duration (10s) must be greater than",
            ),
            (s(15), s(16), s(2), "--leader-elect-lease-duration"),
            // 10 s is not more than 9 s x 1.2, although it is more than 9 s.
            (
                s(15),
                s(10),
                s(9),
                "--leader-elect-renew-deadline (10s) must be greater than",
            ),
        ];
        for (lease, renew, retry, want) in cases {
            let err = validate_timing(lease, renew, retry).unwrap_err();
            assert!(err.contains(want), "{err} does not contain {want}");
        }
        // Sub-second values are fine when ordered.
        assert!(
            validate_timing(
                Duration::from_millis(1500),
                s(1),
                Duration::from_millis(800)
            )
            .is_ok()
        );
    }

    #[test]
    fn retry_is_jittered_like_client_go() {
        let base = Duration::from_secs(2);
        assert_eq!(jitter(base, JITTER_FACTOR, 0.0), base);
        assert_eq!(
            jitter(base, JITTER_FACTOR, 0.5),
            Duration::from_millis(3200)
        );
        assert!(jitter(base, JITTER_FACTOR, 2.0) <= Duration::from_millis(4400));
        let samples: Vec<f64> = (0..64).map(|_| random_unit()).collect();
        assert!(samples.iter().all(|u| (0.0..1.0).contains(u)));
        assert!(samples.windows(2).any(|w| w[0] != w[1]), "{samples:?}");
    }

    #[test]
    fn lease_keeps_sub_second_precision() {
        assert_eq!(lease_duration_seconds(Duration::from_secs(15)), 15);
        assert_eq!(lease_duration_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(lease_duration_seconds(Duration::from_millis(200)), 1);
        let t: jiff::Timestamp = "2026-11-23T12:00:00.123456789Z".parse().unwrap();
        let json = serde_json::to_value(micro_time(t)).unwrap();
        assert_eq!(json, "2026-11-23T12:00:00.123456Z");
        let back: MicroTime = serde_json::from_value(json).unwrap();
        assert_eq!(back, micro_time(t));
    }
}
