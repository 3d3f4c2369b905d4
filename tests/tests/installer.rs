//! The single-file installers, `deploy/<operator>/install.yaml`, installed the way their
//! header says: `kubectl apply -f install.yaml`, on the local cluster's real node.
//!
//! The committed installers pull `ghcr.io/rust-operators/<image>:<version>`, which this
//! machine cannot reach; the test pushes the operator's image under the same tag to the
//! local cluster's registry and generates the installer for that registry (`cargo xtask
//! installers --registry 127.0.0.1:15000 --out-dir ...`). It first checks that the file
//! it applies is the committed one with only the registry changed, so what is tested is
//! what is shipped. Then the operator's pod must run its image on the real node, and the
//! tree's own sample (`deploy/<operator>/samples`) must converge; everything the
//! installer created is deleted afterwards (`kubectl delete -f`).
//!
//! Needs the real node (`cargo xtask cluster up` as root); without it the tests report
//! themselves skipped. The first run builds the release images (several minutes); then
//! each test takes well under a minute.

use anyhow::{Context, Result, ensure};
use e2e::deployed::{NO_REAL_NODE, REAL_NODE, REGISTRY, has_real_node, pods, xtask};
use e2e::kinds::{self, free_node_port};
use e2e::manifests::kustomize;
use e2e::{TestNamespace, create_from_json, kubectl_ok, kubectl_runner, repo_root, target_dir};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;
use xtask::support::operators::Kind;

/// The release version: the workspace's, which the images and installers carry.
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Where the committed installers pull from.
const DEFAULT_REGISTRY: &str = "ghcr.io/rust-operators";
/// Pulling the image from the local registry and starting it.
const ROLLOUT: Duration = Duration::from_secs(180);

/// The build machine's platform, for a one-platform image.
fn host_platform() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        "linux/arm64"
    } else {
        "linux/amd64"
    }
}

/// Builds the operator's image for this machine and pushes it as
/// `127.0.0.1:15000/<operator>:<version>`, one build at a time (the first builds every
/// image's binary in one release build; the others reuse it).
fn push_image(operator: &str) -> Result<()> {
    static BUILDING: Mutex<()> = Mutex::new(());
    let _one = BUILDING
        .lock()
        .map_err(|_| anyhow::anyhow!("image lock poisoned"))?;
    xtask(&[
        "image",
        operator,
        "--platform",
        host_platform(),
        "--push",
        REGISTRY,
    ])?;
    Ok(())
}

/// What an installer created, deleted when dropped: the sample objects first (while the
/// operator still runs, so a finalizer is honoured), then everything in the file.
struct Installed {
    kind: &'static Kind,
    file: PathBuf,
    sample_namespace: Option<String>,
}

impl Drop for Installed {
    fn drop(&mut self) {
        if let Some(ns) = &self.sample_namespace {
            let resource = format!("{}.{}", self.kind.plural, self.kind.group);
            let _ = kubectl_ok([
                "delete",
                &resource,
                "--all",
                "-n",
                ns,
                "--wait=true",
                "--timeout=60s",
            ]);
        }
        let file = self.file.to_string_lossy();
        if let Err(e) = kubectl_ok([
            "delete",
            "-f",
            &file,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
        ]) {
            eprintln!("kubectl delete -f {file}: {e:#}");
        }
    }
}

/// The installer for the local registry, after checking it is the committed one with
/// only the registry changed.
fn local_installer(operator: &str) -> Result<PathBuf> {
    let dir = target_dir()
        .join("e2e")
        .join(format!("installers-{}", e2e::unique_suffix()));
    let dir_arg = dir.to_string_lossy().into_owned();
    xtask(&[
        "installers",
        "--registry",
        REGISTRY,
        "--out-dir",
        &dir_arg,
        operator,
    ])?;
    let file = dir.join(format!("{operator}-install.yaml"));
    let generated = std::fs::read_to_string(&file)?;
    let committed = std::fs::read_to_string(
        repo_root()
            .join("deploy")
            .join(operator)
            .join("install.yaml"),
    )?;
    ensure!(
        committed.contains(&format!("image: {DEFAULT_REGISTRY}/{operator}:{VERSION}")),
        "deploy/{operator}/install.yaml does not pin {DEFAULT_REGISTRY}/{operator}:{VERSION}"
    );
    ensure!(
        committed.replace(DEFAULT_REGISTRY, REGISTRY) == generated,
        "the installer for {REGISTRY} differs from deploy/{operator}/install.yaml in more than \
         the registry (is the committed one stale? `cargo xtask installers --check`)"
    );
    Ok(file)
}

