//! Leader election under failure: two replicas of the PodSet operator, only one
//! reconciling at any moment, and a fast, safe handover.

use anyhow::{Context, Result, bail, ensure};
use e2e::kinds::{podset, wait_podset_replicas_ready};
use e2e::operator::{
    OperatorOptions, OperatorProcess, install, metric_sum, server_port, service_account_kubeconfig,
};
use e2e::proxy::TcpProxy;
use e2e::rbac::apply_leader_for_life_rbac;
use e2e::{TestNamespace, create_from_json, kubectl_scale, poll, unique_suffix};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use podset_operator::api::PodSet;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const OPERATOR: &str = "podset-operator";
/// The leader-election Role of `deploy/` covers the operator's own namespace.
const LEASE_NS: &str = "podset-operator-system";

async fn start_replica(
    ns: &TestNamespace,
    pod_name: &str,
    args: &[String],
) -> Result<OperatorProcess> {
    OperatorProcess::start_with(
        OPERATOR,
        &[&ns.name],
        OperatorOptions {
            args: args.to_vec(),
            env: vec![
                ("POD_NAME".into(), pod_name.into()),
                ("POD_NAMESPACE".into(), LEASE_NS.into()),
            ],
            ..OperatorOptions::default()
        },
    )
    .await
}

fn reconciles(op: &OperatorProcess) -> f64 {
    op.metrics()
        .map(|m| metric_sum(&m, "controller_runtime_reconcile_total", &[]))
        .unwrap_or(-1.0)
}

fn holder(lease: &Lease) -> String {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_default()
}

/// Waits until one of the replicas holds the lease; returns (leader, standby).
async fn elected<'a>(
    leases: &Api<Lease>,
    name: &str,
    a: &'a mut OperatorProcess,
    b: &'a mut OperatorProcess,
) -> Result<(&'a mut OperatorProcess, &'a mut OperatorProcess)> {
    let lease = poll("a lease holder", Duration::from_secs(30), || async {
        Ok(leases
            .get_opt(name)
            .await?
            .filter(|l| !holder(l).is_empty()))
    })
    .await?;
    let h = holder(&lease);
    if h.starts_with("replica-a_") {
        Ok((a, b))
    } else if h.starts_with("replica-b_") {
        Ok((b, a))
    } else {
        bail!("unexpected lease holder {h}")
    }
}

/// Two replicas, `replica-a` and `replica-b`, electing a leader through the Lease
/// `e2e-<label>-<suffix>`: the Lease's name, the Leases API, and the two replicas.
async fn start_two_replicas(
    ns: &TestNamespace,
    label: &str,
) -> Result<(String, Api<Lease>, OperatorProcess, OperatorProcess)> {
    let lease_name = format!("e2e-{label}-{}", unique_suffix());
    let args = vec![
        "--leader-elect".to_owned(),
        format!("--leader-election-namespace={LEASE_NS}"),
        format!("--leader-election-id={lease_name}"),
    ];
    let a = start_replica(ns, "replica-a", &args).await?;
    let b = start_replica(ns, "replica-b", &args).await?;
    let leases: Api<Lease> = Api::namespaced(ns.client.clone(), LEASE_NS);
    Ok((lease_name, leases, a, b))
}

