//! Leader election, so only one replica reconciles.
//!
//! Mode `lease` follows client-go's `leaderelection` package on a `coordination.k8s.io/v1`
//! Lease: candidates retry every `retry_period`; a lease counts as expired when its record
//! has not changed for `lease_duration` *as observed locally* (immune to clock skew between
//! nodes); writes use optimistic concurrency (resourceVersion), so two candidates can
//! never both win. The leader renews every `retry_period` and gives up, at once, when it
//! has not renewed for `renew_deadline`, counted from when its last successful renewal was
//! *sent* (a candidate can only have seen that record change after it was sent, so the
//! leader always stops before any candidate may take over), or when it sees another
//! holder. On shutdown it releases the lease (empty holder, 1 s duration) so a successor
//! takes over without waiting.
//!
//! Mode `for-life` is operator-sdk's leader-for-life: the leader creates a ConfigMap lock
//! owned by its own Pod (found through `POD_NAME` and `POD_NAMESPACE`, from the downward
//! API) and never gives it up; the lock goes when that Pod is gone: deleted (garbage
//! collection), finished (Failed, e.g. Evicted, or Succeeded; a Pod being deleted only
//! once its kubelet says so), or on a Node that is NotReady or deleted (see
//! `for_life.rs`). A candidate that finds the owner gone removes exactly that lock, takes
//! it, and waits until the old leader, should it still run, has seen that and stopped
//! before it leads. The leader checks its lock every `retry_period` and stops as soon as it
//! sees the lock gone or owned by another Pod. There is no expiry, so a leader cut off
//! from the API server keeps leading until its Pod is judged gone, at the price of a
//! slower takeover; one cut off at its checks may still write once reconnected, before
//! its next check (`for_life.rs`).
//!
//! A leader never says it leads when it does not: a loss is reported through
//! [`Leadership::lost`], which also resolves when the task keeping the leadership ended
//! without reporting (a panic); and when the controllers have not stopped within half the
//! margin between the renew deadline and the lease duration after a loss was reported
//! (the operator's runtime starved), the process exits (`keep.rs`).
//!
//! The election runs on an OS thread of its own with a small current-thread runtime, and
//! so does its client (`runtime.rs`): a flood of reconciles on the operator's
//! single-threaded runtime cannot delay a renewal past its deadline.
//!
//! Layout: this file holds the configuration, timing helpers, [`Elector`] and
//! [`Leadership`]; `lease.rs` and `for_life.rs` hold each mode, `keep.rs` the loop that
//! keeps a won leadership and `runtime.rs` the election's thread. In both modes, what to
//! do is decided by a pure function of what was read (and, for the lease, of the local
//! observation and clock), unit-tested without a cluster; the async loops only read,
//! decide and perform the write the decision names.

mod for_life;
mod lease;
mod renewal;
mod thread;

use std::{
    hash::{BuildHasher, Hasher},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use tokio::{runtime::Handle, sync::oneshot, task::JoinHandle, time::Instant};

pub(super) use for_life::ForLifeLock;
pub(super) use lease::LeaseLock;

use renewal::{Keep, Pace};
use thread::ElectionRuntime;

/// How leadership is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum LeaderElectionMode {
    /// A `coordination.k8s.io/v1` Lease, renewed while leading (controller-runtime's way).
    Lease,
    /// operator-sdk's leader-for-life: a ConfigMap owned by the operator's own Pod
    /// (`POD_NAME`, `POD_NAMESPACE`), released only when that Pod is gone.
    ForLife,
}

