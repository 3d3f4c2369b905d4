//! The PodSet operator on a real cluster, run with its own ServiceAccount.

use anyhow::Result;
use e2e::kinds::{PODSET, assert_all_creates_rejected, named_bad, podset};
use e2e::operator::{OperatorOptions, OperatorProcess, metric_sum, touch_and_wait_reconcile};
use e2e::{
    PodWatch, TIMEOUT, TestNamespace, assert_never_reconciled, create_from_json, kubectl_ok,
    kubectl_scale, live_pods_controlled_by, poll, wait_for, wait_until, watching_one,
};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use podset_operator::api::PodSet;
use serde_json::{Value, json};
use std::collections::BTreeMap;

const OPERATOR: &str = "podset-operator";

async fn create(ns: &TestNamespace, manifest: Value) -> Result<PodSet> {
    create_from_json(ns, manifest).await
}

/// Waits until the PodSet reports `replicas` ready pods for its current generation.
async fn wait_ready(ns: &TestNamespace, name: &str, replicas: i32) -> Result<PodSet> {
    wait_until(&ns.api(), name, move |ps: &PodSet| {
        let Some(status) = &ps.status else {
            return false;
        };
        status.observed_generation == ps.metadata.generation
            && status.ready_replicas == replicas
            && status.replicas == replicas
            && status.pod_names.len() == replicas as usize
            && status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
    })
    .await
}

async fn owned_pods(ns: &TestNamespace, owner: &PodSet) -> Result<Vec<Pod>> {
    live_pods_controlled_by(ns, owner.metadata.uid.as_deref().unwrap_or_default()).await
}

/// The resourceVersion of each live pod of the PodSet, by name.
async fn pod_versions(ns: &TestNamespace, owner: &PodSet) -> Result<BTreeMap<String, String>> {
    Ok(owned_pods(ns, owner)
        .await?
        .into_iter()
        .map(|p| {
            (
                p.metadata.name.unwrap_or_default(),
                p.metadata.resource_version.unwrap_or_default(),
            )
        })
        .collect())
}

