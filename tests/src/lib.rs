//! The end-to-end test harness: every test gets its own namespace on a real
//! Kubernetes API server and can run the operators as local processes with
//! their own ServiceAccounts' credentials.
//!
//! The cluster is the one named by `E2E_KUBECONFIG` (set by `cargo xtask
//! test`, or by hand to use any cluster); without it, the local cluster is
//! started on demand with `cargo xtask cluster up`.

pub mod delivery;
pub mod deployed;
pub mod dns;
pub mod events;
pub mod kinds;
pub mod manifests;
pub mod observability;
pub mod operator;
pub mod proxy;
pub mod pulsar;
pub mod rbac;
pub mod tools;

pub use delivery::check_all_received;
pub use events::{events_where, regards_uid, wait_events};
pub use operator::watching_one;

use anyhow::{Context, Result, anyhow, bail, ensure};
use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::wait::{Condition, await_condition};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use xtask::support::kubectl::Kubectl;

/// How long a test waits for something the cluster does.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The repository root.
pub fn repo_root() -> PathBuf {
    xtask::support::paths::repo_root()
}

/// The cargo target directory.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| repo_root().join("target"), PathBuf::from)
}

/// Where the binaries the tests run were built: `target/<E2E_PROFILE>/`, `debug`
/// unless `E2E_PROFILE` names another profile (`cargo xtask bench autoscale` uses
/// `release`).
pub fn binary_dir() -> PathBuf {
    let profile = std::env::var("E2E_PROFILE")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "debug".to_owned());
    target_dir().join(profile)
}

/// The admin kubeconfig of the cluster under test, starting the local
/// cluster when no cluster was named.
pub fn kubeconfig_path() -> Result<PathBuf> {
    static PATH: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(path) = std::env::var_os("E2E_KUBECONFIG").filter(|p| !p.is_empty()) {
            return Ok(PathBuf::from(path));
        }
        let out = xtask::support::cmd::cargo()
            .current_dir(repo_root())
            .args(["run", "--quiet", "-p", "xtask", "--", "cluster", "up"])
            .output()
            .map_err(|e| format!("could not run `cargo xtask cluster up`: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        stdout
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("export KUBECONFIG="))
            .map(PathBuf::from)
            .filter(|_| out.status.success())
            .ok_or_else(|| {
                format!(
                    "`cargo xtask cluster up` failed:\n{stdout}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// The kubectl to use: `E2E_KUBECTL`, else the one on PATH, with the cluster under
/// test's admin kubeconfig.
pub fn kubectl_runner() -> Kubectl {
    let program = std::env::var_os("E2E_KUBECTL")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "kubectl".into());
    let kubectl = Kubectl::new(program);
    match kubeconfig_path() {
        Ok(path) => kubectl.with_kubeconfig(path),
        Err(_) => kubectl,
    }
}

/// A [`kubectl_runner`] command, for what its methods do not cover.
pub fn kubectl() -> Command {
    kubectl_runner().command()
}

/// Records that `test` could not run here and why, for `cargo xtask test`
/// to report it as skipped (never as passed); the test then returns `Ok`.
pub fn skip(test: &str, why: &str) -> Result<()> {
    eprintln!("skipped: {test}: {why}");
    if let Some(path) = std::env::var_os("E2E_SKIPPED_FILE").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        std::io::Write::write_all(&mut file, format!("{test}: {why}\n").as_bytes())?;
    }
    Ok(())
}

/// Creates `namespace` if it is missing and decides where its pods go: to
/// the simulated nodes (`simulated`), or to the real node. Pods that already
/// exist stay where they are.
pub fn place_namespace(namespace: &str, simulated: bool) -> Result<()> {
    xtask::support::local_operator::place_namespace(&kubectl_runner(), namespace, simulated)
}

/// Runs kubectl with `args` and returns stdout, failing with its stderr.
pub fn kubectl_ok<I, S>(args: I) -> Result<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    kubectl_runner().output(args)
}

/// `kubectl auth can-i <args> --as=<user>`: whether `user` may do it.
pub fn can_i(user: &str, args: &[&str]) -> Result<bool> {
    let as_user = format!("--as={user}");
    let mut all = vec!["auth", "can-i"];
    all.extend(args);
    all.push(&as_user);
    let out = kubectl_runner()
        .capture(all)
        .context("running kubectl auth can-i")?;
    match out.stdout.trim() {
        "yes" => Ok(true),
        "no" => Ok(false),
        other => bail!(
            "kubectl auth can-i {args:?} answered {other:?}: {}",
            out.stderr.trim()
        ),
    }
}

/// A client from a kubeconfig file.
pub async fn client_from(kubeconfig: &Path) -> Result<Client> {
    xtask::support::kubeconfig::client_from(kubeconfig).await
}

/// The admin client of the cluster under test.
pub async fn admin_client() -> Result<Client> {
    client_from(&kubeconfig_path()?).await
}

/// A short random-enough suffix for names.
pub fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mixed =
        (nanos as u64 ^ (u64::from(std::process::id()) << 20)).wrapping_add(n * 0x9E37_79B9);
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..6)
        .map(|i| alphabet[((mixed >> (i * 5)) % 36) as usize] as char)
        .collect()
}

