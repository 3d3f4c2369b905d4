//! `deploy/<operator>` installs the way a user installs it, and what it installs is
//! enough and no more: a server-side dry run first, then the real server-side apply,
//! without a single warning; the operator, run with its ServiceAccount's token,
//! reconciles the tree's own sample; that identity cannot read Secrets nor touch kinds it
//! does not manage. The namespaced overlay: Roles in two namespaces only, and the
//! operator serves those two and leaves a third alone.

use anyhow::{Context, Result, bail, ensure};
use e2e::kinds::{self, free_node_port};
use e2e::manifests::{granted, kubectl_capture, kustomize, manifest_file, of_kind, write_json};
use e2e::operator::{OperatorOptions, OperatorProcess, install, service_account_kubeconfig_for};
use e2e::rbac::{grant_roles, operator_user};
use e2e::{
    TestNamespace, assert_never_reconciled, can_i, create_from_json, kubectl_ok, repo_root,
    wait_for,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::api::{Api, ListParams};
use lolcow_operator::api::Lolcow;
use memcached_operator::api::Memcached;
use podset_operator::api::PodSet;
use pulsar_consumer_operator::api::PulsarConsumer;
use serde_json::{Value, json};
use std::path::PathBuf;

fn tree(operator: &str) -> PathBuf {
    repo_root().join("deploy").join(operator)
}

/// `kubectl apply --server-side -k deploy/<operator>`, dry run first; both must succeed
/// without warnings. Server-side, as a field manager of its own: the harness's
/// `install()` (and maybe a person) applied the same tree before, so this also proves that
/// an unchanged tree applies without conflicts on top of another manager's apply (it did
/// not while the Deployment said `value: ""` and omitted fieldRef's apiVersion, which the
/// API server normalizes). A client-side apply would warn about the missing last-applied
/// annotation on those objects, which says nothing about the manifests.
fn apply_tree(operator: &str) -> Result<()> {
    let dir = tree(operator);
    let dir = dir.as_os_str();
    let common = [
        "apply".as_ref(),
        "--server-side".as_ref(),
        "--field-manager=e2e-deploy-test".as_ref(),
        "-k".as_ref(),
        dir,
    ];
    let mut dry_run: Vec<&std::ffi::OsStr> = common.to_vec();
    dry_run.push("--dry-run=server".as_ref());
    kubectl_capture(&dry_run)?.clean(&format!("the server-side dry run of deploy/{operator}"))?;
    let out = kubectl_capture(common)?;
    out.clean(&format!("kubectl apply -k deploy/{operator}"))?;
    Ok(())
}

/// The tree installs into `<operator>-system`, a namespace that enforces the restricted
/// Pod Security Standard, and the operator's own Deployment is admitted there.
async fn assert_installed(ns: &TestNamespace, operator: &str) -> Result<()> {
    let system = format!("{operator}-system");
    for object in kustomize(&tree(operator))? {
        let kind = object["kind"].as_str().unwrap_or_default();
        let namespace = object["metadata"]["namespace"].as_str();
        match kind {
            "Namespace" | "CustomResourceDefinition" | "ClusterRole" | "ClusterRoleBinding" => {
                ensure!(namespace.is_none(), "{kind} with a namespace");
            }
            _ => ensure!(
                namespace == Some(system.as_str()),
                "{kind} {} lands in {namespace:?}, not {system}",
                object["metadata"]["name"]
            ),
        }
    }
    let namespace = Api::<Namespace>::all(ns.client.clone())
        .get(&system)
        .await?;
    let labels = namespace.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("restricted"),
        "{system} must enforce the restricted Pod Security Standard: {labels:?}"
    );
    // Its pod was admitted by that namespace (kwok plays the kubelet: it becomes ready).
    let deployments: Api<Deployment> = Api::namespaced(ns.client.clone(), &system);
    wait_for(&deployments, operator, |d: Option<&Deployment>| {
        d.and_then(|d| d.status.as_ref())
            .is_some_and(|s| s.ready_replicas.unwrap_or(0) >= 1)
    })
    .await?;
    Ok(())
}