#[tokio::test]
async fn podset_converges_scales_and_repairs() -> Result<()> {
    let ns = TestNamespace::restricted("podset").await?;
    let op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;

    // Create converges to Ready, with the original operator's manifest.
    create(&ns, podset("demo", 3)).await?;
    let ps = wait_ready(&ns, "demo", 3).await?;
    // Its watches and its writes share one HTTP/2 connection to the API server (over
    // HTTP/1.1 each watch would hold a connection of its own).
    assert_eq!(op.api_server_connections()?, 1);
    let status = ps.status.clone().unwrap_or_default();
    let mut sorted = status.pod_names.clone();
    sorted.sort();
    assert_eq!(status.pod_names, sorted, "podNames must be sorted");
    let pods = owned_pods(&ns, &ps).await?;
    assert_eq!(pods.len(), 3);
    for pod in &pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        assert!(name.starts_with("demo-pod-"), "{name}");
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("app").map(String::as_str), Some("demo"));
        assert_eq!(labels.get("version").map(String::as_str), Some("v0.1"));
        assert_eq!(
            labels
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str),
            Some(OPERATOR)
        );
        assert_eq!(
            labels.get("app.kubernetes.io/instance").map(String::as_str),
            Some("demo")
        );
        assert!(status.pod_names.contains(&name));
    }

    // The scale subresource: `kubectl scale` works, up and down.
    kubectl_scale(&ns, "podset", "demo", 5)?;
    wait_ready(&ns, "demo", 5).await?;
    kubectl_scale(&ns, "podset", "demo", 2)?;
    let ps = wait_ready(&ns, "demo", 2).await?;
    assert_eq!(owned_pods(&ns, &ps).await?.len(), 2);

    // A deleted pod comes back (as a new pod).
    let victim = ps.status.clone().unwrap_or_default().pod_names[0].clone();
    ns.api::<Pod>()
        .delete(&victim, &DeleteParams::default())
        .await?;
    let pods: Api<Pod> = ns.api();
    poll("the deleted pod replaced", TIMEOUT, || async {
        let current = owned_pods(&ns, &ps).await?;
        let gone = current
            .iter()
            .all(|p| p.metadata.name.as_deref() != Some(victim.as_str()));
        Ok((gone && current.len() == 2).then_some(()))
    })
    .await?;
    wait_ready(&ns, "demo", 2).await?;

    // The pod watch selects the managed-by label: a pod of ours that loses it leaves the
    // watch, yet is relabelled, not replaced.
    let before: Vec<String> = owned_pods(&ns, &ps)
        .await?
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let unlabelled = before[0].clone();
    pods.patch(
        &unlabelled,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": null}}})),
    )
    .await?;
    poll("the managed-by label restored", TIMEOUT, || async {
        let pod = pods.get(&unlabelled).await?;
        Ok(pod
            .labels()
            .get("app.kubernetes.io/managed-by")
            .is_some_and(|v| v == OPERATOR)
            .then_some(()))
    })
    .await?;
    let ps = wait_ready(&ns, "demo", 2).await?;
    let mut after: Vec<String> = owned_pods(&ns, &ps)
        .await?
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    after.sort();
    let mut before = before;
    before.sort();
    assert_eq!(after, before, "the unlabelled pod was replaced");

    // A stranger's pod with the same labels is left alone and not counted, even with
    // the managed-by label: ownership is the controller owner reference.
    let stranger: Pod = serde_json::from_value(json!({
        "metadata": {"name": "stranger", "labels": {"app": "demo", "version": "v0.1",
            "app.kubernetes.io/managed-by": OPERATOR}},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "image": "busybox",
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]
        }
    }))?;
    pods.create(&PostParams::default(), &stranger).await?;
    let ps = wait_ready(&ns, "demo", 2).await?;
    assert!(
        !ps.status
            .unwrap_or_default()
            .pod_names
            .contains(&"stranger".to_owned())
    );
    assert!(pods.get_opt("stranger").await?.is_some());

    // Deleting the PodSet garbage-collects its pods, not the stranger.
    ns.api::<PodSet>()
        .delete("demo", &DeleteParams::background())
        .await?;
    poll("the PodSet's pods gone", TIMEOUT, || async {
        let left: Vec<String> = pods
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        Ok((left == ["stranger"]).then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn podset_at_rest_writes_nothing() -> Result<()> {
    let ns = TestNamespace::new("podset-idle").await?;
    let op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;
    create(&ns, podset("idle", 3)).await?;
    let ps = wait_ready(&ns, "idle", 3).await?;
    let before_status = ps.status.clone();
    let before_rv = pod_versions(&ns, &ps).await?;

    // Trigger a reconcile without changing the spec: touch an annotation,
    // then wait until the operator has reconciled it (its counter moves).
    touch_and_wait_reconcile(&ns.api::<PodSet>(), &op, "idle", "1", &[]).await?;

    let after = ns.api::<PodSet>().get("idle").await?;
    assert_eq!(after.status, before_status, "status must not be rewritten");
    let after_rv = pod_versions(&ns, &after).await?;
    assert_eq!(before_rv, after_rv, "pods must not be written");
    Ok(())
}

/// 0 -> 20 (with a burst of unrelated updates), 20 -> 3 -> 15 quickly, then 15 -> 3 -> 15
/// once settled, while a watch counts every pod: per phase, never more live pods than
/// the phase allows and exactly the pods needed created. `extra` are operator flags.
async fn rapid_scaling(label: &str, extra: &[&str]) -> Result<()> {
    let ns = TestNamespace::new(label).await?;
    let _op = OperatorProcess::start_with(
        OPERATOR,
        &[&ns.name],
        OperatorOptions {
            args: extra.iter().map(|a| (*a).to_owned()).collect(),
            ..OperatorOptions::default()
        },
    )
    .await?;
    create(&ns, podset("burst", 0)).await?;
    wait_ready(&ns, "burst", 0).await?;

    // Watch every pod of the namespace: the most live (non-terminating) pods at once per
    // phase, and every pod ever created.
    let watch = PodWatch::start(&ns);

    // Phase 1, 0 -> 20, with a burst of unrelated updates so that reconciles run while
    // the operator's cache has not yet seen its own creates.
    kubectl_scale(&ns, "podset", "burst", 20)?;
    let api: Api<PodSet> = ns.api();
    for i in 0..10 {
        api.patch(
            "burst",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"e2e/nudge": i.to_string()}}})),
        )
        .await?;
    }
    wait_ready(&ns, "burst", 20).await?;
    let s = watch.census()?;
    assert_eq!(s.ever.len(), 20, "phase 0 -> 20: exactly 20 pods created");
    assert!(
        s.max_live <= 20,
        "phase 0 -> 20: saw {} live pods",
        s.max_live
    );

    // Phase 2, 20 -> 3 -> 15 before the scale-down is done: never above 20, and only the
    // pods deleted below 15 are replaced.
    watch.new_phase()?;
    kubectl_scale(&ns, "podset", "burst", 3)?;
    poll("the scale-down under way", TIMEOUT, || async {
        Ok((watch.census()?.live.len() < 20).then_some(()))
    })
    .await?;
    kubectl_scale(&ns, "podset", "burst", 15)?;
    let ps = wait_ready(&ns, "burst", 15).await?;
    assert_eq!(owned_pods(&ns, &ps).await?.len(), 15);
    let s = watch.census()?;
    assert!(
        s.max_live <= 20,
        "phase 20 -> 3 -> 15: saw {} live pods",
        s.max_live
    );
    let created = s.ever.len() - 20;
    assert!(
        created <= 12,
        "phase 20 -> 3 -> 15: {created} pods created; at most 15 - 3 are ever needed"
    );

    // Phase 3, settled at 3, then 15: never above 15, exactly 12 created.
    kubectl_scale(&ns, "podset", "burst", 3)?;
    wait_ready(&ns, "burst", 3).await?;
    poll("the scaled-down pods gone", TIMEOUT, || async {
        Ok((watch.census()?.live.len() == 3).then_some(()))
    })
    .await?;
    watch.new_phase()?;
    let ever_before = watch.census()?.ever.len();
    kubectl_scale(&ns, "podset", "burst", 15)?;
    wait_ready(&ns, "burst", 15).await?;
    let s = watch.census()?;
    assert!(
        s.max_live <= 15,
        "phase 3 -> 15: saw {} live pods",
        s.max_live
    );
    assert_eq!(
        s.ever.len() - ever_before,
        12,
        "phase 3 -> 15: exactly 12 pods created"
    );
    drop(watch);
    Ok(())
}

