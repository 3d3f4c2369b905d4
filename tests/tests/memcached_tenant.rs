//! What a Memcached tenant relies on, on the real cluster (issue 26, items 3 and 4):
//!
//! - a Memcached on a port other than 11211 really serves there: memcached is started on
//!   `spec.containerPort`, its readiness probe checks that port, and a memcached client
//!   stores and reads a value through the Service (on the real node: the pods run);
//! - the namespace-scoped install never strands a namespace: with the operator down, a
//!   watched namespace holding a Memcached is deleted (its Role goes first, the Memcached
//!   keeps the finalizer); once the operator starts again the namespace is gone within a
//!   minute, with no open watch to win a race.

use anyhow::{Context, Result, bail, ensure};
use e2e::kinds::{self, memcached_ready, wait_memcached_ready};
use e2e::manifests::{kustomize, of_kind};
use e2e::operator::{OperatorOptions, OperatorProcess, install, service_account_kubeconfig_for};
use e2e::rbac::grant_roles;
use e2e::{
    TIMEOUT, TestNamespace, create_from_json, kubectl_ok, poll, repo_root, unique_suffix,
    wait_for_within,
};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use memcached_operator::{FINALIZER, api::Memcached};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const OPERATOR: &str = "memcached-operator";

// ---- Item 3: a non-default port serves through the Service (real node) ----

/// The node that runs containers (`cargo xtask cluster up` starts it when run as root).
const REAL_NODE: &str = "real-node";

/// How long one exchange with memcached may take (connect, write, read).
const EXCHANGE: Duration = Duration::from_secs(3);

/// Sends `request` to `addr` and reads until the answer ends with one of `ends`, all
/// within [`EXCHANGE`].
async fn exchange(addr: &str, request: &[u8], ends: &[&str]) -> Result<String> {
    tokio::time::timeout(EXCHANGE, async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(request).await?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 512];
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                bail!("{addr} closed the connection after {answer:?}");
            }
            answer.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&answer);
            if ends.iter().any(|e| text.ends_with(e)) {
                return Ok(text.into_owned());
            }
            ensure!(answer.len() < 4096, "an answer too long: {text:?}");
        }
    })
    .await
    .with_context(|| format!("{addr} did not answer within {EXCHANGE:?}"))?
}

/// Stores `value` under `key` in the memcached at `addr` and reads it back (the text
/// protocol: `set`, then `get`); returns the value read.
async fn set_and_get(addr: &str, key: &str, value: &str) -> Result<String> {
    let set = format!("set {key} 0 300 {}\r\n{value}\r\n", value.len());
    let stored = exchange(addr, set.as_bytes(), &["\r\n"]).await?;
    ensure!(stored == "STORED\r\n", "set answered {stored:?}");
    let got = exchange(addr, format!("get {key}\r\n").as_bytes(), &["END\r\n"]).await?;
    let mut lines = got.split("\r\n");
    let header = lines.next().unwrap_or_default();
    ensure!(
        header == format!("VALUE {key} 0 {}", value.len()),
        "get answered {got:?}"
    );
    Ok(lines.next().unwrap_or_default().to_owned())
}

#[tokio::test]
async fn memcached_on_a_non_default_port_stores_and_reads_through_its_service() -> Result<()> {
    const TEST: &str = "memcached_on_a_non_default_port_stores_and_reads_through_its_service";
    const PORT: i32 = 11311;
    let client = e2e::admin_client().await?;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    if nodes.get_opt(REAL_NODE).await?.is_none() {
        return e2e::skip(
            TEST,
            "needs the local cluster's real node, which `cargo xtask cluster up` starts when run as root",
        );
    }
    let ns = TestNamespace::real("mc-port").await?;
    let op = OperatorProcess::start(OPERATOR, &[&ns.name]).await?;
    let mut manifest = kinds::memcached("cache", 1);
    manifest["spec"]["containerPort"] = json!(PORT);
    create_from_json::<Memcached>(&ns, manifest).await?;
    // Available and Ready follow the pods' readiness, which is memcached accepting
    // connections on PORT (the first pull of the image may take a while).
    wait_for_within(
        &ns.api::<Memcached>(),
        "cache",
        Duration::from_secs(180),
        |mc: Option<&Memcached>| mc.is_some_and(memcached_ready),
    )
    .await
    .with_context(|| format!("operator log:\n{}", op.log()))?;

    let svc = ns.api::<Service>().get("cache").await?;
    let spec = svc.spec.context("the Service has no spec")?;
    ensure!(
        spec.cluster_ip.as_deref() == Some("None"),
        "a headless Service: {:?}",
        spec.cluster_ip
    );
    let ports: Vec<i32> = spec.ports.iter().flatten().map(|p| p.port).collect();
    ensure!(ports == [PORT], "the Service's ports: {ports:?}");

    // A client on this machine, as one in a pod: the Service's name from the cluster's
    // DNS server, then PORT at the address it gives.
    let client = e2e::admin_client().await?;
    let (server, name) = (
        e2e::dns::cluster_server(&client).await?,
        e2e::dns::service_name("cache", &ns.name),
    );
    let ip = poll("the Service's name resolving", TIMEOUT, || async {
        Ok(e2e::dns::resolve_a(server, &name).await?.first().copied())
    })
    .await?;
    let key = format!("tenant-{}", unique_suffix());
    let value = format!("stored through {PORT}");
    let addr = format!("{ip}:{PORT}");
    let started = Instant::now();
    let read = poll(
        "a value stored and read through the Service",
        TIMEOUT,
        || async { Ok(set_and_get(&addr, &key, &value).await.ok()) },
    )
    .await?;
    ensure!(read == value, "read back {read:?}, stored {value:?}");
    eprintln!(
        "memcached on {addr}: set and get of {key} in {:?}",
        started.elapsed()
    );

    // The pod listens on PORT and on nothing else: 11211, where memcached listened
    // whatever the spec said before `-p`, refuses.
    let pods = ns
        .api::<Pod>()
        .list(&ListParams::default().labels("app.kubernetes.io/instance=cache"))
        .await?;
    let pod = pods
        .items
        .iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
        .context("no memcached pod")?;
    let pod_ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .context("the pod has no IP")?;
    let version = exchange(&format!("{pod_ip}:{PORT}"), b"version\r\n", &["\r\n"]).await?;
    ensure!(version.starts_with("VERSION "), "{version:?}");
    match tokio::time::timeout(EXCHANGE, TcpStream::connect(format!("{pod_ip}:11211"))).await {
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
        other => bail!("{pod_ip}:11211 must refuse connections: {other:?}"),
    }
    Ok(())
}

