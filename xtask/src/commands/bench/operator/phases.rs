//! The phases after the start, each returning its part of the record, and
//! the record assembled from them.

use super::options::{FIRST_NODE_PORT, LAST_NODE_PORT, Operator};
use super::procfs;
use super::record::{Change, Create, Delete, End, PodCounts, Requests, Restart, Steady};
use super::session::Session;
use super::timing::{quantile, seconds, wait_until};
use crate::commands::bench::common::round3;
use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use xtask::say;

/// NodePorts not used by any Service of the cluster, `count` of them, from the
/// implementation's own half of the range first (`go`: the Go original's run).
async fn free_node_ports(client: &Client, count: u32, go: bool) -> Result<Vec<i32>> {
    let used = xtask::support::node_ports::in_use(client).await?;
    pick_node_ports(&used, count, go)
}

/// `count` NodePorts not in `used`. Above the low end (30000-30499, which the tests'
/// samples use), the range is split in two halves of 1,134 ports: the Rust run takes from
/// the lower, the Go original's run from the upper, so that at up to 1,134 Lolcows the Go
/// run, which starts as the Rust run's namespace is deleted, never asks for a port that
/// namespace's Services may still hold (those listed as held are skipped anyway). Then
/// the other half, then the low end.
pub(super) fn pick_node_ports(used: &BTreeSet<i32>, count: u32, go: bool) -> Result<Vec<i32>> {
    const LOW_END: i32 = FIRST_NODE_PORT + 500;
    let middle = LOW_END + (LAST_NODE_PORT + 1 - LOW_END) / 2;
    let (lower, upper) = (LOW_END..middle, middle..=LAST_NODE_PORT);
    let halves: Vec<i32> = if go {
        upper.chain(lower).collect()
    } else {
        lower.chain(upper).collect()
    };
    let free: Vec<i32> = halves
        .into_iter()
        .chain(FIRST_NODE_PORT..LOW_END)
        .filter(|p| !used.contains(p))
        .take(count as usize)
        .collect();
    ensure!(
        free.len() == count as usize,
        "--objects {count}: only {} NodePorts of {FIRST_NODE_PORT}-{LAST_NODE_PORT} are free \
         ({} held by Services of the cluster), and every Lolcow needs one: lower --objects",
        free.len(),
        used.len()
    );
    Ok(free)
}

