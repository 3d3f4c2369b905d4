//! Watched namespaces are isolated (the contract): the PodSet operator watches two
//! namespaces with the namespaced overlay's Role bound in each; one namespace loses its
//! RoleBinding and the operator restarts. Its watches there fail: that namespace is
//! logged, `/readyz` still answers 200 (its body a bare `ok`, naming no namespace and no
//! error), and the other namespace keeps converging (a new PodSet, a scale).
//!
//! The namespace that breaks sorts first (`nsiso-broken` < `nsiso-working`), so the
//! operator's first scope is the failing one: startup must not depend on it either.

use anyhow::{Context, Result, ensure};
use e2e::kinds::{self, wait_memcached_ready, wait_podset_ready, wait_podset_replicas_ready};
use e2e::manifests::{kustomize, of_kind};
use e2e::operator::{
    OperatorOptions, OperatorProcess, http_get, install, service_account_kubeconfig_for,
};
use e2e::rbac::grant_roles;
use e2e::{TIMEOUT, TestNamespace, create_from_json, kubectl_ok, kubectl_scale, poll, repo_root};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use memcached_operator::api::Memcached;
use podset_operator::api::PodSet;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

const OPERATOR: &str = "podset-operator";

/// The rules of the operator's Role in the namespaced overlay.
fn overlay_role_rules(operator: &str) -> Result<Value> {
    let objects = kustomize(&repo_root().join("deploy").join(operator).join("namespaced"))?;
    of_kind(&objects, "Role")
        .into_iter()
        .find(|r| r["metadata"]["name"] == operator)
        .map(|r| r["rules"].clone())
        .context("the namespaced overlay has no Role named after the operator")
}

/// Cluster-scoped grants a test made (labelled with its home namespace); deleted when
/// dropped.
struct ClusterGrants(String);

impl Drop for ClusterGrants {
    fn drop(&mut self) {
        let _ = e2e::kubectl_runner().capture([
            "delete",
            "clusterrolebinding,clusterrole",
            "-l",
            &format!("e2e.rust-operators.dev/namespace={}", self.0),
            "--wait=false",
        ]);
    }
}

/// A ServiceAccount in `home` bound to the `operator`'s overlay Role in each of
/// `namespaces`; returns a kubeconfig with its token.
async fn scoped_identity(
    operator: &str,
    home: &TestNamespace,
    namespaces: &[&TestNamespace],
) -> Result<(PathBuf, ClusterGrants)> {
    let rules = overlay_role_rules(operator)?;
    let sa_name = format!("{operator}-isolated");
    grant_roles(operator, &sa_name, &rules, home, namespaces).await?;
    // The overlay's cluster-wide grant on the operator's own kind, if it has one (the
    // Memcached finalizer), bound to this ServiceAccount under a name of the test's own.
    let objects = kustomize(&repo_root().join("deploy").join(operator).join("namespaced"))?;
    let grants = ClusterGrants(home.name.clone());
    if let Some(role) = of_kind(&objects, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == format!("{operator}-finalizer"))
    {
        let name = format!("{}-{operator}-finalizer", home.name);
        kubectl_apply_json(&json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRole",
                    "metadata": {"name": name, "labels": {"e2e.rust-operators.dev/namespace": home.name}},
                    "rules": role["rules"],
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": name, "labels": {"e2e.rust-operators.dev/namespace": home.name}},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                    "subjects": [{"kind": "ServiceAccount", "name": sa_name, "namespace": home.name}],
                },
            ],
        }))?;
    }
    Ok((
        service_account_kubeconfig_for(&home.name, &sa_name)?,
        grants,
    ))
}

/// `kubectl apply -f -` of a JSON document.
fn kubectl_apply_json(doc: &Value) -> Result<()> {
    e2e::kubectl_runner().with_stdin(["apply", "-f", "-"], &doc.to_string())
}

async fn start(
    operator: &str,
    kubeconfig: &Path,
    namespaces: [&TestNamespace; 2],
) -> Result<OperatorProcess> {
    OperatorProcess::start_with(
        operator,
        &[&namespaces[0].name, &namespaces[1].name],
        OperatorOptions {
            kubeconfig: Some(kubeconfig.to_path_buf()),
            ..OperatorOptions::default()
        },
    )
    .await
}

