//! Mode `lease`: client-go's `LeaseLock` and `LeaderElector` on a `coordination.k8s.io/v1`
//! Lease (see the parent module's doc).

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::{Api, Client, api::PostParams};
use tokio::time::Instant;

use super::{
    JITTER_FACTOR, LeaderConfig, jitter, lease_duration_seconds, micro_time, random_unit,
    renewal::{Check, Keep, NOT_RENEWED},
};

/// The Lease lock (client-go's `LeaseLock` + `LeaderElector`).
#[derive(Debug)]
pub(crate) struct LeaseLock {
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
    /// Another write came first (409): whoever wrote it, the next attempt reads it.
    Conflict,
    /// The leader must stop leading, for this reason.
    Lost(String),
}

impl LeaseLock {
    pub(super) fn new(client: Client, config: LeaderConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
        }
    }

    /// Tries until this replica holds the lease; returns when the request that won it
    /// was sent (the renew deadline counts from there).
    pub(super) async fn acquire(&mut self) -> Instant {
        let mut last_holder = String::new();
        loop {
            let sent = Instant::now();
            match self.try_acquire_or_renew(None).await {
                Ok(Attempt::Held) => {
                    tracing::info!(lease = %self.config.lease_name, identity = %self.config.identity, "acquired leadership");
                    return sent;
                }
                Ok(Attempt::HeldBy(holder)) => {
                    if holder != last_holder {
                        tracing::info!(lease = %self.config.lease_name, %holder, "another replica leads; standing by");
                        last_holder = holder;
                    }
                }
                Ok(Attempt::Conflict) => {
                    tracing::debug!(lease = %self.config.lease_name, "a concurrent candidate wrote the lease first");
                }
                // Only a leader steps down, and a candidate passes no renew time: never seen.
                Ok(Attempt::Lost(reason)) => {
                    tracing::warn!(%reason, lease = %self.config.lease_name, "cannot acquire leader lease")
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

    /// One round of client-go's `tryAcquireOrRenew`: read the Lease, [`decide`], and write
    /// what the decision names. `last_renew` is when the last successful renewal was sent,
    /// while leading.
    async fn try_acquire_or_renew(
        &mut self,
        last_renew: Option<Instant>,
    ) -> Result<Attempt, kube::Error> {
        let now = micro_time(jiff::Timestamp::now());
        let me = self.config.identity.as_str();
        let lease = self.api.get_opt(&self.config.lease_name).await?;
        let current = lease.as_ref().map(|l| l.spec.clone().unwrap_or_default());
        let seen = Instant::now();
        let decision = decide(
            seen,
            me,
            current.as_ref(),
            self.observed.as_ref(),
            &self.config,
            last_renew,
        );
        if let Some(spec) = &current {
            observe(&mut self.observed, spec, seen);
        }
        match decision {
            Decision::Wait { holder, expires_in } => {
                tracing::debug!(lease = %self.config.lease_name, %holder, ?expires_in, "lease held by another replica");
                return Ok(Attempt::HeldBy(holder));
            }
            Decision::StepDown { reason } => return Ok(Attempt::Lost(reason)),
            Decision::Acquire {
                expired_holder: Some(previous),
            } => {
                tracing::debug!(lease = %self.config.lease_name, %previous, "taking over an expired lease");
            }
            Decision::Create | Decision::Acquire { .. } | Decision::Renew => {}
        }
        let spec = record(
            current.as_ref(),
            me,
            &now,
            lease_duration_seconds(self.config.lease_duration),
        );
        let written = match lease {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.lease_name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Some(mut lease) => {
                lease.spec = Some(spec);
                self.api
                    .replace(&self.config.lease_name, &PostParams::default(), &lease)
                    .await
            }
        };
        match written {
            Ok(written) => {
                observe(
                    &mut self.observed,
                    &written.spec.unwrap_or_default(),
                    Instant::now(),
                );
                Ok(Attempt::Held)
            }
            // Someone else wrote first (a candidate, or anyone editing the Lease).
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Conflict),
            Err(e) => Err(e),
        }
    }

    /// Hands the lease back (empty holder, 1 s) if this replica holds it.
    async fn hand_back(&mut self) {
        let result = async {
            let Some(mut lease) = self.api.get_opt(&self.config.lease_name).await? else {
                return Ok(false);
            };
            let released = lease.spec.as_ref().and_then(|spec| {
                released(
                    spec,
                    &self.config.identity,
                    micro_time(jiff::Timestamp::now()),
                )
            });
            let Some(spec) = released else {
                return Ok(false);
            };
            lease.spec = Some(spec);
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

impl Keep for LeaseLock {
    /// One renewal. A conflicting write or an API error is retried until the deadline
    /// (as client-go does): the next read shows whether another replica took over.
    async fn check(&mut self, last_held: Instant) -> Check {
        match self.try_acquire_or_renew(Some(last_held)).await {
            Ok(Attempt::Held) => Check::Held,
            // decide() steps down itself on another holder; this is the belt to it.
            Ok(Attempt::HeldBy(holder)) => Check::Lost(format!("lease taken over by {holder}")),
            Ok(Attempt::Lost(reason)) => Check::Lost(reason),
            Ok(Attempt::Conflict) => Check::Unknown("a concurrent write to the lease".into()),
            Err(error) => Check::Unknown(error.to_string()),
        }
    }

    async fn release(&mut self) {
        self.hand_back().await;
    }
}

/// What one look at the Lease tells this replica to do: the decision of client-go's
/// `tryAcquireOrRenew`, without the I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    /// No Lease exists: create one naming this replica.
    Create,
    /// The Lease is free: take it. `expired_holder` is the holder whose record has not
    /// changed for its lease duration, or `None` for a released lease (empty holder).
    Acquire {
        /// The former holder, when its lease expired rather than being released.
        expired_holder: Option<String>,
    },
    /// This replica holds the Lease: renew it.
    Renew,
    /// Another replica holds a valid lease: a candidate stands by.
    Wait {
        /// The holder's identity.
        holder: String,
        /// How long until the lease counts as expired, unless its record changes first.
        expires_in: Duration,
    },
    /// The leader stops leading.
    StepDown {
        /// Why, as reported by [`Leadership::lost`](super::Leadership::lost).
        reason: String,
    },
}

/// Decides one round of the election, purely.
///
/// `now` is the local monotonic clock when `current` (the Lease's spec, `None` when there
/// is no Lease) was read; `observed` is the record seen before and since when it has been
/// seen unchanged; `last_renew` is `Some` (the last successful renewal) only while this
/// replica leads. The holder's `renewTime` is never read: a lease expires when its record
/// has not changed for its `leaseDurationSeconds` as observed here, so clocks on other
/// nodes do not matter.
fn decide(
    now: Instant,
    me: &str,
    current: Option<&LeaseSpec>,
    observed: Option<&(LeaseSpec, Instant)>,
    config: &LeaderConfig,
    last_renew: Option<Instant>,
) -> Decision {
    let leading = last_renew.is_some();
    if last_renew.is_some_and(|last| renew_deadline_passed(now, last, config)) {
        return Decision::StepDown {
            reason: NOT_RENEWED.to_owned(),
        };
    }
    let Some(spec) = current else {
        return Decision::Create;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder == me {
        return Decision::Renew;
    }
    if holder.is_empty() {
        return Decision::Acquire {
            expired_holder: None,
        };
    }
    let their_duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(config.lease_duration, Duration::from_secs);
    let unchanged_for = now.saturating_duration_since(observed_since(observed, spec, now));
    if unchanged_for < their_duration {
        return if leading {
            Decision::StepDown {
                reason: format!("lease taken over by {holder}"),
            }
        } else {
            Decision::Wait {
                holder: holder.to_owned(),
                expires_in: their_duration - unchanged_for,
            }
        };
    }
    Decision::Acquire {
        expired_holder: Some(holder.to_owned()),
    }
}

/// Whether a leader that last renewed at `last_renew` has run out of time at `now`.
fn renew_deadline_passed(now: Instant, last_renew: Instant, config: &LeaderConfig) -> bool {
    now.saturating_duration_since(last_renew) >= config.renew_deadline
}

/// Since when `spec` has been seen unchanged: the time of the previous observation when it
/// shows the same record, else `now` (a changed record restarts the expiry clock).
fn observed_since(
    observed: Option<&(LeaseSpec, Instant)>,
    spec: &LeaseSpec,
    now: Instant,
) -> Instant {
    match observed {
        Some((seen, at)) if seen == spec => *at,
        _ => now,
    }
}

/// Records `spec` as observed at `now`, unless the same record was already observed.
fn observe(observed: &mut Option<(LeaseSpec, Instant)>, spec: &LeaseSpec, now: Instant) {
    if observed.as_ref().is_none_or(|(seen, _)| seen != spec) {
        *observed = Some((spec.clone(), now));
    }
}

/// The record this replica writes when it creates, acquires or renews (client-go's new
/// `LeaderElectionRecord`). Taking the lease from another holder (or none) sets the holder
/// and acquire time and counts a transition; renewing moves the renew time only. Both write
/// this replica's lease duration.
fn record(current: Option<&LeaseSpec>, me: &str, now: &MicroTime, duration_secs: i32) -> LeaseSpec {
    let Some(current) = current else {
        return LeaseSpec {
            holder_identity: Some(me.to_owned()),
            lease_duration_seconds: Some(duration_secs),
            acquire_time: Some(now.clone()),
            renew_time: Some(now.clone()),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        };
    };
    let mut new = current.clone();
    if new.holder_identity.as_deref() != Some(me) {
        new.holder_identity = Some(me.to_owned());
        new.acquire_time = Some(now.clone());
        new.lease_transitions = Some(next_transition(new.lease_transitions));
    }
    new.renew_time = Some(now.clone());
    new.lease_duration_seconds = Some(duration_secs);
    new
}

/// The transition count after one more change of holder. The API server rejects a
/// negative count, so the count saturates at `i32::MAX` (where wrapping, as client-go's
/// int32 does, would make every later takeover fail validation) and a missing (or,
/// never stored, negative) count counts as 0.
fn next_transition(current: Option<i32>) -> i32 {
    current.unwrap_or(0).max(0).saturating_add(1)
}

/// The record a leader writes on shutdown: no holder and a 1 s duration, so a successor
/// takes over at once. `None` when `me` does not hold the lease (nothing to release).
fn released(spec: &LeaseSpec, me: &str, now: MicroTime) -> Option<LeaseSpec> {
    if spec.holder_identity.as_deref() != Some(me) {
        return None;
    }
    Some(LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        renew_time: Some(now),
        ..spec.clone()
    })
}

#[cfg(test)]
mod tests;
