//! The reaction phase: how soon the operator acts on a change a person makes by hand.
//!
//! Round after round, one object at rest is changed as a person would change it: scaled
//! through its scale subresource (`kubectl scale`) where the kind has one, else a field of
//! its spec edited (Lolcow: the greeting). Each round times, from just before the bench
//! sends the change, (a) the operator's first write to that object's children and (b)
//! the object's status showing the change done (Ready at the new spec; for the Go Lolcow
//! and PulsarConsumer, which write no status worth reading, their Deployment (and the
//! Lolcow's Service) showing it, see `StatusShape`), both as the bench's own watches see
//! them (their clock: when the event reached the bench). Rounds
//! use a different object each (the first, second, ...), each at rest since the objects
//! converged, and the next round starts once the last one has converged and a second
//! has passed.

use super::options::Operator;
use super::record::Reaction;
use super::session::Session;
use super::timing::{quantile, seconds, wait_until};
use anyhow::{Context, Result};
use kube::api::{Patch, PatchParams};
use serde_json::json;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use xtask::say;

/// How long one round may take.
const ROUND_TIMEOUT: Duration = Duration::from_secs(120);

/// The pause before each round, so that the object and the operator are at rest.
const AT_REST: Duration = Duration::from_secs(1);

impl Session<'_> {
    /// The reaction phase (`--reaction-rounds`, none with 0).
    pub(super) async fn reaction(&mut self) -> Result<Option<Reaction>> {
        let rounds = self.target.args.reaction_rounds;
        if rounds == 0 {
            return Ok(None);
        }
        let (op, base) = (self.op, self.target.args.replicas);
        let mut replicas: HashMap<String, i32> = HashMap::new();
        let mut want_pods = (self.n as usize) * op.pods_per_object(base) as usize;
        let (mut to_child, mut to_status) = (Vec::new(), Vec::new());
        let mut what = String::new();
        for round in 0..rounds {
            let name = self.names[round as usize % self.names.len()].clone();
            tokio::time::sleep(AT_REST).await;
            let from = replicas.get(&name).copied().unwrap_or(base);
            let to = if from == base { base + 1 } else { base };
            let generation_before = self.generation_of(&name);
            let writes_before = self.children.lock().map_or(0, |c| c.count(&name));
            let sent = Instant::now();
            what = self.send_reaction_change(&name, round, from, to).await?;
            if op.has_scale() {
                want_pods =
                    want_pods + op.pods_per_object(to) as usize - op.pods_per_object(from) as usize;
                replicas.insert(name.clone(), to);
            }
            let generation = self.new_generation(&name, generation_before, round).await?;
            let child = wait_until(
                &format!("round {round}: a write to the children of {name}"),
                ROUND_TIMEOUT,
                || self.first_child_write(&name, writes_before).is_some(),
                String::new,
            )
            .await
            .and_then(|_| {
                self.first_child_write(&name, writes_before)
                    .context("no child write")
            })?;
            wait_until(
                &format!("round {round}: {name} Ready at generation {generation}"),
                ROUND_TIMEOUT,
                || {
                    self.ready_at(&name, generation).is_some()
                        && self.pods.lock().is_ok_and(|p| p.exactly_ready(want_pods))
                },
                || {
                    format!(
                        "{} pods, {} Ready, {want_pods} wanted",
                        self.active_pods(),
                        self.ready_pods()
                    )
                },
            )
            .await?;
            let status = self
                .ready_at(&name, generation)
                .context("no Ready status")?;
            to_child.push(seconds(sent, child));
            to_status.push(seconds(sent, status));
        }
        let phase = self.end_phase()?;
        let (child_sorted, status_sorted) = (sorted(&to_child), sorted(&to_status));
        let reaction = Reaction {
            what,
            rounds,
            child_write_p50_seconds: quantile(&child_sorted, 0.5),
            child_write_p99_seconds: quantile(&child_sorted, 0.99),
            status_p50_seconds: quantile(&status_sorted, 0.5),
            status_p99_seconds: quantile(&status_sorted, 0.99),
            child_write_seconds: to_child,
            status_seconds: to_status,
            cpu_seconds: phase.cpu_seconds,
            requests: super::record::Requests::from_counts(phase.requests.by_verb, rounds),
        };
        say!(
            "    reaction ({}, {rounds} rounds): first child write p50 {}s p99 {}s; status p50 {}s p99 {}s",
            reaction.what,
            reaction.child_write_p50_seconds,
            reaction.child_write_p99_seconds,
            reaction.status_p50_seconds,
            reaction.status_p99_seconds
        );
        Ok(Some(reaction))
    }

    /// Sends round `round`'s change of `name` (replicas `from` -> `to` where the kind
    /// scales); returns what it was, for the record.
    async fn send_reaction_change(
        &self,
        name: &str,
        round: u32,
        from: i32,
        to: i32,
    ) -> Result<String> {
        let pp = PatchParams::default();
        if self.op.has_scale() {
            self.cr_api(name)
                .patch_scale(
                    name,
                    &pp,
                    &Patch::Merge(json!({ "spec": { "replicas": to } })),
                )
                .await
                .with_context(|| format!("scaling {name}"))?;
            let direction = if to > from { "up" } else { "down" };
            return Ok(format!(
                "scale subresource, one replica {direction} ({from} <-> {to})"
            ));
        }
        let greeting = format!("Moo, round {round}");
        match self.op {
            Operator::Lolcow => {
                self.cr_api(name)
                    .patch(
                        name,
                        &pp,
                        &Patch::Merge(json!({ "spec": { "greeting": greeting } })),
                    )
                    .await
                    .with_context(|| format!("editing {name}"))?;
                Ok("spec.greeting edited (rolls the Deployment)".to_owned())
            }
            other => anyhow::bail!("no reaction change for {}", other.name()),
        }
    }

    /// The generation of `name` as the bench's watch has it (0 when unseen).
    fn generation_of(&self, name: &str) -> i64 {
        self.objects
            .lock()
            .map_or(0, |o| o.generation.get(name).copied().unwrap_or(0))
    }

    /// Waits until the watch shows `name` at a generation after `before`; returns it.
    async fn new_generation(&self, name: &str, before: i64, round: u32) -> Result<i64> {
        wait_until(
            &format!("round {round}: the change of {name} in the watch"),
            ROUND_TIMEOUT,
            || self.generation_of(name) > before,
            String::new,
        )
        .await?;
        Ok(self.generation_of(name))
    }

    /// The first write to `name`'s children after its `after`-th one, as watched.
    fn first_child_write(&self, name: &str, after: usize) -> Option<Instant> {
        self.children.lock().ok()?.first_after(name, after)
    }

    /// When the watch first saw `name` Ready at `generation`.
    fn ready_at(&self, name: &str, generation: i64) -> Option<Instant> {
        self.objects
            .lock()
            .ok()?
            .ready_at
            .get(&(name.to_owned(), generation))
            .copied()
    }
}

/// `values`, sorted.
fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v
}