#[tokio::test]
async fn podset_never_overshoots_under_rapid_scaling() -> Result<()> {
    rapid_scaling("podset-scale", &[]).await
}

/// Without the debounce every event is a reconcile, so the expectations alone keep the
/// count right while the cache lags behind the operator's own writes.
#[tokio::test]
async fn podset_never_overshoots_under_rapid_scaling_without_debounce() -> Result<()> {
    rapid_scaling("podset-scale-nodebounce", &["--reconcile-debounce=0s"]).await
}

#[tokio::test]
async fn podset_invalid_objects_are_rejected_naming_the_field() -> Result<()> {
    let ns = TestNamespace::new("podset-invalid").await?;
    e2e::operator::install(OPERATOR)?;
    let cases = [
        (json!({"replicas": -1}), "spec.replicas"),
        (json!({"replicas": 1001}), "spec.replicas"),
        (json!({"replicas": "three"}), "spec.replicas"),
        (json!({}), "spec.replicas"),
        (json!({"replicas": 1, "image": ""}), "spec.image"),
        (json!({"replicas": 2.5}), "spec.replicas"),
        (json!({"replicas": [3]}), "spec.replicas"),
        (
            json!({"replicas": 1, "image": "i".repeat(513)}),
            "spec.image",
        ),
        (json!({"replicas": 1, "image": 42}), "spec.image"),
        (json!("three pods"), "spec"),
        (Value::Null, "spec"),
    ];
    assert_all_creates_rejected(&ns, &PODSET, named_bad(cases)).await?;
    Ok(())
}