/// The operator's ServiceAccount cannot read Secrets, nor write kinds it does not manage,
/// nor change the cluster.
fn assert_least_privilege(ns: &TestNamespace, operator: &str, not_managed: &[&str]) -> Result<()> {
    let sa = operator_user(operator);
    for verb in ["get", "list", "watch"] {
        for scope in [
            vec!["-n", ns.name.as_str()],
            vec!["-n", "kube-system"],
            vec!["--all-namespaces"],
        ] {
            let mut args = vec![verb, "secrets"];
            args.extend(scope.iter().copied());
            ensure!(!can_i(&sa, &args)?, "{operator} may {args:?}");
        }
    }
    for kind in not_managed {
        for verb in ["create", "delete", "patch"] {
            ensure!(
                !can_i(&sa, &[verb, kind, "-n", &ns.name])?,
                "{operator} may {verb} {kind}"
            );
        }
    }
    for (verb, kind) in [
        ("delete", "namespaces"),
        ("create", "namespaces"),
        ("create", "clusterroles"),
        ("create", "clusterrolebindings"),
    ] {
        ensure!(!can_i(&sa, &[verb, kind])?, "{operator} may {verb} {kind}");
    }
    Ok(())
}

/// Applies the tree's samples (every `samples/*.yaml` but the kustomization) into the test
/// namespace; the Lolcow's NodePort moves to a free one (the sample's 30080 may be taken).
async fn apply_samples(ns: &TestNamespace, operator: &str) -> Result<Vec<Value>> {
    let mut applied = Vec::new();
    let samples = tree(operator).join("samples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&samples)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml")
                && p.file_name().is_some_and(|n| n != "kustomization.yaml")
        })
        .collect();
    files.sort();
    ensure!(!files.is_empty(), "no samples in {}", samples.display());
    for file in files {
        for mut object in manifest_file(&file)? {
            let path = if object["kind"] == "Lolcow" {
                object["spec"]["port"] = json!(free_node_port(ns, "sample", &[]).await?);
                // `kubectl create --dry-run=client` filled in its current namespace.
                if let Some(meta) = object["metadata"].as_object_mut() {
                    meta.remove("namespace");
                }
                write_json(&format!("{}-sample", ns.name), &object)?
            } else {
                file.clone()
            };
            kubectl_ok([
                "apply".as_ref(),
                "-n".as_ref(),
                ns.name.as_ref(),
                "-f".as_ref(),
                path.as_os_str(),
            ])?;
            applied.push(object);
        }
    }
    Ok(applied)
}

/// Waits until the sample object reports its Ready-ish condition.
async fn wait_sample_ready(ns: &TestNamespace, object: &Value) -> Result<()> {
    let name = object["metadata"]["name"]
        .as_str()
        .context("a sample without a name")?;
    match object["kind"].as_str().unwrap_or_default() {
        "PodSet" => kinds::wait_podset_ready(ns, name).await.map(drop),
        "Memcached" => kinds::wait_memcached_ready(ns, name).await.map(drop),
        "Lolcow" => kinds::wait_lolcow_ready(ns, name).await.map(drop),
        "PulsarConsumer" => kinds::wait_pulsar_consumer_ready(ns, name).await.map(drop),
        other => bail!("a sample of an unexpected kind {other}"),
    }
}

async fn install_and_run_sample(operator: &str, not_managed: &[&str]) -> Result<()> {
    let ns = TestNamespace::restricted(&format!("deploy-{}", &operator[..6])).await?;
    // The operator runs as a local process below; the tree's own Deployment is
    // admitted and simulated (`real_node.rs` runs it from its image).
    e2e::place_namespace(&format!("{operator}-system"), true)?;
    apply_tree(operator)?;
    assert_installed(&ns, operator).await?;
    let op = OperatorProcess::start(operator, &[&ns.name]).await?;
    for sample in apply_samples(&ns, operator).await? {
        wait_sample_ready(&ns, &sample)
            .await
            .with_context(|| format!("operator log:\n{}", op.log()))?;
    }
    assert_least_privilege(&ns, operator, not_managed)?;
    // Memcached's finalizer needs its operator: delete the objects while it runs, so that
    // the namespace can go away after the test.
    kubectl_ok([
        "delete",
        "memcacheds",
        "--all",
        "-n",
        &ns.name,
        "--wait=true",
    ])
    .ok();
    Ok(())
}