/// `kubectl apply -f <file>` as a user types it. Objects that an earlier test applied
/// server-side (the harness installs the trees) lack kubectl's last-applied annotation, a
/// warning kubectl prints and then patches them anyway: that one is allowed, no other.
fn apply_installer(file: &Path) -> Result<()> {
    let out = kubectl_runner().capture(["apply".as_ref(), "-f".as_ref(), file.as_os_str()])?;
    ensure!(
        out.success,
        "kubectl apply -f {} failed:\n{}",
        file.display(),
        out.stderr
    );
    let unexpected: Vec<&str> = out
        .warnings()
        .into_iter()
        .filter(|w| !w.contains("missing the kubectl.kubernetes.io/last-applied-configuration"))
        .collect();
    ensure!(
        unexpected.is_empty(),
        "kubectl apply -f printed warnings:\n{}",
        unexpected.join("\n")
    );
    Ok(())
}

/// The operator's pod runs the pinned image on the real node, ready.
async fn assert_operator_runs(client: &kube::Client, operator: &str) -> Result<()> {
    let system = format!("{operator}-system");
    kubectl_ok([
        "rollout",
        "status",
        &format!("deployment/{operator}"),
        "-n",
        &system,
        &format!("--timeout={}s", ROLLOUT.as_secs()),
    ])?;
    let image = format!("{REGISTRY}/{operator}:{VERSION}");
    let selector = format!("app.kubernetes.io/name={operator}");
    let running = e2e::poll(
        "the operator's pod ready on the real node",
        ROLLOUT,
        || async {
            let pods = pods(client, &system, &selector).await?;
            let ready = pods.iter().any(|pod| {
                let spec = pod.spec.as_ref();
                spec.and_then(|s| s.node_name.as_deref()) == Some(REAL_NODE)
                    && spec.is_some_and(|s| {
                        s.containers
                            .iter()
                            .any(|c| c.image.as_deref() == Some(&image))
                    })
                    && e2e::deployed::all_containers_ready(pod)
            });
            Ok(ready.then_some(()))
        },
    )
    .await;
    running.with_context(|| format!("{operator} from {image}"))
}

/// The tree's sample objects, in `ns` (a Lolcow's NodePort moved to a free one: the demo
/// uses the sample's).
async fn create_samples(ns: &TestNamespace, kind: &Kind) -> Result<Vec<String>> {
    let samples = kustomize(
        &repo_root()
            .join("deploy")
            .join(kind.operator)
            .join("samples"),
    )?;
    let mut names = Vec::new();
    for mut sample in samples {
        if sample["kind"] != kind.kind {
            continue;
        }
        // `kubectl create --dry-run` filled in the kubeconfig's namespace.
        if let Some(meta) = sample["metadata"].as_object_mut() {
            meta.remove("namespace");
        }
        if kind.kind == "Lolcow" {
            sample["spec"]["port"] = Value::from(free_node_port(ns, "installer", &[]).await?);
        }
        let name = sample["metadata"]["name"]
            .as_str()
            .context("a sample without a name")?
            .to_owned();
        create_dynamic(ns, kind, sample).await?;
        names.push(name);
    }
    ensure!(
        !names.is_empty(),
        "deploy/{}/samples has no {}",
        kind.operator,
        kind.kind
    );
    Ok(names)
}

