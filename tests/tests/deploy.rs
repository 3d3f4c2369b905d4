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
use e2e::rbac::operator_user;
use e2e::{TestNamespace, can_i, kubectl_ok, repo_root, wait_for};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams, PostParams};
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
        "PodSet" => {
            wait_for(&ns.api::<PodSet>(), name, |o: Option<&PodSet>| {
                o.is_some_and(kinds::podset_ready)
            })
            .await?;
        }
        "Memcached" => {
            wait_for(&ns.api::<Memcached>(), name, |o: Option<&Memcached>| {
                o.is_some_and(kinds::memcached_ready)
            })
            .await?;
        }
        "Lolcow" => {
            kinds::wait_lolcow_ready(ns, name).await?;
        }
        "PulsarConsumer" => {
            wait_for(
                &ns.api::<PulsarConsumer>(),
                name,
                |o: Option<&PulsarConsumer>| o.is_some_and(kinds::pulsar_consumer_ready),
            )
            .await?;
        }
        other => bail!("a sample of an unexpected kind {other}"),
    }
    Ok(())
}

async fn install_and_run_sample(operator: &str, not_managed: &[&str]) -> Result<()> {
    let ns = TestNamespace::restricted(&format!("deploy-{}", &operator[..6])).await?;
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
    for kind in [
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
    ] {
        ensure!(
            of_kind(&objects, kind).is_empty(),
            "the namespaced overlay of {operator} has a {kind}"
        );
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
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": sa_name}}))?;
    a.api::<ServiceAccount>()
        .create(&PostParams::default(), &sa)
        .await?;
    for ns in [a, b] {
        let role: Role = serde_json::from_value(json!({
            "metadata": {"name": operator},
            "rules": rules,
        }))?;
        ns.api::<Role>()
            .create(&PostParams::default(), &role)
            .await?;
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": operator},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": operator},
            "subjects": [{"kind": "ServiceAccount", "name": sa_name, "namespace": a.name}],
        }))?;
        ns.api::<RoleBinding>()
            .create(&PostParams::default(), &binding)
            .await?;
    }
    let user = format!("system:serviceaccount:{}:{sa_name}", a.name);
    Ok((user, service_account_kubeconfig_for(&a.name, &sa_name)?))
}

async fn create_value<K>(ns: &TestNamespace, manifest: Value) -> Result<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize,
    <K as kube::Resource>::DynamicType: Default,
{
    let obj: K = serde_json::from_value(manifest)?;
    Ok(ns.api::<K>().create(&PostParams::default(), &obj).await?)
}

#[tokio::test]
async fn deploy_namespaced_overlay_podset_serves_two_namespaces_only() -> Result<()> {
    let operator = "podset-operator";
    let rules = check_overlay(operator)?;
    install(operator)?;
    let a = TestNamespace::restricted("overlay-ps-a").await?;
    let b = TestNamespace::restricted("overlay-ps-b").await?;
    let c = TestNamespace::restricted("overlay-ps-c").await?;
    let (user, kubeconfig) = scoped_identity(operator, &rules, &a, &b).await?;
    // Nothing cluster-wide, nothing in c.
    ensure!(!can_i(&user, &["list", "pods", "--all-namespaces"])?);
    ensure!(!can_i(&user, &["list", "podsets", "-n", &c.name])?);
    ensure!(can_i(&user, &["create", "pods", "-n", &b.name])?);
    let op = OperatorProcess::start_with(
        operator,
        &[&a.name, &b.name],
        OperatorOptions {
            kubeconfig: Some(kubeconfig),
            ..OperatorOptions::default()
        },
    )
    .await?;
    create_value::<PodSet>(&c, kinds::podset("ignored", 1)).await?;
    create_value::<PodSet>(&a, kinds::podset("in-a", 2)).await?;
    create_value::<PodSet>(&b, kinds::podset("in-b", 1)).await?;
    for (ns, name) in [(&a, "in-a"), (&b, "in-b")] {
        wait_for(&ns.api::<PodSet>(), name, |o: Option<&PodSet>| {
            o.is_some_and(kinds::podset_ready)
        })
        .await
        .with_context(|| format!("operator log:\n{}", op.log()))?;
    }
    let ignored = c.api::<PodSet>().get("ignored").await?;
    assert!(ignored.status.is_none(), "{:?}", ignored.status);
    assert!(
        c.api::<Pod>()
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );
    Ok(())
}