impl Session<'_> {
    /// Pods wanted with `replicas` per object.
    fn want_pods(&self, replicas: i32) -> usize {
        (self.n as usize) * self.op.pods_per_object(replicas) as usize
    }

    /// Creates N objects at once and waits until every one is Ready with its pods.
    pub(super) async fn create(&mut self) -> Result<Create> {
        let (op, n, replicas) = (self.op, self.n, self.target.args.replicas);
        let want_pods = self.want_pods(replicas);
        let ports = if op == Operator::Lolcow {
            let go = self.target.launcher.implementation() == "go";
            free_node_ports(self.target.client, n, go).await?
        } else {
            vec![0; n as usize]
        };
        let manifests: Vec<(String, DynamicObject)> = self
            .names
            .iter()
            .zip(&ports)
            .map(|(name, port)| {
                Ok((
                    name.clone(),
                    serde_json::from_value(op.object(name, replicas, *port))?,
                ))
            })
            .collect::<Result<_>>()?;
        let t_create = Instant::now();
        let what = "every object Ready with its pods";
        let created = self
            .converge(what, want_pods, manifests, |api, name, obj| async move {
                api.create(&PostParams::default(), &obj)
                    .await
                    .with_context(|| format!("creating {name}"))
            })
            .await?;
        // Writes that follow the last Ready status (its event) belong to the create phase,
        // not to the quiet window.
        self.settle_requests().await;
        let loaded = self.end_phase()?;
        let latency = self.latencies(&created)?;
        let ready_curve_seconds = {
            let o = self
                .objects
                .lock()
                .map_err(|_| anyhow!("state lock poisoned"))?;
            let mut curve: Vec<f64> = self
                .names
                .iter()
                .filter_map(|name| {
                    let g = created.generations.get(name)?;
                    o.ready_at
                        .get(&(name.clone(), *g))
                        .map(|t| seconds(t_create, *t))
                })
                .collect();
            curve.sort_by(f64::total_cmp);
            curve
        };
        let all_ready_seconds = seconds(t_create, created.converged);
        let reconciles = self.process.reconciles();
        say!(
            "    create: {n} objects Ready in {all_ready_seconds}s (their status {}s, their pods {}s; p50 {}s, p99 {}s), {reconciles} reconciles, {} status writes, peak RSS {} MiB",
            seconds(t_create, created.objects_ready),
            seconds(t_create, created.pods_ready),
            quantile(&latency, 0.5),
            quantile(&latency, 0.99),
            loaded.requests.status_writes(),
            procfs::mib(loaded.sample.hwm_kib)
        );
        Ok(Create {
            submit_seconds: seconds(t_create, created.answered),
            all_ready_seconds,
            objects_ready_seconds: seconds(t_create, created.objects_ready),
            pods_ready_seconds: seconds(t_create, created.pods_ready),
            latency_p50_seconds: quantile(&latency, 0.5),
            latency_p99_seconds: quantile(&latency, 0.99),
            latency_max_seconds: quantile(&latency, 1.0),
            ready_curve_seconds,
            hwm_kib: loaded.sample.hwm_kib,
            rss_kib: loaded.sample.rss_kib,
            anon_kib: loaded.sample.anon_kib,
            threads: loaded.sample.threads,
            cpu_seconds: loaded.cpu_seconds,
            writes: loaded.requests.writes,
            requests: loaded.requests,
            cluster_cpu_seconds: loaded.cluster_cpu,
            reconciles,
        })
    }

    /// The quiet window: what the operator and the watches did meanwhile, and
    /// the pods seen until its end.
    pub(super) async fn quiet_window(&mut self) -> Result<(Steady, PodCounts)> {
        let settle = self.target.args.settle();
        let changes = |run: &Self| {
            (
                run.objects.lock().map_or(0, |o| o.changes),
                run.pods.lock().map_or(0, |p| p.changes),
                run.process.reconciles(),
            )
        };
        let before = changes(self);
        tokio::time::sleep(settle).await;
        let after = changes(self);
        let steady = self.end_phase()?;
        let desired = self.want_pods(self.target.args.replicas);
        let ever = self.pods.lock().map_or(0, |p| p.ever.len());
        let reconciles = after.2.saturating_sub(before.2);
        say!(
            "    quiet {}s: {} writes, {reconciles} reconciles; RSS {} MiB",
            settle.as_secs(),
            steady.requests.writes,
            procfs::mib(steady.sample.rss_kib)
        );
        let pods = PodCounts {
            desired,
            ever_seen_before_change: ever,
            extra: ever.saturating_sub(desired),
            created_by_change: 0,
        };
        Ok((
            Steady {
                window_seconds: settle.as_secs(),
                writes: steady.requests.writes,
                requests: steady.requests,
                reconciles,
                object_changes_seen: after.0.saturating_sub(before.0),
                pod_changes_seen: after.1.saturating_sub(before.1),
                rss_kib: steady.sample.rss_kib,
                anon_kib: steady.sample.anon_kib,
                cpu_seconds: steady.cpu_seconds,
            },
            pods,
        ))
    }

    /// Restart with everything in place: the operator stops (SIGTERM) and
    /// starts again; until every object was reconciled once
    /// (`controller_runtime_reconcile_total` reaches N) it must write nothing.
    pub(super) async fn restart(&mut self, steady: &Steady) -> Result<Restart> {
        let n = self.n;
        let t_restart = self.restart_process()?;
        self.process.wait_ready().await?;
        let ready_seconds = seconds(t_restart, Instant::now());
        let t_reconciled = wait_until(
            "every object reconciled after the restart",
            self.timeout,
            || self.process.reconciles() >= u64::from(n),
            || format!("{} of {n} reconciles", self.process.reconciles()),
        )
        .await?;
        let restarted = self.end_phase()?;
        let all_reconciled_seconds = seconds(t_restart, t_reconciled);
        say!(
            "    restart: every object reconciled {all_reconciled_seconds}s after the stop, {} writes, peak RSS {} MiB",
            restarted.requests.writes,
            procfs::mib(restarted.sample.hwm_kib)
        );
        Ok(Restart {
            ready_seconds,
            all_reconciled_seconds,
            writes: restarted.requests.writes,
            requests: restarted.requests,
            hwm_kib: restarted.sample.hwm_kib,
            rss_kib: restarted.sample.rss_kib,
            steady_rss_kib: steady.rss_kib,
            cpu_seconds: restarted.cpu_seconds,
        })
    }

    /// Changes every spec and waits until every object is Ready again; also
    /// the pods the change created (`pods_before`: pods seen until then).
    pub(super) async fn change(&mut self, pods_before: usize) -> Result<(Change, usize)> {
        let replicas = self.target.args.replicas;
        let (patch, what) = self.op.change(replicas);
        let want_pods = self.want_pods(self.op.changed_replicas(replicas));
        let t_change = Instant::now();
        let items = self.names.iter().map(|n| (n.clone(), ())).collect();
        let what_ready = "every object Ready after the change";
        let patched = self
            .converge(what_ready, want_pods, items, |api, name, ()| {
                let patch = patch.clone();
                async move {
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .with_context(|| format!("changing {name}"))
                }
            })
            .await?;
        let changed = self.end_phase()?;
        let latency = self.latencies(&patched)?;
        let created_by_change = self
            .pods
            .lock()
            .map_or(0, |p| p.ever.len())
            .saturating_sub(pods_before);
        let all_ready_seconds = seconds(t_change, patched.converged);
        say!("    change ({what}): converged in {all_ready_seconds}s");
        let change = Change {
            what,
            all_ready_seconds,
            latency_p50_seconds: quantile(&latency, 0.5),
            latency_p99_seconds: quantile(&latency, 0.99),
            cpu_seconds: changed.cpu_seconds,
            requests: changed.requests,
        };
        Ok((change, created_by_change))
    }

    /// Deletes every object and waits until no child is left; stops the
    /// operator and reads its last figures.
    pub(super) async fn delete(&mut self) -> Result<(Delete, End)> {
        let t_delete = Instant::now();
        self.delete_all().await?;
        let t_objects_gone = wait_until(
            "every object deleted",
            self.timeout,
            || self.objects.lock().is_ok_and(|o| o.generation.is_empty()),
            || {
                let left = self.objects.lock().map_or(0, |o| o.generation.len());
                format!("{left} left")
            },
        )
        .await?;
        let t_children_gone = self.children_gone().await?;
        let children_gone_seconds = seconds(t_delete, t_children_gone);
        say!("    delete: children gone in {children_gone_seconds}s");
        let end = self.end_phase()?;
        // Every request of both processes (before and after the restart).
        let last = Requests::from_counts(self.requests_until_mark(), self.n);
        self.process.stop();
        let (first, first_end) = self.first_process.take().unwrap_or_default();
        let delete = Delete {
            objects_gone_seconds: seconds(t_delete, t_objects_gone),
            children_gone_seconds,
            requests: end.requests,
        };
        let end = End {
            // The larger peak of the two processes.
            hwm_kib: end.sample.hwm_kib.max(first_end.hwm_kib),
            rss_kib: end.sample.rss_kib,
            threads: end.sample.threads,
            cpu_seconds: round3(first_end.cpu_seconds + end.sample.cpu_seconds),
            requests: Requests::from_counts(first, self.n).plus(&last, self.n),
        };
        Ok((delete, end))
    }

    /// One collection delete of every object. Thousands of them can outlast a
    /// request on a busy API server (the client then sees the connection
    /// fail, as 5,000 Memcacheds with finalizers did three times in a row);
    /// what one attempt did not delete, the next one does, until the phase's
    /// deadline.
    async fn delete_all(&self) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        for api in self.cr_apis() {
            for attempt in 1.. {
                match api
                    .delete_collection(&DeleteParams::default(), &ListParams::default())
                    .await
                {
                    Ok(_) => break,
                    Err(e) if Instant::now() < deadline => {
                        say!("    delete: attempt {attempt} failed ({e}); again");
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                    Err(e) => {
                        return Err(anyhow::Error::new(e)
                            .context(format!("deleting every object ({attempt} attempts)")));
                    }
                }
            }
        }
        Ok(())
    }

    /// Waits until no pod, Deployment, ReplicaSet or Service is left.
    async fn children_gone(&self) -> Result<Instant> {
        let client = self.target.client;
        let lp = ListParams::default();
        let deadline = Instant::now() + self.timeout;
        loop {
            let no_pods = self.pods.lock().is_ok_and(|p| p.present.is_empty());
            let mut left = usize::from(!no_pods);
            if no_pods {
                for namespace in self.target.namespaces {
                    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
                    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
                    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
                    left += deployments.list_metadata(&lp).await?.items.len()
                        + replicasets.list_metadata(&lp).await?.items.len()
                        + services.list_metadata(&lp).await?.items.len();
                }
            }
            if left == 0 {
                return Ok(Instant::now());
            }
            ensure!(
                Instant::now() < deadline,
                "children still present {}s after deleting the objects",
                self.timeout.as_secs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rust_and_go_runs_take_node_ports_from_halves_of_their_own() -> Result<()> {
        let none = BTreeSet::new();
        let rust = pick_node_ports(&none, 1000, false)?;
        let go = pick_node_ports(&none, 1000, true)?;
        assert_eq!((rust[0], go[0]), (30500, 31634));
        // 1,000 Lolcows each: no port in both, none at the low end the tests' samples use.
        let rust_ports: BTreeSet<i32> = rust.iter().copied().collect();
        assert!(go.iter().all(|p| !rust_ports.contains(p)));
        assert!(rust.iter().chain(&go).all(|p| (30500..=32767).contains(p)));
        // Held ports are skipped; past its half, a run takes the other, then the low end.
        let held: BTreeSet<i32> = [30500, 30501].into_iter().collect();
        assert_eq!(pick_node_ports(&held, 2, false)?, vec![30502, 30503]);
        let many = pick_node_ports(&none, 2768, true)?;
        assert_eq!(many.len(), 2768);
        assert_eq!((many[1133], many[1134], many[2267]), (32767, 30500, 31633));
        assert_eq!(many[2268], 30000);
        Ok(())
    }

    #[test]
    fn too_many_lolcows_name_the_option() {
        let held: BTreeSet<i32> = (30000..30010).collect();
        let e = pick_node_ports(&held, 2768, false).map_err(|e| e.to_string());
        assert!(
            e.as_ref()
                .is_err_and(|e| e.contains("--objects 2768") && e.contains("only 2758")),
            "{e:?}"
        );
    }
}