/// Timing and identity of an election.
#[derive(Debug, Clone)]
pub(super) struct LeaderConfig {
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
pub(super) const JITTER_FACTOR: f64 = 1.2;

/// Checks the election timing as client-go's `NewLeaderElector` does: every duration is
/// positive, `lease_duration > renew_deadline > retry_period * JITTER_FACTOR`.
///
/// # Errors
/// A message naming the offending command-line flag(s).
pub(super) fn validate_timing(
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
pub(super) fn jitter(base: Duration, factor: f64, unit: f64) -> Duration {
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
pub(super) fn lease_duration_seconds(d: Duration) -> i32 {
    let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
}

/// `t` truncated to the microsecond precision a `MicroTime` is stored with, so the spec
/// this replica writes equals the spec the API server hands back.
#[must_use]
pub(super) fn micro_time(t: jiff::Timestamp) -> MicroTime {
    let micros = t.as_microsecond();
    MicroTime(jiff::Timestamp::from_microsecond(micros).unwrap_or(t))
}

/// A unique identity: `$POD_NAME`/`$HOSTNAME` plus a random suffix (as controller-runtime does).
#[must_use]
pub(super) fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "operator".to_owned());
    let mut h = random_hasher();
    h.write_u32(std::process::id());
    format!("{host}_{:016x}", h.finish())
}

/// A candidate for leadership. Everything it does runs on the election's own thread
/// (`runtime.rs`); the futures it returns may be awaited on any runtime.
pub(super) struct Elector {
    runtime: Arc<ElectionRuntime>,
    client: Client,
    mode: LeaderElectionMode,
    config: LeaderConfig,
    /// The lock between [`Elector::acquire`] and [`Elector::keep_leading`], with when the
    /// request that won it was sent.
    won: Option<(Lock, Instant)>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("mode", &self.mode)
            .field("config", &self.config)
            .field("won", &self.won)
            .finish_non_exhaustive()
    }
}

/// The lock of one mode.
#[derive(Debug)]
enum Lock {
    Lease(Box<LeaseLock>),
    ForLife(Box<ForLifeLock>),
}

impl Elector {
    /// A candidate in `mode`, on a thread of its own. `client` builds the client the
    /// election talks to the API server with; it is called inside the election's runtime,
    /// so the client's background tasks (its buffer, its connections) run there too, never
    /// behind the operator's reconciles. Must be called within a Tokio runtime (the
    /// election falls back to it if its thread cannot be started).
    ///
    /// # Errors
    /// What `client` returns.
    pub(super) fn start<E>(
        mode: LeaderElectionMode,
        config: LeaderConfig,
        client: impl FnOnce() -> Result<Client, E>,
    ) -> Result<Self, E> {
        let runtime = Arc::new(ElectionRuntime::start());
        let client = {
            let _inside = runtime.handle().enter();
            client()?
        };
        Ok(Self {
            runtime,
            client,
            mode,
            config,
            won: None,
        })
    }

    fn new_lock(&self) -> Lock {
        let (client, config) = (self.client.clone(), self.config.clone());
        match self.mode {
            LeaderElectionMode::Lease => Lock::Lease(Box::new(LeaseLock::new(client, config))),
            LeaderElectionMode::ForLife => {
                Lock::ForLife(Box::new(ForLifeLock::new(client, config)))
            }
        }
    }

    /// Waits until this replica leads. Errors talking to the API are logged and retried.
    /// Cancel-safe: dropping the future stops the attempts.
    pub(super) async fn acquire(&mut self) {
        loop {
            let mut lock = match self.won.take() {
                Some((lock, _)) => lock,
                None => self.new_lock(),
            };
            let task = AbortOnDrop(self.runtime.handle().spawn(async move {
                let since = match &mut lock {
                    Lock::Lease(lease) => lease.acquire().await,
                    Lock::ForLife(for_life) => for_life.acquire().await,
                };
                (lock, since)
            }));
            match task.join().await {
                Ok(won) => {
                    self.won = Some(won);
                    return;
                }
                // A panic: nothing is held; a fresh lock tries again.
                Err(error) => {
                    tracing::error!(%error, "the leader-election task failed; trying again");
                    tokio::time::sleep(self.config.retry_period).await;
                }
            }
        }
    }

    /// Keeps the leadership (renewing or checking in a background task on the election's
    /// thread) until released or lost. Without a won [`Elector::acquire`] the leadership
    /// is lost at once.
    #[must_use]
    pub(super) fn keep_leading(mut self) -> Leadership {
        let pace = Pace::of(self.mode, &self.config);
        let handle = self.runtime.handle().clone();
        let mut leadership = match self.won.take() {
            Some((Lock::Lease(lock), since)) => {
                Leadership::spawn(&handle, *lock, pace, since, renewal::exit_process)
            }
            Some((Lock::ForLife(lock), since)) => {
                Leadership::spawn(&handle, *lock, pace, since, renewal::exit_process)
            }
            None => Leadership::spawn(&handle, NeverWon, pace, Instant::now(), |_| {}),
        };
        leadership.runtime = Some(self.runtime);
        leadership
    }
}