/// A namespace of one test; deleted (without waiting) when dropped.
pub struct TestNamespace {
    /// Its name, `e2e-<prefix>-<suffix>`.
    pub name: String,
    /// An admin client.
    pub client: Client,
}

const RESTRICTED: [(&str, &str); 2] = [
    ("pod-security.kubernetes.io/enforce", "restricted"),
    ("pod-security.kubernetes.io/warn", "restricted"),
];

impl TestNamespace {
    /// Creates a fresh namespace for one test; its pods go to the simulated
    /// nodes (scheduled and Running, nothing runs).
    pub async fn new(prefix: &str) -> Result<TestNamespace> {
        TestNamespace::create(prefix, &[], true).await
    }

    /// Creates a namespace that enforces the `restricted` Pod Security
    /// Standard; its pods go to the simulated nodes.
    pub async fn restricted(prefix: &str) -> Result<TestNamespace> {
        TestNamespace::create(prefix, &RESTRICTED, true).await
    }

    /// Creates a namespace that enforces the `restricted` Pod Security
    /// Standard and whose pods run for real on the local cluster's real node.
    pub async fn real(prefix: &str) -> Result<TestNamespace> {
        TestNamespace::create(prefix, &RESTRICTED, false).await
    }

    async fn create(
        prefix: &str,
        labels: &[(&str, &str)],
        simulated: bool,
    ) -> Result<TestNamespace> {
        let client = admin_client().await?;
        let name = format!("e2e-{prefix}-{}", unique_suffix());
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.clone());
        let mut all: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        all.insert("e2e.rust-operators.dev/test".into(), prefix.into());
        ns.metadata.labels = Some(all);
        if simulated {
            ns.metadata.annotations = Some(
                xtask::support::simulated::NAMESPACE_ANNOTATIONS
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            );
        }
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        // Pods need the namespace's default ServiceAccount.
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(client.clone(), &name);
        wait_for(&sas, "default", |sa: Option<&_>| sa.is_some()).await?;
        Ok(TestNamespace { name, client })
    }

    /// A namespaced API of this test's namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var_os("E2E_KEEP_NAMESPACES").is_some() {
            return;
        }
        // A test may have stopped its operator before its objects went: the
        // harness removes what would keep the namespace Terminating for ever
        // (Memcached's finalizer), as an admin cleaning up would.
        if let Ok(names) = kubectl_ok(["get", "memcacheds", "-n", &self.name, "-o", "name"]) {
            for object in names.lines().filter(|l| !l.is_empty()) {
                let _ = kubectl_ok([
                    "patch",
                    object,
                    "-n",
                    &self.name,
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ]);
            }
        }
        let _ = kubectl_runner().succeeds(["delete", "namespace", &self.name, "--wait=false"]);
    }
}

/// An API for a kind given by name, to send objects the typed API could not
/// express (invalid ones, or manifests exactly as users write them).
pub fn dynamic_api(
    ns: &TestNamespace,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<kube::core::DynamicObject> {
    let gvk = kube::core::GroupVersionKind::gvk(group, version, kind);
    let resource = kube::core::ApiResource::from_gvk_with_plural(&gvk, plural);
    Api::namespaced_with(ns.client.clone(), &ns.name, &resource)
}

/// Creating `manifest` must fail, with an API server message that names `field`.
pub async fn assert_create_rejected(
    api: &Api<kube::core::DynamicObject>,
    manifest: serde_json::Value,
    field: &str,
) -> Result<()> {
    let obj: kube::core::DynamicObject = serde_json::from_value(manifest.clone())?;
    let Err(err) = api.create(&PostParams::default(), &obj).await else {
        bail!("{manifest} must be rejected");
    };
    let message = err.to_string();
    if !message.contains(field) {
        bail!("the error for {manifest} must name {field}: {message}");
    }
    Ok(())
}

/// Waits until `condition` holds for the object `name` (None = absent).
pub async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    condition: impl Condition<K>,
) -> Result<Option<K>>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    wait_for_within(api, name, TIMEOUT, condition).await
}

