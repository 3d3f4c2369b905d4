//! A restart with everything in place, the moment an operator is most dangerous: a new
//! process that fills its caches and reconciles every object must find the world as the
//! old one left it, and write nothing (no pod, no child, no status), whatever it keeps in
//! its caches and indexes.

use anyhow::{Result, ensure};
use e2e::kinds::{memcached, podset, wait_memcached_ready, wait_podset_ready};
use e2e::operator::OperatorProcess;
use e2e::{TestNamespace, create_from_json, list_all, poll};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use memcached_operator::api::Memcached;
use podset_operator::api::PodSet;
use std::collections::BTreeSet;
use std::time::Duration;

/// Objects per kind: enough that a child lookup that misses some shows.
const OBJECTS: usize = 4;

/// The writes in an operator's request log, as `"<verb> <resource>"` (events and the
/// leader Lease aside).
fn writes(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(xtask::support::logged_requests::parse_line)
        .filter(|r| xtask::support::logged_requests::is_write(r.verb))
        .map(|r| format!("{} {}", r.verb, r.rbac_resource()))
        .filter(|w| !w.contains("events") && !w.contains("leases"))
        .collect()
}

async fn pod_names(ns: &TestNamespace) -> Result<BTreeSet<String>> {
    let pods = list_all::<Pod>(ns).await?;
    Ok(pods.iter().map(ResourceExt::name_any).collect())
}

/// Starts the operator again on `ns` and waits until it reconciled every object and its
/// debounce has passed; returns the new process's writes.
async fn restart_and_reconcile(operator: &str, ns: &TestNamespace) -> Result<Vec<String>> {
    let op = OperatorProcess::start(operator, &[&ns.name]).await?;
    poll(
        "every object reconciled by the new process",
        Duration::from_secs(60),
        || async { Ok((op.reconciles(&[])? >= OBJECTS as f64).then_some(())) },
    )
    .await?;
    // A reconcile that wrote would have done so by now; and what it created, the watch
    // shows within the debounce (500 ms) that follows.
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(writes(&op.log()))
}

#[tokio::test]
async fn a_restarted_podset_operator_writes_nothing() -> Result<()> {
    let ns = TestNamespace::new("restart-podset").await?;
    let mut op = OperatorProcess::start("podset-operator", &[&ns.name]).await?;
    for i in 0..OBJECTS {
        create_from_json::<PodSet>(&ns, podset(&format!("ps{i}"), 3)).await?;
    }
    for i in 0..OBJECTS {
        wait_podset_ready(&ns, &format!("ps{i}")).await?;
    }
    let before = pod_names(&ns).await?;
    ensure!(before.len() == 3 * OBJECTS, "{} pods", before.len());
    ensure!(op.terminate()?, "the first process exits 0 on SIGTERM");
    let writes = restart_and_reconcile("podset-operator", &ns).await?;
    ensure!(
        writes.is_empty(),
        "the restarted operator wrote: {writes:?}"
    );
    let after = pod_names(&ns).await?;
    ensure!(before == after, "pods before {before:?}, after {after:?}");
    Ok(())
}

#[tokio::test]
async fn a_restarted_memcached_operator_writes_nothing() -> Result<()> {
    let ns = TestNamespace::new("restart-memcached").await?;
    let mut op = OperatorProcess::start("memcached-operator", &[&ns.name]).await?;
    for i in 0..OBJECTS {
        create_from_json::<Memcached>(&ns, memcached(&format!("mc{i}"), 2)).await?;
    }
    for i in 0..OBJECTS {
        wait_memcached_ready(&ns, &format!("mc{i}")).await?;
    }
    ensure!(op.terminate()?, "the first process exits 0 on SIGTERM");
    let writes = restart_and_reconcile("memcached-operator", &ns).await?;
    ensure!(
        writes.is_empty(),
        "the restarted operator wrote: {writes:?}"
    );
    for i in 0..OBJECTS {
        let mc = wait_memcached_ready(&ns, &format!("mc{i}")).await?;
        let nodes = mc.status.map(|s| s.nodes.len()).unwrap_or_default();
        ensure!(nodes == 2, "mc{i} reports {nodes} pods");
    }
    Ok(())
}