/// A task that is aborted when its handle is dropped (the caller stopped waiting).
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> AbortOnDrop<T> {
    async fn join(mut self) -> Result<T, tokio::task::JoinError> {
        (&mut self.0).await
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The lock of a candidate whose acquisition never completed: lost at the first look.
struct NeverWon;

impl Keep for NeverWon {
    async fn check(&mut self, _last_held: Instant) -> renewal::Check {
        renewal::Check::Lost("leadership was never acquired".to_owned())
    }

    async fn release(&mut self) {}
}

/// Held leadership: resolve [`Leadership::lost`] to learn of a loss; [`Leadership::release`]
/// on shutdown. Dropping it tells the task keeping the leadership that the replica stopped
/// leading (see [`Leadership::lost`]).
#[derive(Debug)]
pub(super) struct Leadership {
    /// `None` once a loss was reported.
    lost: Option<oneshot::Receiver<String>>,
    /// Sent (release) or dropped (the replica stopped leading): the task ends.
    stop: oneshot::Sender<()>,
    /// The task keeping the leadership; it releases the lock when stopped.
    task: JoinHandle<()>,
    /// The election's thread, kept alive as long as the leadership.
    runtime: Option<Arc<ElectionRuntime>>,
}

/// The reason [`Leadership::lost`] gives when the task keeping the leadership ended
/// without reporting (it panicked, or its runtime went away).
pub(super) const TASK_ENDED: &str = "the task keeping the leadership ended unexpectedly";

impl Leadership {
    /// Keeps `lock` from `since` (when the request that won it was sent) in a task on
    /// `handle`; `fence` runs when a loss is not acknowledged in time (see `keep.rs`).
    fn spawn<K: Keep>(
        handle: &Handle,
        lock: K,
        pace: Pace,
        since: Instant,
        fence: impl FnOnce(&str) + Send + 'static,
    ) -> Self {
        let (lost_tx, lost) = oneshot::channel();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let task = handle.spawn(renewal::keep(lock, pace, since, stop_rx, lost_tx, fence));
        Leadership {
            lost: Some(lost),
            stop,
            task,
            runtime: None,
        }
    }

    /// Resolves with the reason when leadership is lost: renewal failed or another holder
    /// (lease), the lock gone or taken (for-life), or the task keeping the leadership ended
    /// without a word ([`TASK_ENDED`]), so a dead renewal never reads as leading. The
    /// caller must stop reconciling at once and then drop this value (or release it): the
    /// process exits when that does not happen within the grace `keep.rs` describes.
    /// Resolves once; pending afterwards.
    pub(super) async fn lost(&mut self) -> String {
        let Some(lost) = self.lost.as_mut() else {
            return std::future::pending().await;
        };
        let reason = match lost.await {
            Ok(reason) => reason,
            Err(_) => TASK_ENDED.to_owned(),
        };
        self.lost = None;
        reason
    }

    /// Stops renewing and hands the lease back so a successor can take over at once.
    pub(super) async fn release(self) {
        let Leadership {
            stop,
            task,
            runtime,
            ..
        } = self;
        let _ = stop.send(());
        if let Err(error) = task.await {
            tracing::warn!(%error, "the task keeping the leadership failed; lease not released");
        }
        drop(runtime);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn the_election_client_is_built_on_the_election_thread() {
        let config = LeaderConfig {
            lease_name: "lock".into(),
            namespace: "default".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        };
        let mut built_on = None;
        let started = Elector::start(LeaderElectionMode::Lease, config, || {
            built_on = Some((Handle::current().id(), std::thread::current().id()));
            Err("no cluster here")
        });
        assert_eq!(started.err(), Some("no cluster here"));
        let (runtime, thread) = built_on.unwrap();
        assert_ne!(runtime, Handle::current().id());
        // Entered from this thread; its tasks (the client's buffer) run on the other.
        assert_eq!(thread, std::thread::current().id());
    }

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
