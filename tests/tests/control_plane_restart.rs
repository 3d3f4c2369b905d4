//! The operator rides out an etcd restart and an API server restart on its
//! own, without being restarted, and converges changes made afterwards.
//!
//! This file holds a single test: restarting the control plane would disturb
//! other tests running at the same time in the same binary.

use anyhow::{Context, Result, bail};
use e2e::kinds::{podset, wait_podset_replicas_ready};
use e2e::operator::OperatorProcess;
use e2e::{TestNamespace, create_from_json, kubectl_ok, kubectl_scale, poll, repo_root};
use podset_operator::api::PodSet;
use std::time::Duration;

fn xtask(args: &[&str]) -> Result<()> {
    let out = xtask::support::cmd::cargo()
        .current_dir(repo_root())
        .args(["run", "--quiet", "-p", "xtask", "--"])
        .args(args)
        .output()
        .context("running cargo xtask")?;
    if !out.status.success() {
        bail!(
            "cargo xtask {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

async fn wait_ready(ns: &TestNamespace, replicas: i32) -> Result<()> {
    wait_podset_replicas_ready(ns, "survivor", replicas, Duration::from_secs(90)).await
}

#[tokio::test]
async fn operator_recovers_from_etcd_and_api_server_restarts() -> Result<()> {
    if std::env::var_os("E2E_LOCAL_CLUSTER").is_none() {
        return e2e::skip(
            "operator_recovers_from_etcd_and_api_server_restarts",
            "needs the local cluster (cargo xtask test sets E2E_LOCAL_CLUSTER)",
        );
    }
    let ns = TestNamespace::new("restart").await?;
    let mut op = OperatorProcess::start("podset-operator", &[&ns.name]).await?;
    create_from_json::<PodSet>(&ns, podset("survivor", 2)).await?;
    wait_ready(&ns, 2).await?;
    let pid = op.pid();

    for process in ["etcd", "apiserver"] {
        xtask(&["cluster", "stop", process])?;
        // The API is really gone (etcd down makes every read fail).
        poll("the API unavailable", Duration::from_secs(30), || async {
            // A short request timeout: without one a read hangs for the API
            // server's 60 s while etcd is down.
            Ok(kubectl_ok([
                "get",
                "--raw",
                "/api/v1/namespaces/default",
                "--request-timeout=2s",
            ])
            .is_err()
            .then_some(()))
        })
        .await?;
        xtask(&["cluster", "up"])?;
        let replicas = if process == "etcd" { 3 } else { 1 };
        kubectl_scale(&ns, "podset", "survivor", replicas)?;
        wait_ready(&ns, replicas).await?;
        assert!(
            op.is_running(),
            "the operator must not exit; log:\n{}",
            op.log()
        );
        assert_eq!(op.pid(), pid);
    }
    Ok(())
}
