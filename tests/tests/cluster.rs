//! The test cluster is real: scheduling, Deployments, garbage collection and
//! RBAC all behave as on any Kubernetes cluster.

use anyhow::Result;
use e2e::operator::service_account_kubeconfig_for;
use e2e::{TIMEOUT, TestNamespace, can_i, client_from, poll};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

fn deployment(name: &str, replicas: i32) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]}
            }
        }
    }))?)
}

async fn running_pods(pods: &Api<Pod>, app: &str) -> Result<Vec<Pod>> {
    let list = pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect())
}

#[tokio::test]
async fn deployment_pods_run_on_simulated_nodes() -> Result<()> {
    let ns = TestNamespace::new("cluster-pods").await?;
    let deployments: Api<Deployment> = ns.api();
    deployments
        .create(&PostParams::default(), &deployment("web", 3)?)
        .await?;
    let pods: Api<Pod> = ns.api();
    let running = poll("3 running pods", TIMEOUT, || async {
        let running = running_pods(&pods, "web").await?;
        Ok((running.len() == 3).then_some(running))
    })
    .await?;
    for pod in &running {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        assert!(node.starts_with("kwok-node-"), "scheduled onto {node:?}");
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        assert!(ready, "pod is not Ready: {pod:?}");
    }
    // The Deployment controller sees them too.
    e2e::wait_for(&deployments, "web", |d: Option<&Deployment>| {
        d.and_then(|d| d.status.as_ref())
            .and_then(|s| s.available_replicas)
            == Some(3)
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn deleting_a_deployment_garbage_collects_its_replicaset_and_pods() -> Result<()> {
    let ns = TestNamespace::new("cluster-gc").await?;
    let deployments: Api<Deployment> = ns.api();
    let replicasets: Api<ReplicaSet> = ns.api();
    let pods: Api<Pod> = ns.api();
    deployments
        .create(&PostParams::default(), &deployment("gc", 2)?)
        .await?;
    poll("2 running pods", TIMEOUT, || async {
        Ok((running_pods(&pods, "gc").await?.len() == 2).then_some(()))
    })
    .await?;
    assert_eq!(
        replicasets.list(&ListParams::default()).await?.items.len(),
        1
    );

    // Background propagation: the garbage collector, not the client, removes
    // the dependents.
    deployments
        .delete("gc", &DeleteParams::background())
        .await?;
    poll("ReplicaSet and Pods gone", TIMEOUT, || async {
        let rs = replicasets.list(&ListParams::default()).await?.items.len();
        let p = pods.list(&ListParams::default()).await?.items.len();
        Ok((rs == 0 && p == 0).then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_service_account_without_bindings_cannot_list_pods() -> Result<()> {
    let ns = TestNamespace::new("cluster-rbac").await?;
    let mut sa = ServiceAccount::default();
    sa.metadata.name = Some("nobody".into());
    ns.api::<ServiceAccount>()
        .create(&PostParams::default(), &sa)
        .await?;
    let kubeconfig = service_account_kubeconfig_for(&ns.name, "nobody")?;
    let client = client_from(&kubeconfig).await?;
    let pods: Api<Pod> = Api::namespaced(client, &ns.name);
    let err = pods
        .list(&ListParams::default())
        .await
        .expect_err("an unbound ServiceAccount must not list pods");
    match err {
        kube::Error::Api(status) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("expected 403 Forbidden, got {other:?}"),
    }
    // And kubectl's own view agrees.
    let user = format!("system:serviceaccount:{}:nobody", ns.name);
    assert!(!can_i(&user, &["list", "pods", "-n", &ns.name])?);
    Ok(())
}