/// Like [`wait_for`], with a deadline of its own.
pub async fn wait_for_within<K>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
    condition: impl Condition<K>,
) -> Result<Option<K>>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    match tokio::time::timeout(timeout, await_condition(api.clone(), name, condition)).await {
        Ok(result) => Ok(result?),
        Err(_) => {
            let now = api.get_opt(name).await.ok().flatten();
            bail!(
                "timed out after {timeout:?} waiting on {} {name}; it is now: {now:#?}",
                std::any::type_name::<K>()
            )
        }
    }
}

/// Polls `check` every 200 ms until it returns `Some`, or fails after `timeout`
/// with the last error. For conditions over several objects.
pub async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => last = "not yet".into(),
            Err(e) => last = format!("{e:#}"),
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what} (last: {last})");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes an object and waits until it is gone.
pub async fn delete_and_wait<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let _ = api.delete(name, &DeleteParams::default()).await?;
    wait_gone(api, name).await
}

/// Waits (up to [`TIMEOUT`]) until `name` is gone from `api`.
pub async fn wait_gone<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    wait_for(api, name, |o: Option<&K>| o.is_none()).await?;
    Ok(())
}

/// Waits until the object `name` exists and `ready` holds for it, and returns it.
pub async fn wait_until<K>(api: &Api<K>, name: &str, ready: impl Fn(&K) -> bool) -> Result<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default,
{
    wait_for(api, name, move |o: Option<&K>| o.is_some_and(&ready))
        .await?
        .with_context(|| format!("{} {name} vanished", K::kind(&K::DynamicType::default())))
}

/// Creates the object `manifest` (JSON, as a user writes it) in `ns` as a `K`.
pub async fn create_from_json<K>(ns: &TestNamespace, manifest: Value) -> Result<K>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned + Serialize,
    K::DynamicType: Default,
{
    create_as(&ns.client, &ns.name, manifest).await
}

/// Creates the object `manifest` (JSON) in namespace `ns` as a `K`, with `client` (a
/// tenant's, say); the error names the kind and the object.
pub async fn create_as<K>(client: &Client, ns: &str, manifest: Value) -> Result<K>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned + Serialize,
    K::DynamicType: Default,
{
    let obj: K = serde_json::from_value(manifest)?;
    let name = obj.name_any();
    Api::<K>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &obj)
        .await
        .with_context(|| {
            format!(
                "creating {} {ns}/{name}",
                K::kind(&K::DynamicType::default())
            )
        })
}

/// The controller owner reference of `obj`, if it has one.
pub fn controller_ref<K: Resource>(obj: &K) -> Option<&OwnerReference> {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// Whether the object with `uid` is the controller of `obj`.
pub fn controlled_by<K: Resource>(obj: &K, uid: &str) -> bool {
    controller_ref(obj).is_some_and(|r| r.uid == uid)
}

/// Every object of kind `K` in `ns`, in the order listed.
pub async fn list_all<K>(ns: &TestNamespace) -> Result<Vec<K>>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned,
    K::DynamicType: Default,
{
    Ok(ns.api::<K>().list(&ListParams::default()).await?.items)
}

/// `kubectl scale <resource>/<name> --replicas=<replicas>` in `ns`: through the scale
/// subresource, as users and autoscalers scale.
pub fn kubectl_scale(ns: &TestNamespace, resource: &str, name: &str, replicas: i32) -> Result<()> {
    kubectl_ok([
        "scale",
        &format!("{resource}/{name}"),
        &format!("--replicas={replicas}"),
        "-n",
        &ns.name,
    ])?;
    Ok(())
}

/// The object `name` of kind `K` in `ns`, a namespace its operator does not watch, was
/// never reconciled: it has no status and no finalizers, and the namespace holds no
/// object of the child kind `C` at all.
pub async fn assert_never_reconciled<K, C>(ns: &TestNamespace, name: &str) -> Result<()>
where
    K: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned + Serialize,
    K::DynamicType: Default,
    C: Resource<Scope = NamespaceResourceScope> + Clone + Debug + DeserializeOwned,
    C::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let what = format!("{kind} {name} in {} (not watched)", ns.name);
    let object = ns
        .api::<K>()
        .get(name)
        .await
        .with_context(|| format!("reading {what}"))?;
    let status = serde_json::to_value(&object)?
        .get("status")
        .cloned()
        .unwrap_or(Value::Null);
    ensure!(status.is_null(), "{what} has a status: {status}");
    let finalizers = object.finalizers();
    ensure!(
        finalizers.is_empty(),
        "{what} has finalizers: {finalizers:?}"
    );
    let children: Vec<String> = ns
        .api::<C>()
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing the children of {what}"))?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    ensure!(
        children.is_empty(),
        "{} next to {what}: {children:?}",
        C::kind(&C::DynamicType::default())
    );
    Ok(())
}

