//! The inner loop, `cargo xtask run <operator>`, for an operator whose pods run an app of
//! this workspace: `run` builds the app's image, pushes it to the local cluster's
//! registry and points the operator at it, so the pods it creates start on the real node
//! (before, they asked for `lolcow-web:latest`, which no registry has). Then SIGTERM
//! stops the operator cleanly: `run` became the operator, so the signal reaches it.

use anyhow::{Context, Result, bail, ensure};
use e2e::deployed::{NO_REAL_NODE, REAL_NODE, REGISTRY, has_real_node};
use e2e::kinds::{self, LOLCOW};
use e2e::operator::{free_port, http_get};
use e2e::{TestNamespace, create_from_json, kubeconfig_path, poll, repo_root, target_dir};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use lolcow_operator::api::Lolcow;
use std::process::{Child, Stdio};
use std::time::Duration;
use xtask::support::process_group;

/// The first run builds the web app's release image and the operator: minutes.
const FIRST_RUN: Duration = Duration::from_secs(900);

/// `cargo xtask run` as a child; stopped (SIGTERM, then SIGKILL) when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = process_group::stop_child(&mut self.0, Duration::from_secs(20));
    }
}

fn container_running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|statuses| {
            !statuses.is_empty()
                && statuses
                    .iter()
                    .all(|c| c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
}

#[tokio::test]
async fn xtask_run_lolcow_operator_serves_from_the_real_node() -> Result<()> {
    let ns = TestNamespace::real("xtask-run").await?;
    if !has_real_node(&ns.client).await? {
        return e2e::skip(
            "xtask_run_lolcow_operator_serves_from_the_real_node",
            NO_REAL_NODE,
        );
    }
    let logs = target_dir().join("e2e-logs");
    std::fs::create_dir_all(&logs)?;
    let log_path = logs.join(format!("{}-xtask-run.log", ns.name));
    let log = std::fs::File::create(&log_path)?;
    let health = free_port()?;
    // Without the test's crate variables (ring's build script reruns when one changes).
    let child = xtask::support::cmd::cargo()
        .current_dir(repo_root())
        .args(["xtask", "run", LOLCOW.operator, "--"])
        // Only this test's namespace; no metrics port to collide with anything here.
        .arg(format!("--watch-namespace={}", ns.name))
        .arg("--metrics-bind-address=0")
        .arg(format!("--health-probe-bind-address=127.0.0.1:{health}"))
        .env("KUBECONFIG", kubeconfig_path()?)
        .env("CARGO_TARGET_DIR", target_dir())
        .env_remove("LOLCOW_IMAGE")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting cargo xtask run")?;
    let pid = child.id();
    let mut running = Running(child);
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    poll("the operator's /readyz", FIRST_RUN, || {
        let exited = running.0.try_wait();
        async move {
            if let Some(status) = exited? {
                bail!("cargo xtask run exited ({status})");
            }
            Ok(http_get(health, "/readyz")
                .is_ok_and(|(code, _)| code == 200)
                .then_some(()))
        }
    })
    .await
    .with_context(|| format!("cargo xtask run's log:\n{}", log()))?;

    let port = kinds::free_node_port(&ns, "run", &[]).await?;
    create_from_json::<Lolcow>(&ns, kinds::lolcow("moo", port, "run moo")).await?;
    let lolcow = poll(
        "the Lolcow to be Ready",
        Duration::from_secs(240),
        || async {
            let lc: Lolcow = ns.api().get("moo").await?;
            Ok(kinds::lolcow_ready(&lc).then_some(lc))
        },
    )
    .await
    .with_context(|| format!("cargo xtask run's log:\n{}", log()))?;

    // Its pod runs on the real node, from the image `run` pushed (pinned by digest).
    let pods = ns.api::<Pod>().list(&ListParams::default()).await?.items;
    let pod = pods
        .iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
        .context("the Lolcow has no pod")?;
    let spec = pod.spec.as_ref().context("no pod spec")?;
    ensure!(
        spec.node_name.as_deref() == Some(REAL_NODE),
        "the pod runs on {:?}",
        spec.node_name
    );
    let image = spec.containers[0].image.clone().unwrap_or_default();
    ensure!(
        image.starts_with(&format!("{REGISTRY}/lolcow-web:")) && image.contains("@sha256:"),
        "the pod runs {image}"
    );
    ensure!(
        container_running(pod),
        "the pod's container is not running and ready: {:?}",
        pod.status
    );
    // And serves the page through its NodePort.
    let served = lolcow.status.as_ref().and_then(|s| s.port).unwrap_or(port);
    let (code, page) = poll(
        "the page on the NodePort",
        Duration::from_secs(60),
        || async {
            Ok(http_get(u16::try_from(served)?, "/")
                .ok()
                .filter(|(code, _)| *code == 200))
        },
    )
    .await?;
    ensure!(code == 200 && page.contains("run moo"), "the page: {page}");

    // SIGTERM reaches the operator itself, which shuts down and exits 0.
    let status = process_group::stop_child(&mut running.0, Duration::from_secs(30))?
        .context("cargo xtask run had exited before SIGTERM")?;
    ensure!(
        status.success(),
        "pid {pid} ended with {status} on SIGTERM; log:\n{}",
        log()
    );
    ensure!(
        log().contains("shut down cleanly"),
        "no clean shutdown in the log:\n{}",
        log()
    );
    Ok(())
}