#[tokio::test]
async fn deploy_podset_operator_installs_cleanly_and_runs_its_sample() -> Result<()> {
    install_and_run_sample(
        "podset-operator",
        &["deployments", "services", "replicasets", "configmaps"],
    )
    .await
}

#[tokio::test]
async fn deploy_memcached_operator_installs_cleanly_and_runs_its_sample() -> Result<()> {
    install_and_run_sample(
        "memcached-operator",
        &["pods", "replicasets", "configmaps", "statefulsets"],
    )
    .await
}

#[tokio::test]
async fn deploy_lolcow_operator_installs_cleanly_and_runs_its_sample() -> Result<()> {
    install_and_run_sample("lolcow-operator", &["pods", "replicasets", "configmaps"]).await
}

#[tokio::test]
async fn deploy_pulsar_consumer_operator_installs_cleanly_and_runs_its_sample() -> Result<()> {
    install_and_run_sample(
        "pulsar-consumer-operator",
        &["pods", "services", "replicasets", "configmaps"],
    )
    .await
}

/// The namespaced overlay as built by kustomize: no cluster-wide RBAC at all, a Role (with
/// exactly the ClusterRole's rules) and RoleBinding in every namespace of WATCH_NAMESPACE,
/// and nowhere else. Returns the Role's rules.
fn check_overlay(operator: &str) -> Result<Value> {
    let objects = kustomize(&tree(operator).join("namespaced"))?;
    // The one exception: secure /metrics needs TokenReviews and SubjectAccessReviews,
    // which are cluster-scoped, so a ClusterRole grants them (and nothing else); the
    // metrics-reader ClusterRole names a URL, no object.
    // Memcached, the one kind with a finalizer, also keeps get, list, watch and patch of
    // Memcacheds (and patch of their status) cluster-wide: a deleted watched namespace
    // loses its Role in the same sweep that deletes its Memcacheds, and the finalizer must
    // still come off, even when the operator was down meanwhile.
    let metrics_roles = [
        format!("{operator}-metrics-auth-role"),
        format!("{operator}-metrics-reader"),
        format!("{operator}-finalizer"),
    ];
    for kind in [
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
    ] {
        let others: Vec<&Value> = of_kind(&objects, kind)
            .into_iter()
            .filter(|o| {
                let role = match kind {
                    "ClusterRoleBinding" => &o["roleRef"]["name"],
                    _ => &o["metadata"]["name"],
                };
                kind == "CustomResourceDefinition"
                    || !metrics_roles
                        .iter()
                        .any(|r| role.as_str() == Some(r.as_str()))
            })
            .collect();
        ensure!(
            others.is_empty(),
            "the namespaced overlay of {operator} has a {kind}: {others:?}"
        );
    }
    for role in of_kind(&objects, "ClusterRole") {
        for (resource, verb) in granted(role) {
            let metrics_auth = verb == "create"
                && matches!(
                    resource.as_str(),
                    "tokenreviews.authentication.k8s.io"
                        | "subjectaccessreviews.authorization.k8s.io"
                );
            let finalizer = operator == "memcached-operator"
                && matches!(
                    (resource.as_str(), verb.as_str()),
                    (
                        "memcacheds.cache.example.com",
                        "get" | "list" | "watch" | "patch"
                    ) | ("memcacheds.cache.example.com/status", "patch")
                );
            ensure!(
                metrics_auth || finalizer,
                "the namespaced overlay of {operator} grants {verb} {resource} cluster-wide"
            );
        }
    }
    let deployment = of_kind(&objects, "Deployment")
        .first()
        .copied()
        .context("the overlay has no Deployment")?
        .clone();
    let watch: Vec<String> = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "WATCH_NAMESPACE")
        .and_then(|e| e["value"].as_str())
        .context("the overlay's Deployment sets no WATCH_NAMESPACE")?
        .split(',')
        .map(str::to_owned)
        .collect();
    ensure!(!watch.is_empty() && !watch[0].is_empty(), "{watch:?}");
    let cluster_role = manifest_file(&tree(operator).join("cluster-rbac/cluster-role.yaml"))?
        .into_iter()
        .find(|o| o["kind"] == "ClusterRole")
        .context("no ClusterRole")?;
    let operator_roles: Vec<&Value> = of_kind(&objects, "Role")
        .into_iter()
        .filter(|r| r["metadata"]["name"] == operator)
        .collect();
    let mut role_namespaces: Vec<String> = operator_roles
        .iter()
        .filter_map(|r| r["metadata"]["namespace"].as_str().map(str::to_owned))
        .collect();
    role_namespaces.sort();
    let mut sorted_watch = watch.clone();
    sorted_watch.sort();
    assert_eq!(
        role_namespaces, sorted_watch,
        "{operator}: Roles exactly in the watched namespaces"
    );
    for role in &operator_roles {
        assert_eq!(
            granted(role),
            granted(&cluster_role),
            "{operator}: the Role in {} grants what the ClusterRole grants",
            role["metadata"]["namespace"]
        );
    }
    let bound: Vec<String> = of_kind(&objects, "RoleBinding")
        .into_iter()
        .filter(|b| b["roleRef"]["name"] == operator)
        .filter_map(|b| b["metadata"]["namespace"].as_str().map(str::to_owned))
        .collect();
    for namespace in &watch {
        ensure!(
            bound.contains(namespace),
            "{operator}: no RoleBinding in {namespace}"
        );
    }
    Ok(operator_roles[0]["rules"].clone())
}