#[tokio::test]
async fn a_killed_leader_is_replaced_and_only_one_replica_reconciles() -> Result<()> {
    let ns = TestNamespace::new("leader-kill").await?;
    let (lease_name, leases, mut a, mut b) = start_two_replicas(&ns, "kill").await?;
    let (leader, standby) = elected(&leases, &lease_name, &mut a, &mut b).await?;
    let old = holder(&leases.get(&lease_name).await?);

    create_from_json::<PodSet>(&ns, podset("ha", 2)).await?;
    wait_podset_replicas_ready(&ns, "ha", 2, Duration::from_secs(60)).await?;
    assert!(reconciles(leader) > 0.0);
    assert_eq!(reconciles(standby), 0.0, "the standby must not reconcile");

    // kill -9: no release. Once the process is gone the lease shows its last renewal.
    leader.kill();
    let killed = Instant::now();
    let last = leases.get(&lease_name).await?;
    ensure!(holder(&last) == old, "the lease changed hands at the kill");
    let last_renew = renew_time(&last)?;
    kubectl_scale(&ns, "podset", "ha", 4)?;
    let taken = poll(
        "the standby holding the lease",
        LEASE + 2 * RETRY_MAX + Duration::from_secs(15),
        || async {
            let l = leases.get(&lease_name).await?;
            Ok((!holder(&l).is_empty() && holder(&l) != old).then_some(l))
        },
    )
    .await?;
    let wall = killed.elapsed();
    let acquired = taken
        .spec
        .as_ref()
        .and_then(|s| s.acquire_time.as_ref())
        .map(|t| t.0)
        .context("the new lease has no acquireTime")?;
    let after = acquired.duration_since(last_renew);
    let after = Duration::try_from(after).unwrap_or_default();
    eprintln!(
        "kill -9: lease taken {after:?} after the dead leader's last renewal ({wall:?} after the kill)"
    );
    // Not before the lease expired: the standby counts the duration from when it saw the
    // record last change, which is after that renewal.
    ensure!(
        after >= LEASE,
        "the standby took the lease {after:?} after the last renewal, before it expired ({LEASE:?})"
    );
    // Within: the standby sees the last renewal at its next retry (at most RETRY_MAX later),
    // and tries again at most RETRY_MAX after the lease expired; 1 s for the API calls.
    let bound = LEASE + 2 * RETRY_MAX + Duration::from_secs(1);
    ensure!(
        after <= bound,
        "the standby took the lease {after:?} after the last renewal; the bound is {bound:?}"
    );
    wait_podset_replicas_ready(&ns, "ha", 4, Duration::from_secs(30)).await?;
    assert!(reconciles(standby) > 0.0, "the new leader reconciled");
    leases.delete(&lease_name, &DeleteParams::default()).await?;
    Ok(())
}

/// The default `--leader-elect-lease-duration`.
const LEASE: Duration = Duration::from_secs(15);
/// The longest wait between two tries: `--leader-elect-retry-period` (2 s) with
/// client-go's jitter (up to 1.2 times more).
const RETRY_MAX: Duration = Duration::from_millis(4400);

fn renew_time(lease: &Lease) -> Result<Timestamp> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| t.0)
        .context("the lease has no renewTime")
}

#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_stops_before_the_standby_starts() -> Result<()> {
    let ns = TestNamespace::new("leader-cut").await?;
    let lease_name = format!("e2e-cut-{}", unique_suffix());
    let args = vec![
        "--leader-elect".to_owned(),
        format!("--leader-election-namespace={LEASE_NS}"),
        format!("--leader-election-id={lease_name}"),
    ];
    // Replica a reaches the API server through a proxy the test can cut; it starts first
    // and leads.
    let kubeconfig = service_account_kubeconfig(OPERATOR)?;
    let api_port = server_port(&kubeconfig)?;
    let mut proxy = TcpProxy::start(api_port).await?;
    let proxied = with_server_port(&kubeconfig, proxy.port)?;
    let mut a = OperatorProcess::start_with(
        OPERATOR,
        &[&ns.name],
        OperatorOptions {
            args: args.clone(),
            kubeconfig: Some(proxied),
            env: vec![
                ("POD_NAME".into(), "replica-a".into()),
                ("POD_NAMESPACE".into(), LEASE_NS.into()),
            ],
            ..OperatorOptions::default()
        },
    )
    .await?;
    let leases: Api<Lease> = Api::namespaced(ns.client.clone(), LEASE_NS);
    poll(
        "replica a holding the lease",
        Duration::from_secs(30),
        || async {
            Ok(leases
                .get_opt(&lease_name)
                .await?
                .filter(|l| holder(l).starts_with("replica-a_")))
        },
    )
    .await?;
    let b = start_replica(&ns, "replica-b", &args).await?;
    create_from_json::<PodSet>(&ns, podset("cut", 1)).await?;
    wait_podset_replicas_ready(&ns, "cut", 1, Duration::from_secs(60)).await?;
    assert_eq!(reconciles(&b), 0.0, "the standby must not reconcile");

    // Cut a off. It cannot renew, so it stops leading after the renew deadline (10 s);
    // b may take the lease only after it expired (15 s): a has stopped by then.
    proxy.stop();
    let cut = Instant::now();
    poll("replica a to give up", Duration::from_secs(30), || {
        let stopped = !a.is_running();
        async move { Ok(stopped.then_some(())) }
    })
    .await
    .with_context(|| format!("replica a log:\n{}", a.log()))?;
    let a_stopped = cut.elapsed();
    ensure!(
        a.log().contains("leader election lost"),
        "replica a stopped without saying it lost the lease:\n{}",
        a.log()
    );
    // b has not started reconciling yet: it holds no lease.
    let lease = leases.get(&lease_name).await?;
    ensure!(
        !holder(&lease).starts_with("replica-b_"),
        "replica b held the lease before replica a stopped ({a_stopped:?} after the cut)"
    );
    ensure!(
        reconciles(&b) == 0.0,
        "replica b reconciled while replica a led"
    );
    poll(
        "replica b holding the lease",
        Duration::from_secs(30),
        || async {
            Ok(leases
                .get_opt(&lease_name)
                .await?
                .filter(|l| holder(l).starts_with("replica-b_")))
        },
    )
    .await?;
    let b_leads = cut.elapsed();
    eprintln!(
        "cut off: replica a stopped {a_stopped:?} after the cut, replica b led after {b_leads:?}"
    );
    ensure!(a_stopped < b_leads);
    kubectl_scale(&ns, "podset", "cut", 2)?;
    wait_podset_replicas_ready(&ns, "cut", 2, Duration::from_secs(30)).await?;
    leases.delete(&lease_name, &DeleteParams::default()).await?;
    Ok(())
}

