//! Mode `lease`: client-go's `LeaseLock` and `LeaderElector` on a `coordination.k8s.io/v1`
//! Lease (see the parent module's doc).

use std::time::{Duration, Instant};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{Api, Client, api::PostParams};
use tokio::sync::oneshot;

use super::{
    JITTER_FACTOR, LeaderConfig, Leadership, jitter, lease_duration_seconds, micro_time,
    random_unit,
};

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
    pub(super) fn new(client: Client, config: LeaderConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
        }
    }

    pub(super) async fn acquire(&mut self) {
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

    pub(super) fn keep_leading(mut self) -> Leadership {
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

    pub(super) async fn release(&mut self) {
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