#[tokio::test]
async fn podset_outside_watch_namespace_is_untouched() -> Result<()> {
    let (watched, other, _op) = watching_one(OPERATOR, "podset").await?;
    create(&other, podset("ignored", 2)).await?;
    create(&watched, podset("seen", 1)).await?;
    // Once the watched one converged, the operator has been running and
    // listening; the other namespace's object must have no status and no pods.
    wait_ready(&watched, "seen", 1).await?;
    assert_never_reconciled::<PodSet, Pod>(&other, "ignored").await?;
    Ok(())
}

#[tokio::test]
async fn podset_sample_converges_to_three_ready_pods() -> Result<()> {
    let ns = TestNamespace::restricted("podset-sample").await?;
    let _op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;
    let sample = e2e::repo_root().join("deploy/podset-operator/samples/podset.yaml");
    kubectl_ok(["apply", "-n", &ns.name, "-f", &sample.display().to_string()])?;
    let ps = wait_ready(&ns, "podset-sample", 3).await?;
    let running = owned_pods(&ns, &ps)
        .await?
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count();
    assert_eq!(running, 3);
    let table = kubectl_ok(["get", "podsets", "-n", &ns.name])?;
    assert!(table.contains("podset-sample"), "{table}");
    assert!(
        table.contains("REPLICAS") && table.contains("READY"),
        "{table}"
    );
    Ok(())
}

#[tokio::test]
async fn podset_watches_several_namespaces_and_only_those() -> Result<()> {
    let a = TestNamespace::new("podset-multi-a").await?;
    let b = TestNamespace::new("podset-multi-b").await?;
    let c = TestNamespace::new("podset-multi-c").await?;
    let _op = OperatorProcess::start(OPERATOR, &[&a.name, &b.name]).await?;
    create(&c, podset("ignored", 1)).await?;
    create(&a, podset("in-a", 2)).await?;
    create(&b, podset("in-b", 1)).await?;
    wait_ready(&a, "in-a", 2).await?;
    wait_ready(&b, "in-b", 1).await?;
    assert_never_reconciled::<PodSet, Pod>(&c, "ignored").await?;
    Ok(())
}

#[tokio::test]
async fn podset_leader_holds_the_lease_and_releases_it_on_sigterm() -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    let ns = TestNamespace::new("podset-lease").await?;
    // The leader-election Role of deploy/ grants leases in the operator's
    // own namespace only.
    let lease_ns = format!("{OPERATOR}-system");
    let lease_name = format!("podset-e2e-{}", e2e::unique_suffix());
    let mut op = OperatorProcess::start_with(
        OPERATOR,
        &[&ns.name],
        e2e::operator::OperatorOptions {
            args: vec![
                "--leader-elect".into(),
                format!("--leader-election-namespace={lease_ns}"),
                format!("--leader-election-id={lease_name}"),
            ],
            ..Default::default()
        },
    )
    .await?;
    let leases: Api<Lease> = Api::namespaced(ns.client.clone(), &lease_ns);
    let holder = |l: &Lease| {
        l.spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default()
    };
    wait_for(&leases, &lease_name, |l: Option<&Lease>| {
        l.is_some_and(|l| !holder(l).is_empty())
    })
    .await?;
    // Only the leader reconciles: it does here.
    create(&ns, podset("led", 1)).await?;
    wait_ready(&ns, "led", 1).await?;
    let metrics = op.metrics()?;
    assert_eq!(
        metric_sum(&metrics, "leader_election_master_status", &[]),
        1.0,
        "{metrics}"
    );

    assert!(op.terminate()?, "SIGTERM must exit 0; log:\n{}", op.log());
    let lease = leases.get(&lease_name).await?;
    assert!(holder(&lease).is_empty(), "lease not released: {lease:?}");
    leases.delete(&lease_name, &DeleteParams::default()).await?;
    Ok(())
}