/// A copy of `kubeconfig` whose server is `https://127.0.0.1:<port>`.
fn with_server_port(kubeconfig: &Path, port: u16) -> Result<PathBuf> {
    let mut config = Kubeconfig::read_from(kubeconfig)?;
    for named in &mut config.clusters {
        if let Some(cluster) = named.cluster.as_mut() {
            cluster.server = Some(format!("https://127.0.0.1:{port}"));
        }
    }
    let path = kubeconfig.with_extension(format!("proxied-{port}"));
    xtask::support::kubeconfig::write(&config, &path)?;
    Ok(path)
}

#[tokio::test]
async fn a_terminated_leader_hands_over_at_once() -> Result<()> {
    let ns = TestNamespace::new("leader-term").await?;
    let (lease_name, leases, mut a, mut b) = start_two_replicas(&ns, "term").await?;
    let (leader, standby) = elected(&leases, &lease_name, &mut a, &mut b).await?;
    let old = holder(&leases.get(&lease_name).await?);

    create_from_json::<PodSet>(&ns, podset("handover", 1)).await?;
    wait_podset_replicas_ready(&ns, "handover", 1, Duration::from_secs(60)).await?;
    assert_eq!(reconciles(standby), 0.0, "the standby must not reconcile");

    // SIGTERM: the leader releases the lease, so the standby (retrying every
    // 2 s) takes it well before the 15 s expiry a crash would need.
    assert!(leader.terminate()?, "SIGTERM must exit 0");
    let released = Instant::now();
    poll(
        "the standby holding the lease",
        Duration::from_secs(10),
        || async {
            let h = holder(&leases.get(&lease_name).await?);
            Ok((!h.is_empty() && h != old).then_some(()))
        },
    )
    .await?;
    let takeover = released.elapsed();
    assert!(
        takeover < Duration::from_secs(5),
        "takeover took {takeover:?}: the lease was not released"
    );
    kubectl_scale(&ns, "podset", "handover", 3)?;
    wait_podset_replicas_ready(&ns, "handover", 3, Duration::from_secs(30)).await?;
    leases.delete(&lease_name, &DeleteParams::default()).await?;
    Ok(())
}

/// The arguments of a leader-for-life replica using the lock `lock_name`.
fn for_life_args(lock_name: &str) -> Vec<String> {
    vec![
        "--leader-elect".to_owned(),
        "--leader-election-mode=for-life".to_owned(),
        format!("--leader-election-id={lock_name}"),
    ]
}

/// Installs the operator and what leader-for-life needs beyond it, as a user choosing that
/// mode applies `deploy/<operator>/leader-for-life`.
fn install_for_life() -> Result<()> {
    install(OPERATOR)?;
    apply_leader_for_life_rbac(OPERATOR)
}

/// Creates the Pod object a replica's process claims to run in (`POD_NAME`), on `node`
/// (`None`: scheduled on a simulated node, where kwok reports it Running; the process runs
/// here either way).
async fn create_identity_pod(pods: &Api<Pod>, name: &str, node: Option<&str>) -> Result<()> {
    let mut spec = json!({
        "automountServiceAccountToken": false,
        "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "operator", "image": "podset-operator",
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]
    });
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))?;
    pods.create(&PostParams::default(), &pod).await?;
    Ok(())
}

