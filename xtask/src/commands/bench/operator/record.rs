//! The record of one operator run, `target/bench/<run>.json`: what the run's
//! phases fill in and what the summary writers read back.
//!
//! The field names and nesting are those of the files recorded so far; a
//! field a file lacks (recorded before it existed) reads as zero or empty,
//! and a missing `restart` as `None`.

use crate::commands::bench::common::round3;
use crate::commands::bench::machine::Machine;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use xtask::support::logged_requests;

/// One run of `cargo xtask bench operator`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct RunRecord {
    /// Always `operator` (the files of the other benchmarks share the folder).
    pub benchmark: String,
    /// The operator's command-line name (`podset`...).
    pub operator: String,
    /// Its crate and binary (`go-ref -controller <kind>` for the Go original).
    pub binary: String,
    /// `rust` (empty in older files), or `go`: the seed's Go original on
    /// controller-runtime, measured side by side (`--go-ref`).
    pub implementation: String,
    /// How the binary was built.
    pub build: String,
    /// Objects created at once (N).
    pub objects: u32,
    /// Replicas of each object.
    pub replicas: i32,
    /// Pods that belong to nobody, created before the operator started.
    pub stranger_pods: u32,
    /// Namespaces the objects were spread over (0 in older files: one).
    pub namespaces: u32,
    /// Pods one object runs.
    pub pods_per_object: i32,
    /// When the run ended, seconds since the Unix epoch.
    pub unix_time: u64,
    /// The commit measured (`git rev-parse --short HEAD`), when known.
    pub git_commit: Option<String>,
    /// The machine it ran on.
    pub machine: Machine,
    /// Extra environment of the operator process (`--env`).
    pub operator_env: Vec<String>,
    /// How requests were counted.
    pub request_counting: String,
    /// Writes one object needs at least to become Ready.
    pub minimum_writes_per_object: u64,
    /// How the run read that an object is Ready (its status, or for the Go Lolcow and
    /// PulsarConsumer, which write none worth reading, its children); empty in older files.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub readiness: String,
    /// The image the children's pods ran (Lolcow, PulsarConsumer; the same for the Rust
    /// operator and the Go original); empty for the other kinds and in older files.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub workload_image: String,
    /// From the start to idle (no objects).
    pub startup: Startup,
    /// From creating N objects to every one Ready.
    pub create: Create,
    /// The pods seen.
    pub pods: PodCounts,
    /// The quiet window after convergence.
    pub steady: Steady,
    /// Stop and start with everything in place (`None` in older files).
    pub restart: Option<Restart>,
    /// One object at rest changed at a time (`None` in older files, or with 0 rounds).
    pub reaction: Option<Reaction>,
    /// Every spec changed at once, until every object is Ready again.
    pub change: Change,
    /// Every object deleted, until no child is left.
    pub delete: Delete,
    /// The figures at the end of the run (both processes).
    pub end: End,
    /// Converged RSS above idle, per object, KiB.
    pub kib_per_object: f64,
}

/// API requests in one stretch of the operator's log.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Requests {
    /// Every request.
    pub total: u64,
    /// The writes among them.
    pub writes: u64,
    /// `total` per object.
    pub per_object: f64,
    /// `writes` per object.
    pub writes_per_object: f64,
    /// Requests by `"<verb> <resource>"`.
    pub by_verb: BTreeMap<String, u64>,
}

impl Requests {
    /// The requests a stretch of log records, with `objects` objects in play.
    #[cfg(test)]
    pub(crate) fn in_log(log: &str, objects: u32) -> Self {
        Self::from_counts(logged_requests::count(log), objects)
    }

    /// Requests counted by `"<verb> <resource>"`, with `objects` objects in play.
    pub(crate) fn from_counts(by_verb: BTreeMap<String, u64>, objects: u32) -> Self {
        let objects = objects.max(1);
        let (total, writes) = logged_requests::totals(&by_verb);
        Self {
            total,
            writes,
            per_object: round3(total as f64 / f64::from(objects)),
            writes_per_object: round3(writes as f64 / f64::from(objects)),
            by_verb,
        }
    }

    /// Writes to a `/status` subresource.
    pub(crate) fn status_writes(&self) -> u64 {
        self.by_verb
            .iter()
            .filter(|(k, _)| {
                k.split_once(' ').is_some_and(|(verb, resource)| {
                    logged_requests::is_write(verb) && resource.ends_with("/status")
                })
            })
            .map(|(_, v)| v)
            .sum()
    }

    /// The sum of two counts.
    pub(crate) fn plus(mut self, other: &Self, objects: u32) -> Self {
        for (k, v) in &other.by_verb {
            *self.by_verb.entry(k.clone()).or_insert(0) += v;
        }
        Self::from_counts(self.by_verb, objects)
    }
}