/// A ServiceAccount of its own (in `a`) with the overlay's Role and RoleBinding in `a` and
/// `b` only, and a kubeconfig with its token.
async fn scoped_identity(
    operator: &str,
    rules: &Value,
    a: &TestNamespace,
    b: &TestNamespace,
) -> Result<(String, PathBuf)> {
    let sa_name = format!("{operator}-scoped");
    grant_roles(operator, &sa_name, rules, a, &[a, b]).await?;
    let user = format!("system:serviceaccount:{}:{sa_name}", a.name);
    Ok((user, service_account_kubeconfig_for(&a.name, &sa_name)?))
}

/// Where a `kubectl auth can-i` check of the overlay's identity asks.
#[derive(Clone, Copy, Debug)]
enum Scope {
    /// `--all-namespaces`.
    Everywhere,
    /// A namespace it watches (`b`).
    Watched,
    /// The namespace it does not watch (`c`).
    Unwatched,
}
use Scope::{Everywhere, Unwatched, Watched};

/// `kubectl auth can-i <verb> <resource>` in a scope, and the answer it must give.
struct CanI {
    allowed: bool,
    verb: &'static str,
    resource: &'static str,
    scope: Scope,
}

/// The identity may do it.
const fn may(verb: &'static str, resource: &'static str, scope: Scope) -> CanI {
    CanI {
        allowed: true,
        verb,
        resource,
        scope,
    }
}

/// The identity may not do it.
const fn may_not(verb: &'static str, resource: &'static str, scope: Scope) -> CanI {
    CanI {
        allowed: false,
        ..may(verb, resource, scope)
    }
}

/// What [`overlay_serves_two_namespaces_only`] leaves for a test's own checks: the
/// namespaces and the operator, still running (dropped in the order a test drops them).
struct Overlay {
    _op: OperatorProcess,
    c: TestNamespace,
    b: TestNamespace,
    a: TestNamespace,
}