#[tokio::test]
async fn deploy_namespaced_overlay_memcached_serves_two_namespaces_only() -> Result<()> {
    let operator = "memcached-operator";
    let rules = check_overlay(operator)?;
    install(operator)?;
    let a = TestNamespace::restricted("overlay-mc-a").await?;
    let b = TestNamespace::restricted("overlay-mc-b").await?;
    let c = TestNamespace::restricted("overlay-mc-c").await?;
    let (user, kubeconfig) = scoped_identity(operator, &rules, &a, &b).await?;
    ensure!(!can_i(&user, &["list", "deployments", "--all-namespaces"])?);
    ensure!(!can_i(&user, &["list", "memcacheds", "-n", &c.name])?);
    ensure!(can_i(&user, &["patch", "services", "-n", &b.name])?);
    let op = OperatorProcess::start_with(
        operator,
        &[&a.name, &b.name],
        OperatorOptions {
            kubeconfig: Some(kubeconfig),
            ..OperatorOptions::default()
        },
    )
    .await?;
    create_value::<Memcached>(&c, kinds::memcached("ignored", 1)).await?;
    create_value::<Memcached>(&a, kinds::memcached("in-a", 2)).await?;
    create_value::<Memcached>(&b, kinds::memcached("in-b", 1)).await?;
    for (ns, name) in [(&a, "in-a"), (&b, "in-b")] {
        wait_for(&ns.api::<Memcached>(), name, |o: Option<&Memcached>| {
            o.is_some_and(kinds::memcached_ready)
        })
        .await
        .with_context(|| format!("operator log:\n{}", op.log()))?;
    }
    let ignored = c.api::<Memcached>().get("ignored").await?;
    assert!(ignored.status.is_none(), "{:?}", ignored.status);
    assert!(ignored.metadata.finalizers.unwrap_or_default().is_empty());
    assert!(
        c.api::<Deployment>()
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );
    assert!(
        c.api::<Service>()
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );
    // The finalizer needs the operator: clean up while it runs.
    for (ns, name) in [(&a, "in-a"), (&b, "in-b")] {
        e2e::delete_and_wait(&ns.api::<Memcached>(), name).await?;
    }
    Ok(())
}

#[tokio::test]
async fn deploy_namespaced_overlay_lolcow_serves_two_namespaces_only() -> Result<()> {
    let operator = "lolcow-operator";
    let rules = check_overlay(operator)?;
    install(operator)?;
    let a = TestNamespace::restricted("overlay-lc-a").await?;
    let b = TestNamespace::restricted("overlay-lc-b").await?;
    let c = TestNamespace::restricted("overlay-lc-c").await?;
    let (user, kubeconfig) = scoped_identity(operator, &rules, &a, &b).await?;
    ensure!(!can_i(&user, &["list", "services", "--all-namespaces"])?);
    ensure!(!can_i(&user, &["list", "lolcows", "-n", &c.name])?);
    let op = OperatorProcess::start_with(
        operator,
        &[&a.name, &b.name],
        OperatorOptions {
            kubeconfig: Some(kubeconfig),
            ..OperatorOptions::default()
        },
    )
    .await?;
    let pc = free_node_port(&c, "ignored", &[]).await?;
    let pa = free_node_port(&a, "in-a", &[pc]).await?;
    let pb = free_node_port(&b, "in-b", &[pc, pa]).await?;
    create_value::<Lolcow>(&c, kinds::lolcow("ignored", pc, "c")).await?;
    create_value::<Lolcow>(&a, kinds::lolcow("in-a", pa, "a")).await?;
    create_value::<Lolcow>(&b, kinds::lolcow("in-b", pb, "b")).await?;
    for (ns, name) in [(&a, "in-a"), (&b, "in-b")] {
        kinds::wait_lolcow_ready(ns, name)
            .await
            .with_context(|| format!("operator log:\n{}", op.log()))?;
    }
    let ignored = c.api::<Lolcow>().get("ignored").await?;
    assert!(ignored.status.is_none(), "{:?}", ignored.status);
    assert!(
        c.api::<Service>()
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );
    Ok(())
}

#[tokio::test]
async fn deploy_namespaced_overlay_pulsar_consumer_serves_two_namespaces_only() -> Result<()> {
    let operator = "pulsar-consumer-operator";
    let rules = check_overlay(operator)?;
    install(operator)?;
    let a = TestNamespace::restricted("overlay-pc-a").await?;
    let b = TestNamespace::restricted("overlay-pc-b").await?;
    let c = TestNamespace::restricted("overlay-pc-c").await?;
    let (user, kubeconfig) = scoped_identity(operator, &rules, &a, &b).await?;
    ensure!(!can_i(&user, &["list", "deployments", "--all-namespaces"])?);
    ensure!(!can_i(&user, &["list", "pulsarconsumers", "-n", &c.name])?);
    ensure!(can_i(&user, &["patch", "deployments", "-n", &b.name])?);
    let op = OperatorProcess::start_with(
        operator,
        &[&a.name, &b.name],
        OperatorOptions {
            kubeconfig: Some(kubeconfig),
            ..OperatorOptions::default()
        },
    )
    .await?;
    create_value::<PulsarConsumer>(&c, kinds::pulsar_consumer("ignored", 1)).await?;
    create_value::<PulsarConsumer>(&a, kinds::pulsar_consumer("in-a", 2)).await?;
    create_value::<PulsarConsumer>(&b, kinds::pulsar_consumer("in-b", 1)).await?;
    for (ns, name) in [(&a, "in-a"), (&b, "in-b")] {
        wait_for(
            &ns.api::<PulsarConsumer>(),
            name,
            |o: Option<&PulsarConsumer>| o.is_some_and(kinds::pulsar_consumer_ready),
        )
        .await
        .with_context(|| format!("operator log:\n{}", op.log()))?;
    }
    let ignored = c.api::<PulsarConsumer>().get("ignored").await?;
    assert!(ignored.status.is_none(), "{:?}", ignored.status);
    assert!(
        c.api::<Deployment>()
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );
    Ok(())
}
