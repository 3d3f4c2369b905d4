//! Leader election under failure: two replicas of the PodSet operator, only one
//! reconciling at any moment, and a fast, safe handover.

use anyhow::{Result, bail};
use e2e::kinds::{podset, wait_podset_replicas_ready};
use e2e::operator::{OperatorOptions, OperatorProcess, metric_sum};
use e2e::{TestNamespace, create_from_json, kubectl_scale, poll, unique_suffix};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use podset_operator::api::PodSet;
use serde_json::json;
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

    // kill -9: no release; the standby takes over once the lease expires
    // (15 s) and then reconciles a change made meanwhile.
    leader.kill();
    kubectl_scale(&ns, "podset", "ha", 4)?;
    wait_podset_replicas_ready(&ns, "ha", 4, Duration::from_secs(15 + 15)).await?;
    assert!(reconciles(standby) > 0.0, "the new leader reconciled");
    let new = holder(&leases.get(&lease_name).await?);
    assert!(!new.is_empty() && new != old, "lease still held by {new}");
    leases.delete(&lease_name, &DeleteParams::default()).await?;
    Ok(())
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

#[tokio::test]
async fn leader_for_life_is_held_until_the_leaders_pod_is_gone() -> Result<()> {
    let ns = TestNamespace::new("leader-life").await?;
    let suffix = unique_suffix();
    let lock_name = format!("e2e-life-{suffix}");
    // The replicas' own Pod objects (kwok runs them; the processes run here).
    let pods: Api<Pod> = Api::namespaced(ns.client.clone(), LEASE_NS);
    let (pod_a, pod_b) = (format!("replica-a-{suffix}"), format!("replica-b-{suffix}"));
    for name in [&pod_a, &pod_b] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "automountServiceAccountToken": false,
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "operator", "image": "podset-operator",
                    "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]
            }
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
    }
    let args = vec![
        "--leader-elect".to_owned(),
        "--leader-election-mode=for-life".to_owned(),
        format!("--leader-election-id={lock_name}"),
    ];
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

    // The leader's process dies, but its Pod object is still there: no
    // takeover (a node cut off from the cluster looks like this).
    a.kill();
    kubectl_scale(&ns, "podset", "life", 2)?;
    poll(
        "the standby waiting on the live pod",
        Duration::from_secs(30),
        || async { Ok(b.log().contains("standing by").then_some(())) },
    )
    .await?;
    let lock_now = locks.get(&lock_name).await?;
    assert_eq!(lock_now.metadata.uid, lock.metadata.uid, "the lock stays");
    assert_eq!(reconciles(&b), 0.0, "no split brain");

    // The Pod object goes: the standby takes the lock and converges the change.
    pods.delete(&pod_a, &DeleteParams::default()).await?;
    wait_podset_replicas_ready(&ns, "life", 2, Duration::from_secs(60)).await?;
    let lock = locks.get(&lock_name).await?;
    let owner = lock.metadata.owner_references.unwrap_or_default();
    assert_eq!(owner.first().map(|o| o.name.as_str()), Some(pod_b.as_str()));
    pods.delete(&pod_b, &DeleteParams::default()).await?;
    Ok(())
}