// ---- Item 4: the namespaced install never strands a namespace ----

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

/// The identity of the namespaced overlay, for a ServiceAccount of its own in `home`: the
/// overlay's Role (and a RoleBinding) in each of `namespaces`, and the overlay's
/// `memcached-operator-finalizer` ClusterRole, copied under a name of the test's own and
/// bound cluster-wide, as the overlay binds it. Returns a kubeconfig with its token.
async fn overlay_identity(
    home: &TestNamespace,
    namespaces: &[&TestNamespace],
) -> Result<(PathBuf, ClusterGrants)> {
    let objects = kustomize(&repo_root().join("deploy").join(OPERATOR).join("namespaced"))?;
    let rules = of_kind(&objects, "Role")
        .into_iter()
        .find(|r| r["metadata"]["name"] == OPERATOR)
        .map(|r| r["rules"].clone())
        .context("the namespaced overlay has no Role named after the operator")?;
    let finalizer = of_kind(&objects, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == format!("{OPERATOR}-finalizer"))
        .context("the namespaced overlay has no finalizer ClusterRole")?;
    let sa_name = format!("{OPERATOR}-tenant");
    grant_roles(OPERATOR, &sa_name, &rules, home, namespaces).await?;
    let grants = ClusterGrants(home.name.clone());
    let name = format!("{}-{OPERATOR}-finalizer", home.name);
    let labels = json!({"e2e.rust-operators.dev/namespace": home.name});
    let doc = json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": name, "labels": labels},
                "rules": finalizer["rules"],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name, "labels": labels},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": sa_name, "namespace": home.name}],
            },
        ],
    });
    e2e::kubectl_runner().with_stdin(["apply", "-f", "-"], &doc.to_string())?;
    Ok((
        service_account_kubeconfig_for(&home.name, &sa_name)?,
        grants,
    ))
}

async fn start(kubeconfig: &Path, namespaces: [&TestNamespace; 2]) -> Result<OperatorProcess> {
    OperatorProcess::start_with(
        OPERATOR,
        &[&namespaces[0].name, &namespaces[1].name],
        OperatorOptions {
            kubeconfig: Some(kubeconfig.to_path_buf()),
            ..OperatorOptions::default()
        },
    )
    .await
}

fn has_finalizer(mc: &Memcached) -> bool {
    mc.finalizers().iter().any(|f| f == FINALIZER)
}

/// Waits until the namespace's deletion has done all it can without the operator: the
/// namespace is Terminating, the operator's Role and RoleBinding there are gone, and the
/// Memcached `name` is marked deleted but still held by the finalizer.
async fn wait_stranded(ns: &TestNamespace, name: &str) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(ns.client.clone());
    poll(
        "the namespace Terminating, its Role gone, the Memcached held",
        TIMEOUT,
        || async {
            let terminating = namespaces
                .get_opt(&ns.name)
                .await?
                .and_then(|n| n.status.and_then(|s| s.phase))
                .is_some_and(|p| p == "Terminating");
            let role_gone = ns.api::<Role>().get_opt(OPERATOR).await?.is_none()
                && ns.api::<RoleBinding>().get_opt(OPERATOR).await?.is_none();
            let held = ns
                .api::<Memcached>()
                .get_opt(name)
                .await?
                .is_some_and(|mc| mc.metadata.deletion_timestamp.is_some() && has_finalizer(&mc));
            Ok((terminating && role_gone && held).then_some(()))
        },
    )
    .await
}