/// From the start to idle.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Startup {
    /// From the start to `/readyz` answering 200.
    pub ready_seconds: f64,
    /// `VmRSS` when idle, KiB.
    pub idle_rss_kib: u64,
    /// `VmHWM` when idle, KiB.
    pub idle_hwm_kib: u64,
    /// `RssAnon` when idle, KiB.
    pub idle_anon_kib: u64,
    /// Threads when idle.
    pub threads: u64,
    /// CPU time until idle.
    pub cpu_seconds: f64,
    /// Requests until idle.
    pub requests: Requests,
}

/// From creating N objects to every one Ready with its pods.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Create {
    /// Until every create request was answered.
    pub submit_seconds: f64,
    /// Until every object was Ready with exactly the wanted pods, each pod Ready.
    pub all_ready_seconds: f64,
    /// Until every object's own status first said Ready (for the Go Lolcow and
    /// PulsarConsumer, its children: see `readiness`).
    pub objects_ready_seconds: f64,
    /// Until exactly the wanted pods first existed, each Ready.
    pub pods_ready_seconds: f64,
    /// Create request to Ready, per object: the median.
    pub latency_p50_seconds: f64,
    /// The 99th percentile.
    pub latency_p99_seconds: f64,
    /// The slowest.
    pub latency_max_seconds: f64,
    /// When each object became Ready, seconds since the first create, sorted.
    pub ready_curve_seconds: Vec<f64>,
    /// `VmHWM` once converged, KiB.
    pub hwm_kib: u64,
    /// `VmRSS` once converged, KiB.
    pub rss_kib: u64,
    /// `RssAnon` once converged, KiB.
    pub anon_kib: u64,
    /// Threads once converged.
    pub threads: u64,
    /// CPU time of the phase.
    pub cpu_seconds: f64,
    /// Writes of the phase (as in `requests`).
    pub writes: u64,
    /// Requests of the phase.
    pub requests: Requests,
    /// CPU seconds of each process of the local cluster during the phase (shared with
    /// whatever else ran on it). Absent from older records (and when empty).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cluster_cpu_seconds: BTreeMap<String, f64>,
    /// Reconciles the operator ran until then (`controller_runtime_reconcile_total`, which
    /// the Rust operators and controller-runtime both export); 0 in older records.
    pub reconciles: u64,
}

/// The pods seen by the bench's watch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct PodCounts {
    /// N x pods per object.
    pub desired: usize,
    /// Pods ever seen before the change.
    pub ever_seen_before_change: usize,
    /// Those beyond `desired`.
    pub extra: usize,
    /// Pods created by the change.
    pub created_by_change: usize,
}

/// The quiet window after convergence.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Steady {
    /// Its length.
    pub window_seconds: u64,
    /// Writes during it (0 expected).
    pub writes: u64,
    /// Requests during it.
    pub requests: Requests,
    /// Reconciles during it.
    pub reconciles: u64,
    /// Changes the object watch saw.
    pub object_changes_seen: u64,
    /// Changes the pod watch saw.
    pub pod_changes_seen: u64,
    /// `VmRSS` at its end, KiB.
    pub rss_kib: u64,
    /// `RssAnon` at its end, KiB.
    pub anon_kib: u64,
    /// CPU time during it.
    pub cpu_seconds: f64,
}

/// Stop and start with everything in place.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Restart {
    /// From the stop to `/readyz` of the new process.
    pub ready_seconds: f64,
    /// From the stop to every object reconciled once.
    pub all_reconciled_seconds: f64,
    /// Writes meanwhile (0 expected).
    pub writes: u64,
    /// Requests meanwhile.
    pub requests: Requests,
    /// `VmHWM` of the new process, KiB.
    pub hwm_kib: u64,
    /// `VmRSS` of the new process, KiB.
    pub rss_kib: u64,
    /// `VmRSS` of the first process after the quiet window, KiB.
    pub steady_rss_kib: u64,
    /// CPU time of the new process.
    pub cpu_seconds: f64,
}

/// One object at rest changed at a time, round after round: how soon the operator acts.
/// Every time is the bench's: from just before it sends the change to when its own
/// watch sees the operator's write.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Reaction {
    /// The change (`replicas 3 -> 4 (scale subresource)`...).
    pub what: String,
    /// Rounds (one object each, at rest since it converged).
    pub rounds: u32,
    /// To the operator's first write to the object's children (a pod created or marked
    /// for deletion, a Deployment created or its spec changed), per round.
    pub child_write_seconds: Vec<f64>,
    /// Their median.
    pub child_write_p50_seconds: f64,
    /// Their 99th percentile.
    pub child_write_p99_seconds: f64,
    /// To the status that shows the change done (Ready at the new spec, as the
    /// implementation's status says it; for the Go Lolcow and PulsarConsumer, as their
    /// children say it: see `readiness`), per round.
    pub status_seconds: Vec<f64>,
    /// Their median.
    pub status_p50_seconds: f64,
    /// Their 99th percentile.
    pub status_p99_seconds: f64,
    /// CPU time of the phase.
    pub cpu_seconds: f64,
    /// Requests of the phase (per object: per round).
    pub requests: Requests,
}