/// Waits until the simulated node runs `name` (as a real leader's Pod would be).
async fn wait_running(pods: &Api<Pod>, name: &str) -> Result<()> {
    poll(
        &format!("pod {name} running"),
        Duration::from_secs(60),
        || async {
            let pod = pods.get(name).await?;
            let phase = pod.status.and_then(|s| s.phase);
            Ok((phase.as_deref() == Some("Running")).then_some(()))
        },
    )
    .await
}

/// The name of the Pod that owns the for-life lock.
fn lock_owner(lock: &ConfigMap) -> Option<String> {
    lock.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.kind == "Pod")
        .map(|o| o.name.clone())
}

/// Waits until the for-life lock `name` is owned by the Pod `owner`.
async fn wait_lock_owner(
    locks: &Api<ConfigMap>,
    name: &str,
    owner: &str,
    timeout: Duration,
) -> Result<ConfigMap> {
    poll(&format!("the lock owned by {owner}"), timeout, || async {
        Ok(locks
            .get_opt(name)
            .await?
            .filter(|l| lock_owner(l).as_deref() == Some(owner)))
    })
    .await
}

/// Objects a test made outside its namespace, deleted (without waiting) when dropped.
struct Cleanup(Vec<Vec<String>>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for what in &self.0 {
            let mut args = vec!["delete", "--ignore-not-found", "--wait=false"];
            args.extend(what.iter().map(String::as_str));
            let _ = e2e::kubectl_runner().capture(args);
        }
    }
}

/// The longest a for-life candidate waits between two attempts (operator-sdk's 16 s).
const FOR_LIFE_MAX_WAIT: Duration = Duration::from_secs(16);

#[tokio::test]
async fn leader_for_life_is_held_until_the_leaders_pod_is_gone() -> Result<()> {
    install_for_life()?;
    let ns = TestNamespace::new("leader-life").await?;
    let suffix = unique_suffix();
    let lock_name = format!("e2e-life-{suffix}");
    // The replicas' own Pod objects (kwok runs them; the processes run here).
    let pods: Api<Pod> = Api::namespaced(ns.client.clone(), LEASE_NS);
    let (pod_a, pod_b) = (format!("replica-a-{suffix}"), format!("replica-b-{suffix}"));
    let _cleanup = Cleanup(vec![vec![
        "pods".into(),
        "-n".into(),
        LEASE_NS.into(),
        pod_a.clone(),
        pod_b.clone(),
    ]]);
    for name in [&pod_a, &pod_b] {
        create_identity_pod(&pods, name, None).await?;
    }
    let args = for_life_args(&lock_name);
    let mut a = start_replica(&ns, &pod_a, &args).await?;
    let locks: Api<ConfigMap> = Api::namespaced(ns.client.clone(), LEASE_NS);
    let lock = poll("the for-life lock", Duration::from_secs(30), || async {
        Ok(locks.get_opt(&lock_name).await?)
    })
    .await?;
    let owner = lock.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owner.len(), 1);
    assert_eq!(
        owner[0].name, pod_a,
        "the lock is owned by the leader's Pod"
    );
    let b = start_replica(&ns, &pod_b, &args).await?;

    create_from_json::<PodSet>(&ns, podset("life", 1)).await?;
    wait_podset_replicas_ready(&ns, "life", 1, Duration::from_secs(60)).await?;
    assert!(reconciles(&a) > 0.0);
    assert_eq!(reconciles(&b), 0.0);

    // The leader's process dies, but its Pod object is still there, Running on a Ready
    // node: no takeover (a leader cut off from the API server looks like this).
    a.kill();
    kubectl_scale(&ns, "podset", "life", 2)?;
    poll(
        "the standby waiting on the live pod",
        Duration::from_secs(30),
        || async { Ok(b.log().contains("standing by").then_some(())) },
    )
    .await?;
    // A window longer than a lease would last (15 s): the standby never takes over while
    // the dead leader's Pod object exists.
    let window = Instant::now();
    while window.elapsed() < LEASE + Duration::from_secs(5) {
        let lock_now = locks.get(&lock_name).await?;
        assert_eq!(lock_now.metadata.uid, lock.metadata.uid, "the lock stays");
        let owner = lock_now.metadata.owner_references.unwrap_or_default();
        assert_eq!(
            owner.first().map(|o| o.name.as_str()),
            Some(pod_a.as_str()),
            "the lock changed owner while the leader's Pod existed"
        );
        assert_eq!(reconciles(&b), 0.0, "no split brain");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The Pod object goes: the standby takes the lock and converges the change.
    pods.delete(&pod_a, &DeleteParams::default()).await?;
    wait_podset_replicas_ready(&ns, "life", 2, Duration::from_secs(60)).await?;
    let lock = locks.get(&lock_name).await?;
    assert_eq!(lock_owner(&lock), Some(pod_b.clone()));
    Ok(())
}

