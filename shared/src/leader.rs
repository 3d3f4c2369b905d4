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

use std::{
    hash::{BuildHasher, Hasher},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::{ConfigMap, Pod},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, PostParams, Preconditions},
};
use tokio::{sync::oneshot, task::JoinHandle};

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

/// A random number in `[0, 1)`, from the standard library's randomly keyed hasher
/// (plenty for spreading retries; not for anything secret).
fn random_unit() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    // The top 53 bits as a fraction: exactly representable in an f64.
    #[allow(clippy::cast_precision_loss)]
    let unit = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
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
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
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
            Elector::ForLife(_) => {
                // Held until the Pod is gone: never lost, nothing to hand back on shutdown.
                let (lost_tx, lost) = oneshot::channel();
                let (stop, stop_rx) = oneshot::channel::<()>();
                let task = tokio::spawn(async move {
                    let _ = stop_rx.await;
                    drop(lost_tx);
                    None
                });
                Leadership { lost, stop, task }
            }
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

/// The Lease lock (client-go's `LeaseLock` + `LeaderElector`).
#[derive(Debug)]
pub struct LeaseLock {
    api: Api<Lease>,
    config: LeaderConfig,
    /// The lease spec last seen and when it was first seen unchanged.
    observed: Option<(LeaseSpec, Instant)>,
}

/// Outcome of one attempt.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    /// We hold the lease (acquired or renewed).
    Held,
    /// Someone else holds a lease that has not expired.
    HeldBy(String),
}

impl LeaseLock {
    fn new(client: Client, config: LeaderConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
        }
    }

    async fn acquire(&mut self) {
        let mut last_holder = String::new();
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => {
                    tracing::info!(lease = %self.config.lease_name, identity = %self.config.identity, "acquired leadership");
                    return;
                }
                Ok(Attempt::HeldBy(holder)) => {
                    if holder != last_holder {
                        tracing::info!(lease = %self.config.lease_name, %holder, "another replica leads; standing by");
                        last_holder = holder;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, lease = %self.config.lease_name, "cannot acquire leader lease")
                }
            }
            tokio::time::sleep(jitter(
                self.config.retry_period,
                JITTER_FACTOR,
                random_unit(),
            ))
            .await;
        }
    }

    fn keep_leading(mut self) -> Leadership {
        let (lost_tx, lost) = oneshot::channel();
        let (stop, mut stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut last_renew = Instant::now();
            loop {
                tokio::select! {
                    _ = &mut stop_rx => return Some(self),
                    () = tokio::time::sleep(self.config.retry_period) => {}
                }
                let remaining = self
                    .config
                    .renew_deadline
                    .saturating_sub(last_renew.elapsed());
                let reason =
                    match tokio::time::timeout(remaining, self.try_acquire_or_renew()).await {
                        Ok(Ok(Attempt::Held)) => {
                            last_renew = Instant::now();
                            continue;
                        }
                        Ok(Ok(Attempt::HeldBy(holder))) => format!("lease taken over by {holder}"),
                        Ok(Err(error)) if last_renew.elapsed() < self.config.renew_deadline => {
                            tracing::warn!(%error, "cannot renew leader lease; retrying");
                            continue;
                        }
                        Ok(Err(error)) => format!("not renewed within the renew deadline: {error}"),
                        Err(_) => "not renewed within the renew deadline".to_owned(),
                    };
                let _ = lost_tx.send(reason);
                return Some(self);
            }
        });
        Leadership { lost, stop, task }
    }

    fn observe(&mut self, spec: &LeaseSpec) -> Instant {
        match &self.observed {
            Some((seen, at)) if seen == spec => *at,
            _ => {
                let now = Instant::now();
                self.observed = Some((spec.clone(), now));
                now
            }
        }
    }

    fn duration_secs(&self) -> i32 {
        lease_duration_seconds(self.config.lease_duration)
    }

    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let now = micro_time(jiff::Timestamp::now());
        let me = self.config.identity.clone();
        let Some(mut lease) = self.api.get_opt(&self.config.lease_name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.lease_name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(self.duration_secs()),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(&created.spec.unwrap_or_default());
                    Ok(Attempt::Held)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    Ok(Attempt::HeldBy("a concurrent candidate".into()))
                }
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let seen_at = self.observe(&spec);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let held_by_me = holder == me;
        let their_duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.config.lease_duration, Duration::from_secs);
        if !holder.is_empty() && !held_by_me && seen_at.elapsed() < their_duration {
            return Ok(Attempt::HeldBy(holder));
        }
        let mut new = spec;
        if !held_by_me {
            new.holder_identity = Some(me);
            new.acquire_time = Some(now.clone());
            new.lease_transitions = Some(new.lease_transitions.unwrap_or(0) + 1);
        }
        new.renew_time = Some(now);
        new.lease_duration_seconds = Some(self.duration_secs());
        lease.spec = Some(new);
        match self
            .api
            .replace(&self.config.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => {
                self.observe(&updated.spec.unwrap_or_default());
                Ok(Attempt::Held)
            }
            // Someone else wrote first; they hold it now.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                Ok(Attempt::HeldBy("a concurrent candidate".into()))
            }
            Err(e) => Err(e),
        }
    }

    async fn release(&mut self) {
        let result = async {
            let Some(mut lease) = self.api.get_opt(&self.config.lease_name).await? else {
                return Ok(false);
            };
            let Some(spec) = lease.spec.as_mut() else {
                return Ok(false);
            };
            if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
                return Ok(false);
            }
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(micro_time(jiff::Timestamp::now()));
            self.api
                .replace(&self.config.lease_name, &PostParams::default(), &lease)
                .await?;
            Ok::<_, kube::Error>(true)
        }
        .await;
        match result {
            Ok(true) => tracing::info!(lease = %self.config.lease_name, "released leadership"),
            Ok(false) => {
                tracing::info!(lease = %self.config.lease_name, "lease not held; nothing to release")
            }
            Err(error) => {
                tracing::warn!(%error, "cannot release leader lease; a successor waits for it to expire")
            }
        }
    }
}