/// The namespaced overlay of `operator` (kind `K`, children of kind `C`): its Role in two
/// namespaces `a` and `b` (`overlay-<short>-a`, ...) and nowhere else; with that identity
/// the `checks` hold, the operator makes `in-a` and `in-b` Ready (`wait_ready`) and never
/// reconciles `ignored` in the third namespace `c`. `manifest` makes the object of a name
/// and size in a namespace.
async fn overlay_serves_two_namespaces_only<K, C>(
    operator: &str,
    short: &str,
    checks: &[CanI],
    mut manifest: impl AsyncFnMut(&TestNamespace, &str, i64) -> Result<Value>,
    wait_ready: impl AsyncFn(&TestNamespace, &str) -> Result<K>,
) -> Result<Overlay>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize,
    <K as kube::Resource>::DynamicType: Default,
    C: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
    <C as kube::Resource>::DynamicType: Default,
{
    let rules = check_overlay(operator)?;
    install(operator)?;
    let a = TestNamespace::restricted(&format!("overlay-{short}-a")).await?;
    let b = TestNamespace::restricted(&format!("overlay-{short}-b")).await?;
    let c = TestNamespace::restricted(&format!("overlay-{short}-c")).await?;
    let (user, kubeconfig) = scoped_identity(operator, &rules, &a, &b).await?;
    // Nothing cluster-wide, nothing in c; what it needs in b.
    for check in checks {
        let mut args = vec![check.verb, check.resource];
        match check.scope {
            Everywhere => args.push("--all-namespaces"),
            Watched => args.extend(["-n", b.name.as_str()]),
            Unwatched => args.extend(["-n", c.name.as_str()]),
        }
        ensure!(
            can_i(&user, &args)? == check.allowed,
            "{user}: `kubectl auth can-i {}` must answer {}",
            args.join(" "),
            if check.allowed { "yes" } else { "no" }
        );
    }
    let op = OperatorProcess::start_with(
        operator,
        &[&a.name, &b.name],
        OperatorOptions {
            kubeconfig: Some(kubeconfig),
            ..OperatorOptions::default()
        },
    )
    .await?;
    for (ns, name, size) in [(&c, "ignored", 1), (&a, "in-a", 2), (&b, "in-b", 1)] {
        create_from_json::<K>(ns, manifest(ns, name, size).await?).await?;
    }
    for (ns, name) in [(&a, "in-a"), (&b, "in-b")] {
        wait_ready(ns, name)
            .await
            .with_context(|| format!("operator log:\n{}", op.log()))?;
    }
    assert_never_reconciled::<K, C>(&c, "ignored").await?;
    Ok(Overlay { _op: op, c, b, a })
}

#[tokio::test]
async fn deploy_namespaced_overlay_podset_serves_two_namespaces_only() -> Result<()> {
    overlay_serves_two_namespaces_only::<PodSet, Pod>(
        "podset-operator",
        "ps",
        &[
            may_not("list", "pods", Everywhere),
            may_not("list", "podsets", Unwatched),
            may("create", "pods", Watched),
        ],
        async |_, name, size| Ok(kinds::podset(name, size)),
        kinds::wait_podset_ready,
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn deploy_namespaced_overlay_memcached_serves_two_namespaces_only() -> Result<()> {
    let overlay = overlay_serves_two_namespaces_only::<Memcached, Deployment>(
        "memcached-operator",
        "mc",
        &[
            may_not("list", "deployments", Everywhere),
            may_not("list", "memcacheds", Unwatched),
            may("patch", "services", Watched),
        ],
        async |_, name, size| Ok(kinds::memcached(name, size)),
        kinds::wait_memcached_ready,
    )
    .await?;
    assert!(
        overlay
            .c
            .api::<Service>()
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );
    // The finalizer needs the operator: clean up while it runs.
    for (ns, name) in [(&overlay.a, "in-a"), (&overlay.b, "in-b")] {
        e2e::delete_and_wait(&ns.api::<Memcached>(), name).await?;
    }
    Ok(())
}

#[tokio::test]
async fn deploy_namespaced_overlay_lolcow_serves_two_namespaces_only() -> Result<()> {
    // Each on a NodePort no Service holds, none of them on another's.
    let mut ports = Vec::new();
    overlay_serves_two_namespaces_only::<Lolcow, Service>(
        "lolcow-operator",
        "lc",
        &[
            may_not("list", "services", Everywhere),
            may_not("list", "lolcows", Unwatched),
        ],
        async |ns, name, _| {
            let port = free_node_port(ns, name, &ports).await?;
            ports.push(port);
            // Greeted with its namespace's letter.
            let greeting = name.strip_prefix("in-").unwrap_or("c");
            Ok(kinds::lolcow(name, port, greeting))
        },
        kinds::wait_lolcow_ready,
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn deploy_namespaced_overlay_pulsar_consumer_serves_two_namespaces_only() -> Result<()> {
    overlay_serves_two_namespaces_only::<PulsarConsumer, Deployment>(
        "pulsar-consumer-operator",
        "pc",
        &[
            may_not("list", "deployments", Everywhere),
            may_not("list", "pulsarconsumers", Unwatched),
            may("patch", "deployments", Watched),
        ],
        async |_, name, size| Ok(kinds::pulsar_consumer(name, size)),
        kinds::wait_pulsar_consumer_ready,
    )
    .await?;
    Ok(())
}