/// The old leader's process still runs here after its Pod was judged gone (a kubelet would
/// have stopped it): it must see its lock taken at its next check and stop leading.
async fn wait_stops_leading(old: &mut OperatorProcess, since: Instant) -> Result<Duration> {
    poll("the old leader to stop", Duration::from_secs(30), || {
        let stopped = !old.is_running();
        async move { Ok(stopped.then_some(())) }
    })
    .await
    .with_context(|| format!("old leader's log:\n{}", old.log()))?;
    let stopped = since.elapsed();
    ensure!(
        old.log().contains("leader election lost"),
        "the old leader stopped without saying it lost the lock:\n{}",
        old.log()
    );
    Ok(stopped)
}

#[tokio::test]
async fn an_evicted_leader_for_life_is_replaced() -> Result<()> {
    install_for_life()?;
    let ns = TestNamespace::new("leader-evict").await?;
    let suffix = unique_suffix();
    let lock_name = format!("e2e-evict-{suffix}");
    let pods: Api<Pod> = Api::namespaced(ns.client.clone(), LEASE_NS);
    let locks: Api<ConfigMap> = Api::namespaced(ns.client.clone(), LEASE_NS);
    let (pod_a, pod_b) = (format!("replica-a-{suffix}"), format!("replica-b-{suffix}"));
    let _cleanup = Cleanup(vec![vec![
        "pods".into(),
        "-n".into(),
        LEASE_NS.into(),
        pod_a.clone(),
        pod_b.clone(),
    ]]);
    for name in [&pod_a, &pod_b] {
        create_identity_pod(&pods, name, None).await?;
    }
    wait_running(&pods, &pod_a).await?;
    let args = for_life_args(&lock_name);
    let mut a = start_replica(&ns, &pod_a, &args).await?;
    wait_lock_owner(&locks, &lock_name, &pod_a, Duration::from_secs(30)).await?;
    let b = start_replica(&ns, &pod_b, &args).await?;
    create_from_json::<PodSet>(&ns, podset("evict", 1)).await?;
    wait_podset_replicas_ready(&ns, "evict", 1, Duration::from_secs(60)).await?;
    assert_eq!(reconciles(&b), 0.0, "the standby must not reconcile");
    poll(
        "the standby waiting on the running leader",
        Duration::from_secs(30),
        || async { Ok(b.log().contains("standing by").then_some(())) },
    )
    .await?;

    // What the kubelet writes when it evicts a Pod under node pressure (through the status
    // subresource, as an admin; the simulated node leaves a Failed Pod alone).
    pods.patch_status(
        &pod_a,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Failed",
            "reason": "Evicted",
            "message": "The node was low on resource: memory.",
        }})),
    )
    .await?;
    let evicted = Instant::now();
    wait_lock_owner(
        &locks,
        &lock_name,
        &pod_b,
        FOR_LIFE_MAX_WAIT + Duration::from_secs(30),
    )
    .await
    .with_context(|| format!("standby's log:\n{}", b.log()))?;
    let taken = evicted.elapsed();
    ensure!(
        b.log().contains("Failed (Evicted)"),
        "the standby did not say why it took over:\n{}",
        b.log()
    );
    // The standby waits at most 16 s between attempts; a few seconds for the API calls.
    ensure!(
        taken <= FOR_LIFE_MAX_WAIT + Duration::from_secs(5),
        "the standby took {taken:?} to replace the evicted leader"
    );
    // The evicted Pod stays for its owner to inspect: taking over deletes no Pod.
    ensure!(
        pods.get_opt(&pod_a).await?.is_some(),
        "the evicted pod was deleted"
    );
    let stopped = wait_stops_leading(&mut a, evicted).await?;
    eprintln!(
        "evicted: the standby held the lock {taken:?} after the eviction; the old leader stopped after {stopped:?}"
    );
    kubectl_scale(&ns, "podset", "evict", 2)?;
    wait_podset_replicas_ready(&ns, "evict", 2, Duration::from_secs(60)).await?;
    assert!(reconciles(&b) > 0.0, "the new leader reconciled");
    Ok(())
}