#[tokio::test]
async fn a_watched_namespace_deleted_while_the_namespaced_operator_was_down_goes_away() -> Result<()>
{
    install(OPERATOR)?;
    let doomed = TestNamespace::restricted("mcdown-doomed").await?;
    let kept = TestNamespace::restricted("mcdown-kept").await?;
    let (kubeconfig, _grants) = overlay_identity(&kept, &[&doomed, &kept]).await?;

    let mut op = start(&kubeconfig, [&doomed, &kept]).await?;
    for ns in [&doomed, &kept] {
        create_from_json::<Memcached>(ns, kinds::memcached("cache", 1)).await?;
    }
    for ns in [&doomed, &kept] {
        let mc = wait_memcached_ready(ns, "cache")
            .await
            .with_context(|| format!("operator log:\n{}", op.log()))?;
        ensure!(has_finalizer(&mc), "the Memcached carries the finalizer");
    }

    // The operator is down (killed: no graceful anything) while the namespace is deleted.
    op.kill();
    kubectl_ok(["delete", "namespace", &doomed.name, "--wait=false"])?;
    wait_stranded(&doomed, "cache").await?;

    // Started again, it cannot watch the namespace's Deployments, Services or pods any
    // more (403), yet the namespace goes.
    let started = Instant::now();
    let op = start(&kubeconfig, [&doomed, &kept]).await?;
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
    eprintln!(
        "the namespace deleted while the operator was down went {:?} after the operator started",
        started.elapsed()
    );
    let log = op.log();
    ensure!(
        log.lines()
            .any(|l| l.contains("finalizer removed") && l.contains(&doomed.name)),
        "no log line of the finalizer released in {}:\n{log}",
        doomed.name
    );

    // The namespace it can reconcile is untouched, and still served.
    let mc = kept.api::<Memcached>().get("cache").await?;
    ensure!(
        has_finalizer(&mc) && mc.metadata.deletion_timestamp.is_none() && memcached_ready(&mc),
        "the kept namespace's Memcached: {mc:?}"
    );
    kubectl_ok(["scale", "memcached/cache", "--replicas=2", "-n", &kept.name])?;
    poll("the kept Memcached scaled to 2", TIMEOUT, || async {
        let mc = kept.api::<Memcached>().get("cache").await?;
        Ok(
            (mc.status.as_ref().is_some_and(|s| s.ready_replicas == 2) && memcached_ready(&mc))
                .then_some(()),
        )
    })
    .await
    .with_context(|| format!("operator log:\n{}", op.log()))?;
    // The finalizer still does its work there while the operator runs.
    e2e::delete_and_wait(&kept.api::<Memcached>(), "cache").await?;
    Ok(())
}

/// The same release without a namespace deletion, and only what is being deleted: with the
/// operator down, an admin removes its RoleBinding in a watched namespace and a tenant
/// deletes one of two Memcacheds there. Started again, the operator cannot reconcile that
/// namespace; the deleted Memcached goes, the other keeps its finalizer and its spec.
#[tokio::test]
async fn only_memcacheds_being_deleted_are_released_where_the_operator_lost_its_role() -> Result<()>
{
    install(OPERATOR)?;
    let cut = TestNamespace::restricted("mcrole-cut").await?;
    let kept = TestNamespace::restricted("mcrole-kept").await?;
    let (kubeconfig, _grants) = overlay_identity(&kept, &[&cut, &kept]).await?;
    let mut op = start(&kubeconfig, [&cut, &kept]).await?;
    for name in ["deleted", "stays"] {
        create_from_json::<Memcached>(&cut, kinds::memcached(name, 1)).await?;
    }
    for name in ["deleted", "stays"] {
        wait_memcached_ready(&cut, name)
            .await
            .with_context(|| format!("operator log:\n{}", op.log()))?;
    }
    op.kill();

    kubectl_ok(["delete", "rolebinding", OPERATOR, "-n", &cut.name])?;
    let api = cut.api::<Memcached>();
    api.delete("deleted", &kube::api::DeleteParams::default())
        .await?;
    let held = api.get("deleted").await?;
    ensure!(held.metadata.deletion_timestamp.is_some() && has_finalizer(&held));
    let before = api.get("stays").await?;

    let op = start(&kubeconfig, [&cut, &kept]).await?;
    poll("the deleted Memcached gone", TIMEOUT, || async {
        Ok(api.get_opt("deleted").await?.is_none().then_some(()))
    })
    .await
    .with_context(|| format!("operator log:\n{}", op.log()))?;
    let after = api.get("stays").await?;
    ensure!(
        has_finalizer(&after)
            && after.metadata.deletion_timestamp.is_none()
            && after.metadata.resource_version == before.metadata.resource_version,
        "the Memcached nobody deleted was changed: {after:?}"
    );
    Ok(())
}