#[tokio::test]
async fn a_namespace_whose_watches_fail_does_not_stop_the_others() -> Result<()> {
    install(OPERATOR)?;
    let broken = TestNamespace::restricted("nsiso-broken").await?;
    let working = TestNamespace::restricted("nsiso-working").await?;
    ensure!(
        broken.name < working.name,
        "the failing namespace must sort first"
    );
    let (kubeconfig, _grants) = scoped_identity(OPERATOR, &working, &[&broken, &working]).await?;

    // Both namespaces served while both are bound.
    let op = start(OPERATOR, &kubeconfig, [&broken, &working]).await?;
    create_from_json::<PodSet>(&broken, kinds::podset("before", 1)).await?;
    create_from_json::<PodSet>(&working, kinds::podset("before", 1)).await?;
    for ns in [&broken, &working] {
        wait_podset_ready(ns, "before")
            .await
            .with_context(|| format!("operator log:\n{}", op.log()))?;
    }
    drop(op);

    // The broken namespace loses its RoleBinding; the operator restarts.
    broken
        .api::<RoleBinding>()
        .delete(OPERATOR, &DeleteParams::default())
        .await?;
    // RBAC takes effect at once for new requests; a restart re-lists everything.
    let op = start(OPERATOR, &kubeconfig, [&broken, &working]).await?;

    // Ready (start waited for /readyz 200) once the failure is known: the log names the
    // failing namespace, and /readyz, which anyone reaching the pod may ask, says `ok`
    // and nothing about namespaces or API errors.
    poll("a log line naming the failing namespace", TIMEOUT, || {
        let log = op.log();
        let broken_name = broken.name.clone();
        async move {
            Ok(log
                .lines()
                .any(|l| l.contains("watch failing") && l.contains(&broken_name))
                .then_some(()))
        }
    })
    .await
    .with_context(|| format!("operator log:\n{}", op.log()))?;
    let (code, body) = http_get(op.health_port, "/readyz")?;
    ensure!(code == 200, "/readyz answered {code}: {body}");
    ensure!(body.trim() == "ok", "/readyz says more than ok: {body}");
    for secret in [&broken.name, &working.name] {
        ensure!(
            !body.contains(secret.as_str()),
            "/readyz names {secret}: {body}"
        );
    }

    // A PodSet in the broken namespace, created before the working namespace's changes:
    // by the time those converged, it would have been reconciled if it could be.
    create_from_json::<PodSet>(&broken, kinds::podset("unseen", 1)).await?;

    // The working namespace converges: a new PodSet, and a scale of the old one.
    create_from_json::<PodSet>(&working, kinds::podset("after", 2)).await?;
    wait_podset_ready(&working, "after")
        .await
        .with_context(|| format!("operator log:\n{}", op.log()))?;
    kubectl_scale(&working, "podset", "before", 3)?;
    wait_podset_replicas_ready(&working, "before", 3, TIMEOUT)
        .await
        .with_context(|| format!("operator log:\n{}", op.log()))?;

    // The failure is logged, naming the namespace.
    let log = op.log();
    ensure!(
        log.lines()
            .any(|l| l.contains("watch failing") && l.contains(&broken.name)),
        "no warning naming {} in the operator log:\n{log}",
        broken.name
    );

    // Nothing happened in the broken namespace: the PodSet created there got no pods and
    // no status (the operator cannot see it).
    let after = working.api::<PodSet>().get("after").await?;
    ensure!(
        after.status.is_some(),
        "the working namespace's PodSet has no status"
    );
    let unseen = broken.api::<PodSet>().get("unseen").await?;
    ensure!(
        unseen.status.is_none(),
        "a PodSet in the namespace the operator cannot read was reconciled: {:?}",
        unseen.status
    );
    let pods = broken
        .api::<Pod>()
        .list(&kube::api::ListParams::default().labels("app=unseen"))
        .await?;
    ensure!(
        pods.items.is_empty(),
        "pods were created for the unseen PodSet"
    );
    Ok(())
}

/// Defect 11: a watched namespace deleted in namespaced mode, with a Memcached (and its
/// finalizer) in it. The namespace's Role and RoleBinding go in the same sweep as the
/// Memcached, yet the namespace must not stay Terminating, and the operator keeps
/// serving the other namespace.
#[tokio::test]
async fn a_watched_namespace_deleted_in_namespaced_mode_goes_away() -> Result<()> {
    const MEMCACHED: &str = "memcached-operator";
    install(MEMCACHED)?;
    let doomed = TestNamespace::restricted("nsdel-doomed").await?;
    let kept = TestNamespace::restricted("nsdel-kept").await?;
    let (kubeconfig, _grants) = scoped_identity(MEMCACHED, &kept, &[&doomed, &kept]).await?;
    let mut op = start(MEMCACHED, &kubeconfig, [&doomed, &kept]).await?;
    create_from_json::<Memcached>(&doomed, kinds::memcached("cache", 1)).await?;
    let mc = wait_memcached_ready(&doomed, "cache")
        .await
        .with_context(|| format!("operator log:\n{}", op.log()))?;
    ensure!(
        !mc.finalizers().is_empty(),
        "the Memcached carries the finalizer"
    );

    kubectl_ok(["delete", "namespace", &doomed.name, "--wait=false"])?;
    let namespaces: Api<Namespace> = Api::all(kept.client.clone());
    poll("the deleted namespace gone", TIMEOUT, || async {
        Ok(namespaces
            .get_opt(&doomed.name)
            .await?
            .is_none()
            .then_some(()))
    })
    .await
    .with_context(|| format!("operator log:\n{}", op.log()))?;

    create_from_json::<Memcached>(&kept, kinds::memcached("cache", 1)).await?;
    wait_memcached_ready(&kept, "cache")
        .await
        .with_context(|| format!("operator log:\n{}", op.log()))?;
    ensure!(op.is_running(), "the operator exited:\n{}", op.log());
    Ok(())
}