/// Writes the `Ready` condition of `node` as a kubelet (or, for `Unknown`, the node
/// lifecycle controller) would, with a fresh heartbeat.
async fn set_node_ready(nodes: &Api<Node>, node: &str, status: &str) -> Result<()> {
    let now = Timestamp::now().to_string();
    nodes
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{
                "type": "Ready",
                "status": status,
                "reason": if status == "True" { "KubeletReady" } else { "NodeStatusUnknown" },
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }]}})),
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_leader_for_life_on_a_node_not_ready_is_replaced() -> Result<()> {
    install_for_life()?;
    let ns = TestNamespace::new("leader-node").await?;
    let suffix = unique_suffix();
    let lock_name = format!("e2e-node-{suffix}");
    let pods: Api<Pod> = Api::namespaced(ns.client.clone(), LEASE_NS);
    let locks: Api<ConfigMap> = Api::namespaced(ns.client.clone(), LEASE_NS);
    let nodes: Api<Node> = Api::all(ns.client.clone());
    // A Node of this test's own: no kubelet and no kwok behind it (kwok manages only the
    // nodes labelled type=kwok), so its Ready condition is what the test writes. Tainted
    // and unschedulable: nothing else is placed there.
    let node = format!("e2e-leader-node-{suffix}");
    let (pod_a, pod_b) = (format!("replica-a-{suffix}"), format!("replica-b-{suffix}"));
    let _cleanup = Cleanup(vec![
        vec![
            "pods".into(),
            "-n".into(),
            LEASE_NS.into(),
            pod_a.clone(),
            pod_b.clone(),
        ],
        vec!["node".into(), node.clone()],
    ]);
    let manifest: Node = serde_json::from_value(json!({
        "metadata": {"name": node},
        "spec": {
            "unschedulable": true,
            "taints": [{"key": "e2e.rust-operators.dev/unmanaged", "effect": "NoSchedule"}],
        },
    }))?;
    nodes.create(&PostParams::default(), &manifest).await?;
    set_node_ready(&nodes, &node, "True").await?;
    // Keep the node's heartbeat fresh until it "stops reporting", so the node lifecycle
    // controller does not judge it first.
    let heartbeat = {
        let (nodes, node) = (nodes.clone(), node.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let _ = set_node_ready(&nodes, &node, "True").await;
            }
        })
    };
    // The leader's Pod is bound to that node (it stays Pending: no kubelet reports on it,
    // which is not terminal); the standby's runs on a simulated node.
    create_identity_pod(&pods, &pod_a, Some(&node)).await?;
    create_identity_pod(&pods, &pod_b, None).await?;
    let args = for_life_args(&lock_name);
    let mut a = start_replica(&ns, &pod_a, &args).await?;
    wait_lock_owner(&locks, &lock_name, &pod_a, Duration::from_secs(30)).await?;
    let b = start_replica(&ns, &pod_b, &args).await?;
    poll(
        "the standby waiting on the leader on a Ready node",
        Duration::from_secs(30),
        || async { Ok(b.log().contains("standing by").then_some(())) },
    )
    .await?;
    ensure!(
        lock_owner(&locks.get(&lock_name).await?).as_deref() == Some(pod_a.as_str()),
        "the standby took over from a leader on a Ready node:\n{}",
        b.log()
    );

    // The node stops reporting: what the node lifecycle controller writes after its grace
    // period (Ready=Unknown).
    heartbeat.abort();
    let _ = heartbeat.await;
    set_node_ready(&nodes, &node, "Unknown").await?;
    let not_ready = Instant::now();
    wait_lock_owner(
        &locks,
        &lock_name,
        &pod_b,
        FOR_LIFE_MAX_WAIT + Duration::from_secs(30),
    )
    .await
    .with_context(|| format!("standby's log:\n{}", b.log()))?;
    let taken = not_ready.elapsed();
    ensure!(
        b.log().contains("is not ready (Ready=Unknown)"),
        "the standby did not say why it took over:\n{}",
        b.log()
    );
    ensure!(
        taken <= FOR_LIFE_MAX_WAIT + Duration::from_secs(5),
        "the standby took {taken:?} to replace the leader on a NotReady node"
    );
    let stopped = wait_stops_leading(&mut a, not_ready).await?;
    eprintln!(
        "node not ready: the standby held the lock {taken:?} after; the old leader stopped after {stopped:?}"
    );
    Ok(())
}