/// The pods of `ns` that the object with `uid` controls and that are not terminating.
pub async fn live_pods_controlled_by(ns: &TestNamespace, uid: &str) -> Result<Vec<Pod>> {
    let pods = ns.api::<Pod>().list(&ListParams::default()).await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.uid == uid && o.controller == Some(true))
        })
        .collect())
}

/// What a [`PodWatch`] has seen so far, pods by uid.
#[derive(Clone, Debug, Default)]
pub struct PodCensus {
    /// The pods alive now (seen, not terminating, not deleted).
    pub live: BTreeSet<String>,
    /// The most pods alive at once.
    pub max_live: usize,
    /// Every pod ever seen.
    pub ever: BTreeSet<String>,
}

/// Watches every pod of a namespace in the background, to catch what polling would miss
/// (more pods alive at once than wanted, pods created and deleted in between). Stops when
/// dropped.
pub struct PodWatch {
    census: Arc<Mutex<PodCensus>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodWatch {
    /// Starts watching the pods of `ns`.
    pub fn start(ns: &TestNamespace) -> PodWatch {
        let census = Arc::new(Mutex::new(PodCensus::default()));
        let seen = Arc::clone(&census);
        let stream = watcher(ns.api::<Pod>(), watcher::Config::default());
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(mut s) = seen.lock() else { return };
                match event {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                        let uid = p.metadata.uid.clone().unwrap_or_default();
                        s.ever.insert(uid.clone());
                        if p.metadata.deletion_timestamp.is_none() {
                            s.live.insert(uid);
                        } else {
                            s.live.remove(&uid);
                        }
                        s.max_live = s.max_live.max(s.live.len());
                    }
                    Ok(watcher::Event::Delete(p)) => {
                        s.live.remove(&p.metadata.uid.unwrap_or_default());
                    }
                    _ => {}
                }
            }
        });
        PodWatch { census, task }
    }

    /// Starts a new phase: from now on `max_live` counts from the pods alive now.
    ///
    /// # Errors
    /// When the watch task panicked.
    pub fn new_phase(&self) -> Result<()> {
        let mut c = self
            .census
            .lock()
            .map_err(|_| anyhow!("the pod watch panicked"))?;
        c.max_live = c.live.len();
        Ok(())
    }

    /// A copy of what it has seen so far.
    pub fn census(&self) -> Result<PodCensus> {
        self.census
            .lock()
            .map(|c| c.clone())
            .map_err(|_| anyhow!("the pod watch panicked"))
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A client that acts as the user `user`, bound to the built-in `edit` role in `ns` only
/// (the RoleBinding `edit-<user>`): a tenant, as a namespace editor is one.
pub async fn tenant_client(admin: &Client, ns: &TestNamespace, user: &str) -> Result<Client> {
    let binding: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(
        serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": format!("edit-{user}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }),
    )?;
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(admin.clone(), &ns.name)
        .create(&PostParams::default(), &binding)
        .await?;
    // `edit` reaches the four kinds through the installs' aggregated ClusterRoles, which the
    // controller manager folds in a moment after an operator is (re)deployed.
    let resources = xtask::support::operators::all_resources();
    poll(
        &format!("{user} may create every kind in {}", ns.name),
        Duration::from_secs(60),
        || async {
            for resource in resources.split(',') {
                if !can_i(user, &["create", resource, "-n", &ns.name])? {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig_path()?)?;
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    config.auth_info.impersonate = Some(user.to_owned());
    config.auth_info.impersonate_groups = Some(vec!["system:authenticated".to_owned()]);
    Ok(Client::try_from(config)?)
}