/// Every spec changed at once.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Change {
    /// The change (`replicas 3 -> 2`...).
    pub what: String,
    /// Until every object was Ready again with the wanted pods.
    pub all_ready_seconds: f64,
    /// Patch request to Ready, per object: the median.
    pub latency_p50_seconds: f64,
    /// The 99th percentile.
    pub latency_p99_seconds: f64,
    /// CPU time of the phase.
    pub cpu_seconds: f64,
    /// Requests of the phase.
    pub requests: Requests,
}

impl Change {
    /// [`Change::what`] of a run with `--skip-change`.
    pub(crate) const SKIPPED: &'static str = "skipped (--skip-change)";

    /// Its time to all Ready again, or `-` when the run skipped it.
    pub(crate) fn all_ready_cell(&self) -> String {
        if self.what == Self::SKIPPED {
            "-".to_owned()
        } else {
            serde_json::Value::from(self.all_ready_seconds).to_string()
        }
    }
}

/// Every object deleted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Delete {
    /// Until the object watch saw every object gone.
    pub objects_gone_seconds: f64,
    /// Until no pod, Deployment, ReplicaSet or Service was left.
    pub children_gone_seconds: f64,
    /// Requests of the phase.
    pub requests: Requests,
}

/// The end of the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct End {
    /// The larger peak of the two processes (before and after the restart), KiB.
    pub hwm_kib: u64,
    /// `VmRSS` at the end, KiB.
    pub rss_kib: u64,
    /// Threads at the end.
    pub threads: u64,
    /// CPU time of both processes.
    pub cpu_seconds: f64,
    /// Every request of both processes.
    pub requests: Requests,
}

impl RunRecord {
    /// The file's text: pretty JSON with its keys sorted, as recorded so far.
    pub(crate) fn to_json(&self) -> serde_json::Result<String> {
        // Through a `Value`, whose maps keep their keys sorted.
        Ok(serde_json::to_string_pretty(&serde_json::to_value(self)?)? + "\n")
    }

    /// Namespaces the objects were spread over (one for a file recorded before the option).
    pub(crate) fn namespace_count(&self) -> u32 {
        self.namespaces.max(1)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use anyhow::Result;

    /// A run as `bench_and_record` writes it (every field set).
    pub(crate) const SAMPLE: &str = include_str!("testdata/podset-10-strangers-5000.json");

    #[test]
    fn a_recorded_run_round_trips() -> Result<()> {
        let run: RunRecord = serde_json::from_str(SAMPLE)?;
        assert_eq!(run.operator, "podset");
        assert_eq!(run.create.requests.by_verb.get("create pods"), Some(&30));
        assert_eq!(run.restart.as_ref().map(|r| r.writes), Some(0));
        let text = run.to_json()?;
        let again: RunRecord = serde_json::from_str(&text)?;
        assert_eq!(again, run);
        // The same keys and values as the file read.
        let written: serde_json::Value = serde_json::from_str(&text)?;
        let read: serde_json::Value = serde_json::from_str(SAMPLE)?;
        assert_eq!(written, read);
        Ok(())
    }

    #[test]
    fn older_files_lack_fields() -> Result<()> {
        let run: RunRecord = serde_json::from_str(
            r#"{"benchmark": "operator", "operator": "memcached", "objects": 100,
                "create": {"all_ready_seconds": 3.5}}"#,
        )?;
        assert_eq!(run.objects, 100);
        assert_eq!(run.stranger_pods, 0);
        assert_eq!(run.namespace_count(), 1);
        assert_eq!(run.restart, None);
        assert_eq!(run.create.all_ready_seconds, 3.5);
        assert!(run.create.requests.by_verb.is_empty());
        Ok(())
    }

    #[test]
    fn requests_per_object() {
        let line = r#"{"message":"requesting","span":{"http.method":"POST","http.url":"/api/v1/namespaces/x/pods?"}}"#;
        let log = format!("{line}\n{line}\nnot a request\n");
        let r = Requests::in_log(&log, 4);
        assert_eq!((r.total, r.writes), (2, 2));
        assert_eq!((r.per_object, r.writes_per_object), (0.5, 0.5));
        assert_eq!(r.by_verb.get("create pods"), Some(&2));
    }
}
