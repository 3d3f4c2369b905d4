//! An operator killed in the middle of a scale-up, then restarted, ends with
//! exactly the requested pods and never more at any moment.

use anyhow::Result;
use e2e::kinds::podset;
use e2e::operator::OperatorProcess;
use e2e::{PodWatch, TestNamespace, create_from_json, kubectl_scale, poll, wait_for_within};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use podset_operator::api::PodSet;
use std::time::Duration;

#[tokio::test]
async fn killed_mid_scale_up_the_operator_ends_with_exactly_fifty_pods() -> Result<()> {
    let ns = TestNamespace::new("crash-scale").await?;
    let mut op = OperatorProcess::start("podset-operator", &[&ns.name]).await?;
    create_from_json::<PodSet>(&ns, podset("fifty", 0)).await?;

    // Every live pod the namespace ever had at once.
    let watch = PodWatch::start(&ns);

    kubectl_scale(&ns, "podset", "fifty", 50)?;
    // Kill it once the scale-up is under way, but before it is done.
    poll(
        "the scale-up under way",
        Duration::from_secs(60),
        || async {
            let n = watch.census().map(|c| c.live.len()).unwrap_or(0);
            Ok((n >= 1).then_some(()))
        },
    )
    .await?;
    op.kill();
    // The kill interrupted the scale-up: fewer than 50 pods exist once the process is gone
    // (a create it had sent is already stored, so this counts everything it did).
    let at_kill = ns
        .api::<Pod>()
        .list(&ListParams::default())
        .await?
        .items
        .len();
    assert!(
        at_kill < 50,
        "the kill came after all 50 pods existed ({at_kill}): nothing was interrupted"
    );
    eprintln!("killed with {at_kill} of 50 pods created");
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
    let census = watch.census()?;
    let (now, max) = (census.live.len(), census.max_live);
    assert_eq!(now, 50, "exactly 50 pods in the end");
    assert!(max <= 50, "saw {max} live pods at once");
    assert!(op.is_running());
    drop(watch);
    Ok(())
}
