//! An operator killed in the middle of a scale-up, then restarted, ends with
//! exactly the requested pods and never more at any moment.

use anyhow::Result;
use e2e::operator::OperatorProcess;
use e2e::{TestNamespace, kubectl_ok, poll, wait_for_within};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::runtime::watcher;
use podset_operator::api::PodSet;
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[tokio::test]
async fn killed_mid_scale_up_the_operator_ends_with_exactly_fifty_pods() -> Result<()> {
    let ns = TestNamespace::new("crash-scale").await?;
    let mut op = OperatorProcess::start("podset-operator", &[&ns.name]).await?;
    let ps: PodSet = serde_json::from_value(json!({
        "apiVersion": "batch.tutorial.kubebuilder.io/v1",
        "kind": "PodSet",
        "metadata": {"name": "fifty"},
        "spec": {"replicas": 0}
    }))?;
    ns.api::<PodSet>()
        .create(&PostParams::default(), &ps)
        .await?;

    // Every live pod the namespace ever had at once.
    let live = Arc::new(Mutex::new((BTreeSet::<String>::new(), 0usize)));
    let watch = {
        let live = Arc::clone(&live);
        let stream = watcher(ns.api::<Pod>(), watcher::Config::default());
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(mut guard) = live.lock() else { return };
                let (set, max) = &mut *guard;
                match event {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                        let uid = p.metadata.uid.clone().unwrap_or_default();
                        if p.metadata.deletion_timestamp.is_none() {
                            set.insert(uid);
                        } else {
                            set.remove(&uid);
                        }
                        *max = (*max).max(set.len());
                    }
                    Ok(watcher::Event::Delete(p)) => {
                        set.remove(&p.metadata.uid.unwrap_or_default());
                    }
                    _ => {}
                }
            }
        })
    };

    kubectl_ok(["scale", "podset/fifty", "--replicas=50", "-n", &ns.name])?;
    // Kill it once the scale-up is under way, but before it is done.
    poll(
        "the scale-up under way",
        Duration::from_secs(60),
        || async {
            let n = live.lock().map(|g| g.0.len()).unwrap_or(0);
            Ok((n >= 5).then_some(()))
        },
    )
    .await?;
    op.kill();
    let mut op = OperatorProcess::start("podset-operator", &[&ns.name]).await?;
    wait_for_within(
        &ns.api::<PodSet>(),
        "fifty",
        Duration::from_secs(120),
        |ps: Option<&PodSet>| {
            ps.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.ready_replicas == 50 && s.replicas == 50)
        },
    )
    .await?;
    let (now, max) = live
        .lock()
        .map(|g| (g.0.len(), g.1))
        .map_err(|_| anyhow::anyhow!("poisoned"))?;
    assert_eq!(now, 50, "exactly 50 pods in the end");
    assert!(max <= 50, "saw {max} live pods at once");
    assert!(op.is_running());
    watch.abort();
    Ok(())
}