/// operator-sdk's leader-for-life lock: a ConfigMap owned by the leader's Pod.
#[derive(Debug)]
pub struct ForLifeLock {
    config_maps: Api<ConfigMap>,
    pods: Api<Pod>,
    config: LeaderConfig,
}

/// How long a for-life candidate waits between attempts at most (operator-sdk: 16 s).
const FOR_LIFE_MAX_WAIT: Duration = Duration::from_secs(16);

impl ForLifeLock {
    fn new(client: Client, config: LeaderConfig) -> Self {
        // An owner reference cannot cross namespaces: the lock lives beside the Pod.
        let namespace = std::env::var("POD_NAMESPACE")
            .ok()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| config.namespace.clone());
        Self {
            config_maps: Api::namespaced(client.clone(), &namespace),
            pods: Api::namespaced(client, &namespace),
            config,
        }
    }

    async fn acquire(&mut self) {
        let mut wait = Duration::from_secs(1);
        let mut last_owner = String::new();
        loop {
            match self.try_acquire().await {
                Ok(None) => {
                    tracing::info!(lock = %self.config.lease_name, "acquired leadership for life");
                    return;
                }
                Ok(Some(owner)) => {
                    if owner != last_owner {
                        tracing::info!(lock = %self.config.lease_name, %owner, "the pod that leads for life still exists; standing by");
                        last_owner = owner;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, lock = %self.config.lease_name, "cannot acquire the leader-for-life lock");
                }
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(FOR_LIFE_MAX_WAIT);
        }
    }

    /// `Ok(None)` when this Pod now holds the lock; `Ok(Some(owner))` when another Pod does.
    async fn try_acquire(&mut self) -> Result<Option<String>, ForLifeError> {
        let pod_name = std::env::var("POD_NAME").map_err(|_| ForLifeError::NoPodName)?;
        let me = self.pods.get(&pod_name).await?;
        let my_uid = me.meta().uid.clone().ok_or(ForLifeError::NoPodUid)?;
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: pod_name.clone(),
            uid: my_uid.clone(),
            ..OwnerReference::default()
        };
        let lock = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.config.lease_name.clone()),
                owner_references: Some(vec![owner]),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        match self.config_maps.create(&PostParams::default(), &lock).await {
            Ok(_) => return Ok(None),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        let Some(existing) = self.config_maps.get_opt(&self.config.lease_name).await? else {
            return Ok(Some("(lock just deleted)".into()));
        };
        let Some(holder) = existing
            .owner_references()
            .iter()
            .find(|o| o.kind == "Pod")
            .cloned()
        else {
            return Ok(Some("(a lock without an owner Pod)".into()));
        };
        if holder.uid == my_uid {
            // This Pod led before (the process restarted): it still does.
            return Ok(None);
        }
        let alive = self
            .pods
            .get_opt(&holder.name)
            .await?
            .is_some_and(|p| p.meta().uid.as_deref() == Some(holder.uid.as_str()));
        if !alive {
            // The owner is gone but garbage collection has not removed the lock yet:
            // delete exactly that lock (precondition on its UID) and try again.
            let precondition = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: existing.meta().uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match self
                .config_maps
                .delete(&self.config.lease_name, &precondition)
                .await
            {
                Ok(_) => {
                    tracing::info!(lock = %self.config.lease_name, previous = %holder.name, "removed the lock of a pod that is gone")
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Some(holder.name))
    }
}

/// Why a leader-for-life attempt failed.
#[derive(Debug, thiserror::Error)]
enum ForLifeError {
    /// The downward API did not provide the Pod's name.
    #[error("leader-for-life needs POD_NAME (and POD_NAMESPACE) from the downward API")]
    NoPodName,
    /// The Pod object has no UID (never happens for a stored object).
    #[error("the operator's Pod has no UID")]
    NoPodUid,
    /// The API call failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
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