/// `--kube-api-qps 5 --kube-api-burst 5`: a PodSet of 20 still converges, and in no second
/// of the run did the operator send more than the bucket allows (burst + qps x 1 s),
/// counted from its own log of every request.
#[tokio::test]
async fn podset_converges_within_a_low_client_rate_limit() -> Result<()> {
    const QPS: f64 = 5.0;
    const BURST: usize = 5;
    let ns = TestNamespace::new("podset-qps").await?;
    let op = OperatorProcess::start_with(
        OPERATOR,
        &[&ns.name],
        OperatorOptions {
            args: vec!["--kube-api-qps=5".into(), "--kube-api-burst=5".into()],
            ..OperatorOptions::default()
        },
    )
    .await?;
    create(&ns, podset("slow", 20)).await?;
    wait_ready(&ns, "slow", 20).await?;
    let log = op.log();
    let mut sent: Vec<k8s_openapi::jiff::Timestamp> = log
        .lines()
        .filter(|l| xtask::support::logged_requests::parse_line(l).is_some())
        .filter_map(|l| {
            let v: Value = serde_json::from_str(l).ok()?;
            v["timestamp"].as_str()?.parse().ok()
        })
        .collect();
    sent.sort();
    assert!(
        sent.len() > 2 * BURST,
        "only {} requests: the limit was never tested",
        sent.len()
    );
    let allowed = BURST + QPS as usize;
    for (i, start) in sent.iter().enumerate() {
        let within = sent[i..]
            .iter()
            .take_while(|t| t.duration_since(*start).as_secs_f64() < 1.0)
            .count();
        assert!(
            within <= allowed,
            "{within} requests in the second from {start}; the bucket allows {allowed}"
        );
    }
    Ok(())
}

/// The caches fill with streaming lists by default (a watch with `sendInitialEvents`), and
/// with `--streaming-lists=false`, for API servers without them, with paginated lists:
/// a PodSet converges either way, and the request log shows which was used.
#[tokio::test]
async fn podset_converges_with_streaming_and_with_paginated_lists() -> Result<()> {
    for (streaming, flag) in [
        (true, "--streaming-lists=true"),
        (false, "--streaming-lists=false"),
    ] {
        let ns = TestNamespace::new("podset-lists").await?;
        let op = OperatorProcess::start_with(
            OPERATOR,
            &[&ns.name],
            OperatorOptions {
                args: vec![flag.into()],
                ..OperatorOptions::default()
            },
        )
        .await?;
        create(&ns, podset("listed", 2)).await?;
        wait_ready(&ns, "listed", 2).await?;
        let urls: Vec<String> = op
            .log()
            .lines()
            .filter_map(|l| {
                let v: Value = serde_json::from_str(l).ok()?;
                (v["span"]["http.method"].as_str()? == "GET")
                    .then(|| v["span"]["http.url"].as_str().map(str::to_owned))?
            })
            .filter(|u| u.contains("/pods?") || u.contains("/podsets?"))
            .collect();
        let streamed = urls
            .iter()
            .filter(|u| u.contains("sendInitialEvents=true"))
            .count();
        // (`limit=1`: the start-up check that the kind is served and readable.)
        let listed = urls
            .iter()
            .filter(|u| !u.contains("watch=") && !u.split(['?', '&']).any(|p| p == "limit=1"))
            .count();
        if streaming {
            assert!(
                streamed >= 2 && listed == 0,
                "{flag}: the pod and PodSet caches fill from watches: {urls:#?}"
            );
        } else {
            assert!(
                streamed == 0 && listed >= 2,
                "{flag}: the pod and PodSet caches fill from lists: {urls:#?}"
            );
        }
    }
    Ok(())
}