async fn create_dynamic(ns: &TestNamespace, kind: &Kind, sample: Value) -> Result<()> {
    use lolcow_operator::api::Lolcow;
    use memcached_operator::api::Memcached;
    use podset_operator::api::PodSet;
    use pulsar_consumer_operator::api::PulsarConsumer;
    match kind.kind {
        "PodSet" => create_from_json::<PodSet>(ns, sample).await.map(|_| ()),
        "Memcached" => create_from_json::<Memcached>(ns, sample).await.map(|_| ()),
        "Lolcow" => create_from_json::<Lolcow>(ns, sample).await.map(|_| ()),
        _ => create_from_json::<PulsarConsumer>(ns, sample)
            .await
            .map(|_| ()),
    }
}

async fn wait_sample_ready(ns: &TestNamespace, kind: &Kind, name: &str) -> Result<()> {
    match kind.kind {
        "PodSet" => kinds::wait_podset_ready(ns, name).await.map(|_| ()),
        "Memcached" => kinds::wait_memcached_ready(ns, name).await.map(|_| ()),
        "Lolcow" => kinds::wait_lolcow_ready(ns, name).await.map(|_| ()),
        _ => kinds::wait_pulsar_consumer_ready(ns, name)
            .await
            .map(|_| ()),
    }
}

/// `kubectl apply -f` of the operator's installer on the real node: the operator runs its
/// pinned image there and the tree's samples converge (their own pods simulated: the
/// workload images are not the point here).
async fn installs_and_converges(kind: &'static Kind, test: &str) -> Result<()> {
    let client = e2e::admin_client().await?;
    if !has_real_node(&client).await? {
        return e2e::skip(test, NO_REAL_NODE);
    }
    let operator = kind.operator;
    let started = std::time::Instant::now();
    let step = |what: &str| eprintln!("{operator}: {what} after {:.1?}", started.elapsed());
    push_image(operator)?;
    step("image pushed");
    let file = local_installer(operator)?;
    // The harness's installs put `<operator>-system` on the simulated nodes: this one
    // runs for real.
    e2e::place_namespace(&format!("{operator}-system"), false)?;
    let mut installed = Installed {
        kind,
        file: file.clone(),
        sample_namespace: None,
    };
    apply_installer(&file)?;
    kubectl_ok([
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        &format!("crd/{}.{}", kind.plural, kind.group),
    ])?;
    step("applied");
    assert_operator_runs(&client, operator).await?;
    step("operator running");
    let ns = TestNamespace::new(&format!("installer-{}", kind.short)).await?;
    installed.sample_namespace = Some(ns.name.clone());
    for name in create_samples(&ns, kind).await? {
        wait_sample_ready(&ns, kind, &name)
            .await
            .with_context(|| format!("the sample {} {name} from {}", kind.kind, file.display()))?;
    }
    step("samples converged");
    drop(installed);
    step("deleted");
    // Nothing of the installer is left: its namespace and CRD are gone.
    ensure!(
        !kubectl_runner().succeeds(["get", "namespace", &format!("{operator}-system")])
            || kubectl_ok([
                "get",
                "namespace",
                &format!("{operator}-system"),
                "-o",
                "jsonpath={.status.phase}",
            ])? == "Terminating",
        "{operator}-system is still there after kubectl delete -f"
    );
    ensure!(
        !kubectl_runner().succeeds(["get", "crd", &format!("{}.{}", kind.plural, kind.group)]),
        "the CRD is still there after kubectl delete -f"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn podset_operator_installs_from_its_installer() -> Result<()> {
    installs_and_converges(
        &xtask::support::operators::PODSET,
        "podset_operator_installs_from_its_installer",
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn memcached_operator_installs_from_its_installer() -> Result<()> {
    installs_and_converges(
        &xtask::support::operators::MEMCACHED,
        "memcached_operator_installs_from_its_installer",
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn lolcow_operator_installs_from_its_installer() -> Result<()> {
    installs_and_converges(
        &xtask::support::operators::LOLCOW,
        "lolcow_operator_installs_from_its_installer",
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn pulsar_consumer_operator_installs_from_its_installer() -> Result<()> {
    installs_and_converges(
        &xtask::support::operators::PULSAR_CONSUMER,
        "pulsar_consumer_operator_installs_from_its_installer",
    )
    .await
}
