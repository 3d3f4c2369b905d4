//! What the bench's own watches see: the custom resources, the pods and the Deployments of
//! the bench namespaces, each event stamped with the bench's clock when it arrives.

use super::timing::seconds;
use anyhow::{Context, Result, ensure};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams, PostParams};
use kube::core::{ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xtask::{say, say_err};

/// How an implementation says that an object is Ready at its spec: its status, or (for
/// the Go originals that write no status worth reading) its children.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum StatusShape {
    /// The Rust operators: the `Ready` condition `True` and `observedGeneration` at least
    /// the object's generation.
    #[default]
    Conditions,
    /// The Go PodSet: `status.readyReplicas` (its pods Pending or Running) equal to
    /// `spec.replicas` (it has no `observedGeneration`).
    GoPodSet,
    /// The Go Memcached: the `Available` condition `True` with the message it writes once
    /// the Deployment has `spec.size` replicas (`... with <size> replicas ...`).
    GoMemcached,
    /// The Go Lolcow writes no status: Ready is read from its children, the Deployment and
    /// the Service it names after the object and controls (see [`Self::children_ready`]).
    GoLolcow,
    /// The Go PulsarConsumer's status is a copy of its spec, written when it has created
    /// or updated the Deployment, whatever the pods do: Ready is read from the Deployment
    /// it controls, `<name>-deployment` (see [`Self::children_ready`]).
    GoPulsarConsumer,
}

impl StatusShape {
    /// Whether Ready is read from the object's children rather than its status.
    pub(super) fn reads_children(self) -> bool {
        matches!(self, StatusShape::GoLolcow | StatusShape::GoPulsarConsumer)
    }

    /// What Ready means for this shape, for the record (`readiness`).
    pub(super) fn describe(self) -> &'static str {
        match self {
            StatusShape::Conditions => {
                "the object's status: the Ready condition True with observedGeneration at least \
                 its generation"
            }
            StatusShape::GoPodSet => {
                "the object's status: status.readyReplicas (its pods Pending or Running) equal \
                 to spec.replicas (it writes no observedGeneration)"
            }
            StatusShape::GoMemcached => {
                "the object's status: the Available condition True with the message it writes \
                 once the Deployment has spec.size replicas"
            }
            StatusShape::GoLolcow => {
                "its children, not its status (the Go Lolcow writes none), as the bench's \
                 watches see them: the Deployment it controls (named after it) has observed its \
                 latest generation, runs spec.greeting as its container's argument and has \
                 every replica updated, ready and available, none of an older spec left; and \
                 the Service it controls (named after it) has spec.port as its nodePort. The \
                 time to Ready (create, change, the reaction's time to the status) is the time \
                 to that state: the Rust Lolcow's own Ready needs the same state, then its \
                 status write"
            }
            StatusShape::GoPulsarConsumer => {
                "its Deployment, not its status (the Go PulsarConsumer's copies its spec on \
                 writing the Deployment, whatever the pods do), as the bench's watch sees it: \
                 the Deployment it controls (<name>-deployment) has observed its latest \
                 generation, has spec.replicas replicas and spec's server, topic and \
                 subscription in its container's environment, and has every replica updated, \
                 ready and available, none of an older spec left. The time to Ready (create, \
                 change, the reaction's time to the status) is the time to that state: the \
                 Rust PulsarConsumer's own Ready needs the same state, then its status write"
            }
        }
    }

    /// Whether `obj`'s status says it is Ready at its current spec (always false for the
    /// shapes read [`reads_children`](Self::reads_children)).
    pub(super) fn is_ready(self, obj: &DynamicObject) -> bool {
        let status = &obj.data["status"];
        let spec = &obj.data["spec"];
        let condition = |type_: &str| {
            status["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
                .filter(|c| c["status"] == "True")
        };
        match self {
            StatusShape::Conditions => {
                let generation = obj.metadata.generation.unwrap_or(0);
                let observed = status["observedGeneration"].as_i64().unwrap_or(0);
                condition("Ready").is_some() && observed >= generation
            }
            StatusShape::GoPodSet => {
                status["readyReplicas"].as_i64().unwrap_or(0)
                    == spec["replicas"].as_i64().unwrap_or(0)
            }
            StatusShape::GoMemcached => {
                let size = spec["size"].as_i64().unwrap_or(0);
                condition("Available").is_some_and(|c| {
                    c["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(&format!(" with {size} replicas")))
                })
            }
            StatusShape::GoLolcow | StatusShape::GoPulsarConsumer => false,
        }
    }

    /// Whether the children of an object with `spec` say it is Ready at that spec (the
    /// shapes read [`reads_children`](Self::reads_children); false for the others):
    /// `deployment` is the Deployment it controls, `node_port` its Service's.
    pub(super) fn children_ready(
        self,
        spec: &serde_json::Value,
        deployment: Option<&DeploymentView>,
        node_port: Option<i32>,
    ) -> bool {
        let Some(d) = deployment else {
            return false;
        };
        let text = |key: &str| spec[key].as_str().unwrap_or_default();
        match self {
            StatusShape::GoLolcow => {
                d.rolled_out()
                    && d.first_arg.as_deref() == Some(text("greeting"))
                    && spec["port"]
                        .as_i64()
                        .is_some_and(|p| node_port.map(i64::from) == Some(p))
            }
            StatusShape::GoPulsarConsumer => {
                let env = |name: &str| d.env.get(name).map(String::as_str);
                d.rolled_out()
                    && i64::from(d.replicas) == spec["replicas"].as_i64().unwrap_or(1)
                    && env("PULSAR_SERVER") == Some(text("serverAddress"))
                    && env("PULSAR_TOPIC") == Some(text("topic"))
                    && env("PULSAR_SUBSCRIPTION_NAME") == Some(text("subscriptionName"))
            }
            StatusShape::Conditions | StatusShape::GoPodSet | StatusShape::GoMemcached => false,
        }
    }
}

/// What the bench reads of a Deployment to tell whether a Go original's object is Ready.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct DeploymentView {
    /// `metadata.generation`.
    pub(super) generation: i64,
    /// `status.observedGeneration` (0 when unset).
    pub(super) observed_generation: i64,
    /// `spec.replicas` (1 when unset, as the API server defaults it).
    pub(super) replicas: i32,
    /// `status.replicas`: its pods, of every ReplicaSet.
    pub(super) current: i32,
    /// `status.updatedReplicas`.
    pub(super) updated: i32,
    /// `status.readyReplicas`.
    pub(super) ready: i32,
    /// `status.availableReplicas`.
    pub(super) available: i32,
    /// The first argument of its first container (the Lolcow's greeting).
    pub(super) first_arg: Option<String>,
    /// The environment of its first container, by name (literal values only).
    pub(super) env: HashMap<String, String>,
}

impl DeploymentView {
    /// What the bench reads of `d`.
    pub(super) fn of(d: &Deployment) -> Self {
        let spec = d.spec.as_ref();
        let status = d.status.clone().unwrap_or_default();
        let container = spec.and_then(|s| s.template.spec.as_ref()?.containers.first());
        Self {
            generation: d.metadata.generation.unwrap_or(0),
            observed_generation: status.observed_generation.unwrap_or(0),
            replicas: spec.and_then(|s| s.replicas).unwrap_or(1),
            current: status.replicas.unwrap_or(0),
            updated: status.updated_replicas.unwrap_or(0),
            ready: status.ready_replicas.unwrap_or(0),
            available: status.available_replicas.unwrap_or(0),
            first_arg: container.and_then(|c| c.args.as_ref()?.first().cloned()),
            env: container
                .and_then(|c| c.env.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
                .collect(),
        }
    }

    /// Whether the Deployment controller has rolled out its latest spec: that generation
    /// observed, and exactly `spec.replicas` pods, every one updated, ready and available.
    pub(super) fn rolled_out(&self) -> bool {
        let want = self.replicas;
        self.observed_generation >= self.generation
            && self.generation > 0
            && self.current == want
            && self.updated == want
            && self.ready == want
            && self.available == want
    }
}

/// The name of `meta`'s controller when it is of kind `kind`.
fn controller_of(meta: &kube::core::ObjectMeta, kind: &str) -> Option<String> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == kind)
        .map(|o| o.name.clone())
}

/// The custom resources as watched.
#[derive(Default)]
pub(super) struct Objects {
    /// How their status says Ready.
    pub(super) shape: StatusShape,
    /// Live objects: name -> generation.
    pub(super) generation: HashMap<String, i64>,
    /// When each object was first seen Ready at a generation.
    pub(super) ready_at: HashMap<(String, i64), Instant>,
    /// Changes seen after the initial list.
    pub(super) changes: u64,
    /// Shapes read from the children: each live object's spec, by name.
    specs: HashMap<String, serde_json::Value>,
    /// Shapes read from the children: the Deployment each object controls, by its name.
    deployments: HashMap<String, DeploymentView>,
    /// Shapes read from the children: the nodePort of the Service each object controls.
    node_ports: HashMap<String, i32>,
}

/// The pods of the bench namespace as watched (metadata only).
#[derive(Default)]
pub(super) struct Pods {
    /// UIDs of every pod ever seen.
    pub(super) ever: HashSet<String>,
    /// UIDs of pods that exist (terminating ones included).
    pub(super) present: HashSet<String>,
    /// UIDs of pods that exist and are not terminating.
    pub(super) active: HashSet<String>,
    /// UIDs of active pods whose `Ready` condition is `True`.
    pub(super) ready: HashSet<String>,
    /// Changes seen after the initial list.
    pub(super) changes: u64,
    /// Pods listed during a re-list, applied at its end.
    pub(super) relist: Option<Vec<PodState>>,
}

/// What the bench reads of one pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct PodState {
    pub(super) uid: String,
    pub(super) terminating: bool,
    pub(super) ready: bool,
}

impl PodState {
    fn of(pod: &Pod) -> Self {
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        Self {
            uid: pod.uid().unwrap_or_default(),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            ready,
        }
    }
}

/// The operator's writes to the children of its objects, as the bench's watches see them:
/// a pod or Deployment it controls created, a Deployment's spec changed (its generation),
/// a pod it controls marked for deletion. Pods of a Deployment's ReplicaSets are the
/// Deployment controller's writes, not the operator's, and are not counted.
#[derive(Default)]
pub(super) struct Children {
    /// The objects' kind (`PodSet`...): the controller owner of their children.
    pub(super) owner_kind: String,
    /// When each object's children were written, by object name, in order.
    pub(super) writes: HashMap<String, Vec<Instant>>,
    /// The generation of each Deployment seen, by UID.
    deployments: HashMap<String, i64>,
    /// Pods seen, by UID: whether terminating.
    pods: HashMap<String, bool>,
}

impl Children {
    /// The name of `meta`'s controller when it is one of the objects.
    fn owner(&self, meta: &kube::core::ObjectMeta) -> Option<String> {
        controller_of(meta, &self.owner_kind)
    }

    fn wrote(&mut self, owner: String, now: Instant) {
        self.writes.entry(owner).or_default().push(now);
    }

    /// A Deployment seen (`initial`: in a list, before anything was asked of anyone).
    fn deployment(&mut self, meta: &kube::core::ObjectMeta, now: Instant, initial: bool) {
        let uid = meta.uid.clone().unwrap_or_default();
        let generation = meta.generation.unwrap_or(0);
        let before = self.deployments.insert(uid, generation);
        if !initial
            && before.is_none_or(|g| generation > g)
            && let Some(owner) = self.owner(meta)
        {
            self.wrote(owner, now);
        }
    }

    /// A pod seen.
    fn pod(&mut self, pod: &Pod, now: Instant, initial: bool) {
        let uid = pod.uid().unwrap_or_default();
        let terminating = pod.metadata.deletion_timestamp.is_some();
        let before = self.pods.insert(uid, terminating);
        let written = match before {
            None => true,
            Some(was) => terminating && !was,
        };
        if !initial
            && written
            && let Some(owner) = self.owner(&pod.metadata)
        {
            self.wrote(owner, now);
        }
    }

    /// The first write to `owner`'s children after its `after`-th one.
    pub(super) fn first_after(&self, owner: &str, after: usize) -> Option<Instant> {
        self.writes.get(owner)?.get(after).copied()
    }

    /// How many writes to `owner`'s children were seen.
    pub(super) fn count(&self, owner: &str) -> usize {
        self.writes.get(owner).map_or(0, Vec::len)
    }
}

impl Objects {
    /// An object seen (created or changed) at `now`.
    pub(super) fn observe(&mut self, obj: &DynamicObject, now: Instant) {
        let name = obj.name_any();
        let generation = obj.metadata.generation.unwrap_or(0);
        self.generation.insert(name.clone(), generation);
        if self.shape.reads_children() {
            self.specs.insert(name.clone(), obj.data["spec"].clone());
            self.recheck(&name, now);
        } else if self.shape.is_ready(obj) {
            self.ready_at.entry((name, generation)).or_insert(now);
        }
    }

    /// An object gone.
    pub(super) fn forget(&mut self, name: &str) {
        self.generation.remove(name);
        self.specs.remove(name);
    }

    /// The Deployment controlled by object `owner` seen at `now` (`None`: deleted).
    pub(super) fn observe_deployment(
        &mut self,
        owner: &str,
        view: Option<DeploymentView>,
        now: Instant,
    ) {
        match view {
            Some(view) => self.deployments.insert(owner.to_owned(), view),
            None => self.deployments.remove(owner),
        };
        self.recheck(owner, now);
    }

    /// The nodePort of the Service controlled by object `owner` seen at `now` (`None`:
    /// deleted, or none).
    pub(super) fn observe_node_port(&mut self, owner: &str, port: Option<i32>, now: Instant) {
        match port {
            Some(port) => self.node_ports.insert(owner.to_owned(), port),
            None => self.node_ports.remove(owner),
        };
        self.recheck(owner, now);
    }

    /// For a shape read from the children: whether object `name`, at its current
    /// generation and spec, is Ready by them now; if so, and first, `now` is when.
    fn recheck(&mut self, name: &str, now: Instant) {
        let (Some(generation), Some(spec)) = (self.generation.get(name), self.specs.get(name))
        else {
            return;
        };
        if self.shape.children_ready(
            spec,
            self.deployments.get(name),
            self.node_ports.get(name).copied(),
        ) {
            self.ready_at
                .entry((name.to_owned(), *generation))
                .or_insert(now);
        }
    }

    /// Per-object latencies (`from` -> Ready at the generation in `generations`), sorted.
    pub(super) fn latencies(
        &self,
        names: &[String],
        from: &HashMap<String, Instant>,
        generations: &HashMap<String, i64>,
    ) -> Vec<f64> {
        let mut all: Vec<f64> = names
            .iter()
            .filter_map(|n| {
                let generation = self.generation.get(n).copied()?;
                let want = generations.get(n).copied().unwrap_or(1);
                let ready = (want..=generation)
                    .filter_map(|g| self.ready_at.get(&(n.clone(), g)))
                    .min()?;
                Some(seconds(*from.get(n)?, *ready))
            })
            .collect();
        all.sort_by(f64::total_cmp);
        all
    }

    /// Objects Ready at `generation` (or a later one).
    pub(super) fn ready(&self, names: &[String], generations: &HashMap<String, i64>) -> usize {
        names
            .iter()
            .filter(|n| {
                let want = generations.get(*n).copied().unwrap_or(1);
                let have = self.generation.get(*n).copied().unwrap_or(0);
                have >= want && self.ready_at.contains_key(&((*n).clone(), have))
            })
            .count()
    }
}

impl Pods {
    pub(super) fn observe(&mut self, pod: PodState) {
        let PodState {
            uid,
            terminating,
            ready,
        } = pod;
        self.ever.insert(uid.clone());
        self.present.insert(uid.clone());
        if ready && !terminating {
            self.ready.insert(uid.clone());
        } else {
            self.ready.remove(&uid);
        }
        if terminating {
            self.active.remove(&uid);
        } else {
            self.active.insert(uid);
        }
    }

    pub(super) fn gone(&mut self, uid: &str) {
        self.present.remove(uid);
        self.active.remove(uid);
        self.ready.remove(uid);
    }

    /// Whether exactly `want` pods exist (not terminating), every one Ready.
    pub(super) fn exactly_ready(&self, want: usize) -> bool {
        self.active.len() == want && self.ready.len() == want
    }
}

/// The label of the bench's stranger pods (`--stranger-pods`).
pub(super) const STRANGER_LABEL: &str = "bench.rust-operators.dev/stranger";

/// Creates `count` pods that belong to nobody in `namespace` (32 requests at a time).
pub(super) async fn create_strangers(client: &Client, namespace: &str, count: u32) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move {
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {
                        "name": format!("stranger-{i:05}"),
                        "labels": { STRANGER_LABEL: "true", "app": "someone-else" },
                    },
                    "spec": {
                        "securityContext": {"runAsNonRoot": true, "runAsUser": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{"name": "c", "image": "busybox",
                            "securityContext": {"allowPrivilegeEscalation": false,
                                "capabilities": {"drop": ["ALL"]}}}],
                    },
                }))?;
                api.create(&PostParams::default(), &pod)
                    .await
                    .with_context(|| format!("creating stranger pod {i}"))?;
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    say!(
        "    {count} stranger pods created in {}s",
        seconds(started, Instant::now())
    );
    // Let the scheduler and the simulated kubelets finish with them first, so the run
    // measures the operator beside them, not the cluster still busy placing them.
    let deadline = Instant::now() + Duration::from_secs(600);
    let running = ListParams::default()
        .labels(STRANGER_LABEL)
        .fields("status.phase=Running");
    loop {
        let n = api.list_metadata(&running).await?.items.len();
        if n >= count as usize {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "only {n} of {count} stranger pods Running after 600 s"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    say!(
        "    {count} stranger pods Running after {}s",
        seconds(started, Instant::now())
    );
    Ok(())
}

/// The bench's view of the namespace, shared with its watch tasks.
#[derive(Clone)]
pub(super) struct Watches {
    pub(super) objects: Arc<Mutex<Objects>>,
    pub(super) pods: Arc<Mutex<Pods>>,
    pub(super) children: Arc<Mutex<Children>>,
}

/// The bench namespaces as its watches see them: one is watched alone; several are
/// watched in one watch of every namespace, whose events of other namespaces are skipped
/// (one relist then covers them all, as the pod state's bookkeeping wants).
#[derive(Clone)]
struct Namespaces(Vec<String>);

impl Namespaces {
    /// The API of `K` the watches use: the namespace's, or every namespace's.
    fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match self.0.as_slice() {
            [one] => Api::namespaced(client.clone(), one),
            _ => Api::all(client.clone()),
        }
    }

    /// The same for the custom resource `resource`.
    fn dynamic_api(&self, client: &Client, resource: &ApiResource) -> Api<DynamicObject> {
        match self.0.as_slice() {
            [one] => Api::namespaced_with(client.clone(), one, resource),
            _ => Api::all_with(client.clone(), resource),
        }
    }

    /// Whether an event of `obj` is the bench's.
    fn holds(&self, obj: &impl ResourceExt) -> bool {
        self.0.len() == 1 || obj.namespace().is_some_and(|ns| self.0.contains(&ns))
    }
}

/// Watches the custom resources (`resource`, Ready as `shape` says), the pods and the
/// Deployments of `namespaces` into shared state.
pub(super) fn spawn_watches(
    client: &Client,
    namespaces: &[String],
    resource: &ApiResource,
    shape: StatusShape,
) -> Watches {
    let namespaces = Namespaces(namespaces.to_vec());
    let watches = Watches {
        objects: Arc::new(Mutex::new(Objects {
            shape,
            ..Objects::default()
        })),
        pods: Arc::new(Mutex::new(Pods::default())),
        children: Arc::new(Mutex::new(Children {
            owner_kind: resource.kind.clone(),
            ..Children::default()
        })),
    };
    let cr_api: Api<DynamicObject> = namespaces.dynamic_api(client, resource);
    let (state, ours) = (watches.objects.clone(), namespaces.clone());
    tokio::spawn(async move {
        let mut stream = watcher::watcher(cr_api, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            if !event_of(&event, &ours) {
                continue;
            }
            let now = Instant::now();
            let Ok(mut s) = state.lock() else { break };
            match event {
                Ok(Event::Apply(obj)) => {
                    s.changes += 1;
                    s.observe(&obj, now);
                }
                Ok(Event::InitApply(obj)) => s.observe(&obj, now),
                Ok(Event::Delete(obj)) => {
                    s.changes += 1;
                    s.forget(&obj.name_any());
                }
                Ok(Event::Init | Event::InitDone) => {}
                Err(e) => say_err!("bench: custom resource watch: {e}"),
            }
        }
    });
    // Whole pods: readiness is in their status.
    let pod_api: Api<Pod> = namespaces.api(client);
    let (state, children, ours) = (
        watches.pods.clone(),
        watches.children.clone(),
        namespaces.clone(),
    );
    tokio::spawn(async move {
        // The stranger pods are not the operator's business, nor the bench's count.
        let config = watcher::Config::default().labels(&format!("!{STRANGER_LABEL}"));
        let mut stream = watcher::watcher(pod_api, config).boxed();
        while let Some(event) = stream.next().await {
            if !event_of(&event, &ours) {
                continue;
            }
            let now = Instant::now();
            let (Ok(mut s), Ok(mut c)) = (state.lock(), children.lock()) else {
                break;
            };
            match event {
                Ok(Event::Apply(p)) => {
                    s.changes += 1;
                    c.pod(&p, now, false);
                    s.observe(PodState::of(&p));
                }
                Ok(Event::Delete(p)) => {
                    s.changes += 1;
                    s.gone(&p.uid().unwrap_or_default());
                }
                Ok(Event::Init) => s.relist = Some(Vec::new()),
                Ok(Event::InitApply(p)) => {
                    c.pod(&p, now, true);
                    s.relist.get_or_insert_with(Vec::new).push(PodState::of(&p));
                }
                Ok(Event::InitDone) => {
                    let listed = s.relist.take().unwrap_or_default();
                    s.present.clear();
                    s.active.clear();
                    s.ready.clear();
                    for pod in listed {
                        s.observe(pod);
                    }
                }
                Err(e) => say_err!("bench: pod watch: {e}"),
            }
        }
    });
    let owner_kind = resource.kind.clone();
    if shape.reads_children() {
        // Whole Deployments: their spec and status say whether a Go original's object is
        // Ready.
        let (children, objects) = (watches.children.clone(), watches.objects.clone());
        spawn_watch(
            namespaces.api::<Deployment>(client),
            namespaces.clone(),
            "Deployment",
            move |event, now| {
                let (d, initial, gone) = match &event {
                    Event::Apply(d) => (d, false, false),
                    Event::InitApply(d) => (d, true, false),
                    Event::Delete(d) => (d, false, true),
                    Event::Init | Event::InitDone => return true,
                };
                if !gone {
                    let Ok(mut c) = children.lock() else {
                        return false;
                    };
                    c.deployment(&d.metadata, now, initial);
                }
                if let Some(owner) = controller_of(&d.metadata, &owner_kind) {
                    let Ok(mut o) = objects.lock() else {
                        return false;
                    };
                    o.observe_deployment(&owner, (!gone).then(|| DeploymentView::of(d)), now);
                }
                true
            },
        );
    } else {
        // Metadata only: the generation and the owner are all the bench reads.
        let children = watches.children.clone();
        spawn_watch(
            namespaces.api::<PartialObjectMeta<Deployment>>(client),
            namespaces.clone(),
            "Deployment",
            move |event, now| {
                let Ok(mut c) = children.lock() else {
                    return false;
                };
                match event {
                    Event::Apply(d) => c.deployment(&d.metadata, now, false),
                    Event::InitApply(d) => c.deployment(&d.metadata, now, true),
                    Event::Delete(_) | Event::Init | Event::InitDone => {}
                }
                true
            },
        );
    }
    if shape == StatusShape::GoLolcow {
        // The Go Lolcow's Services: their nodePort is half of its Ready.
        let (objects, owner_kind) = (watches.objects.clone(), resource.kind.clone());
        spawn_watch(
            namespaces.api::<Service>(client),
            namespaces,
            "Service",
            move |event, now| {
                let (svc, gone) = match &event {
                    Event::Apply(s) | Event::InitApply(s) => (s, false),
                    Event::Delete(s) => (s, true),
                    Event::Init | Event::InitDone => return true,
                };
                if let Some(owner) = controller_of(&svc.metadata, &owner_kind) {
                    let Ok(mut o) = objects.lock() else {
                        return false;
                    };
                    let port = if gone { None } else { first_node_port(svc) };
                    o.observe_node_port(&owner, port, now);
                }
                true
            },
        );
    }
    watches
}

/// The nodePort of a Service's first port, if it has one.
fn first_node_port(svc: &Service) -> Option<i32> {
    svc.spec.as_ref()?.ports.as_ref()?.first()?.node_port
}

/// Watches `api` on a task of its own: `on` gets every event of the bench namespaces with
/// the time it reached the bench, until it returns false (a poisoned lock). Errors are
/// printed (the watcher retries).
fn spawn_watch<K>(
    api: Api<K>,
    namespaces: Namespaces,
    what: &'static str,
    mut on: impl FnMut(Event<K>, Instant) -> bool + Send + 'static,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    tokio::spawn(async move {
        let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            if !event_of(&event, &namespaces) {
                continue;
            }
            let now = Instant::now();
            match event {
                Ok(event) => {
                    if !on(event, now) {
                        break;
                    }
                }
                Err(e) => say_err!("bench: {what} watch: {e}"),
            }
        }
    });
}

/// Whether a watch event is of the bench namespaces (the markers of a relist always are).
fn event_of<K: ResourceExt>(
    event: &Result<Event<K>, watcher::Error>,
    namespaces: &Namespaces,
) -> bool {
    match event {
        Ok(Event::Apply(obj) | Event::InitApply(obj) | Event::Delete(obj)) => namespaces.holds(obj),
        Ok(Event::Init | Event::InitDone) | Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(
        generation: i64,
        spec: serde_json::Value,
        status: serde_json::Value,
    ) -> DynamicObject {
        let mut obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "x/v1", "kind": "X",
            "metadata": { "name": "o", "generation": generation },
            "spec": spec, "status": status,
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        obj.metadata.generation = Some(generation);
        obj
    }

    #[test]
    fn each_implementation_says_ready_its_own_way() {
        let ready = json!([{ "type": "Ready", "status": "True" }]);
        let rust = |observed: i64| {
            object(
                2,
                json!({}),
                json!({ "observedGeneration": observed, "conditions": ready }),
            )
        };
        assert!(StatusShape::Conditions.is_ready(&rust(2)));
        assert!(
            !StatusShape::Conditions.is_ready(&rust(1)),
            "an older generation's status"
        );

        let podset = |ready: i64| {
            object(
                1,
                json!({ "replicas": 4 }),
                json!({ "readyReplicas": ready }),
            )
        };
        assert!(StatusShape::GoPodSet.is_ready(&podset(4)));
        assert!(!StatusShape::GoPodSet.is_ready(&podset(3)));

        let memcached = |message: &str| {
            object(
                1,
                json!({ "size": 4 }),
                json!({ "conditions": [{ "type": "Available", "status": "True", "message": message }] }),
            )
        };
        let done = "Deployment for custom resource (m) with 4 replicas created successfully";
        assert!(StatusShape::GoMemcached.is_ready(&memcached(done)));
        assert!(!StatusShape::GoMemcached.is_ready(&memcached(&done.replace('4', "3"))));
    }

    /// A Deployment as the API server has it: `generation`, `observed` by its controller,
    /// `replicas` wanted and `ready` of them (every one updated and available too), its
    /// container's `args` and `env`, controlled by the `owner_kind` named `o`.
    fn deployment(
        generation: i64,
        observed: i64,
        replicas: i32,
        ready: i32,
        container: serde_json::Value,
        owner_kind: &str,
    ) -> Deployment {
        serde_json::from_value(json!({
            "metadata": { "name": "o", "uid": "d", "generation": generation,
                "ownerReferences": [{ "apiVersion": "x/v1", "kind": owner_kind, "name": "o",
                    "uid": "u", "controller": true }] },
            "spec": {
                "replicas": replicas,
                "selector": { "matchLabels": { "a": "b" } },
                "template": { "spec": { "containers": [container] } },
            },
            "status": { "observedGeneration": observed, "replicas": ready,
                "updatedReplicas": ready, "readyReplicas": ready, "availableReplicas": ready },
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn lolcow_container(greeting: &str) -> serde_json::Value {
        json!({ "name": "o", "image": "lolcow-web:latest", "args": [greeting] })
    }

    #[test]
    fn a_deployment_is_rolled_out_at_its_latest_spec_with_every_replica_ready() {
        let view = |generation, observed, replicas, ready| {
            DeploymentView::of(&deployment(
                generation,
                observed,
                replicas,
                ready,
                lolcow_container("Moo"),
                "Lolcow",
            ))
        };
        assert!(view(2, 2, 1, 1).rolled_out());
        assert_eq!(view(2, 2, 1, 1).first_arg.as_deref(), Some("Moo"));
        assert!(!view(2, 1, 1, 1).rolled_out(), "its new spec not observed");
        assert!(!view(1, 1, 3, 2).rolled_out(), "a replica not ready");
        let mut old_left = view(1, 1, 2, 2);
        old_left.current = 3;
        assert!(!old_left.rolled_out(), "a pod of the old spec still there");
        // Its status not written yet.
        let mut fresh = deployment(1, 0, 1, 0, lolcow_container("Moo"), "Lolcow");
        fresh.status = None;
        assert!(!DeploymentView::of(&fresh).rolled_out());
    }

    #[test]
    fn the_go_lolcow_is_ready_when_its_deployment_serves_the_greeting_on_its_port() {
        let spec = json!({ "greeting": "Moo", "port": 31000 });
        let rolled = |greeting: &str| {
            DeploymentView::of(&deployment(
                2,
                2,
                1,
                1,
                lolcow_container(greeting),
                "Lolcow",
            ))
        };
        let shape = StatusShape::GoLolcow;
        assert!(shape.reads_children());
        assert!(shape.children_ready(&spec, Some(&rolled("Moo")), Some(31000)));
        assert!(!shape.children_ready(&spec, Some(&rolled("Hello")), Some(31000)));
        assert!(!shape.children_ready(&spec, Some(&rolled("Moo")), Some(31001)));
        assert!(!shape.children_ready(&spec, Some(&rolled("Moo")), None));
        assert!(!shape.children_ready(&spec, None, Some(31000)));
        // The shapes read from the status never say so from children, nor the reverse.
        assert!(!StatusShape::Conditions.children_ready(&spec, Some(&rolled("Moo")), Some(31000)));
        let no_status = object(1, spec.clone(), json!({}));
        assert!(!shape.is_ready(&no_status));
    }

    #[test]
    fn the_go_pulsar_consumer_is_ready_when_its_deployment_runs_its_spec() {
        let spec = json!({ "serverAddress": "pulsar://b:6650", "topic": "t",
            "subscriptionName": "s", "replicas": 3 });
        let container = |topic: &str| {
            json!({ "name": "pulsarconsumer", "image": "pulsar-consumer:latest", "env": [
                { "name": "PULSAR_SERVER", "value": "pulsar://b:6650" },
                { "name": "PULSAR_TOPIC", "value": topic },
                { "name": "PULSAR_SUBSCRIPTION_NAME", "value": "s" },
            ] })
        };
        let view = |replicas, ready, topic: &str| {
            DeploymentView::of(&deployment(
                1,
                1,
                replicas,
                ready,
                container(topic),
                "PulsarConsumer",
            ))
        };
        let shape = StatusShape::GoPulsarConsumer;
        assert!(shape.children_ready(&spec, Some(&view(3, 3, "t")), None));
        assert!(!shape.children_ready(&spec, Some(&view(3, 2, "t")), None));
        assert!(
            !shape.children_ready(&spec, Some(&view(2, 2, "t")), None),
            "rolled out, at the replicas of an older spec"
        );
        assert!(!shape.children_ready(&spec, Some(&view(3, 3, "u")), None));
    }

    #[test]
    fn children_make_an_object_ready_at_its_current_generation() {
        let mut o = Objects {
            shape: StatusShape::GoLolcow,
            ..Objects::default()
        };
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let lolcow = |generation, greeting: &str| {
            let mut obj = object(
                generation,
                json!({ "greeting": greeting, "port": 31000 }),
                json!({}),
            );
            obj.metadata.name = Some("o".into());
            obj
        };
        let d = deployment(1, 1, 1, 1, lolcow_container("Moo"), "Lolcow");
        assert_eq!(controller_of(&d.metadata, "Lolcow").as_deref(), Some("o"));
        assert_eq!(controller_of(&d.metadata, "PodSet"), None);
        o.observe(&lolcow(1, "Moo"), at(0));
        o.observe_deployment("o", Some(DeploymentView::of(&d)), at(10));
        assert!(o.ready_at.is_empty(), "no Service yet");
        o.observe_node_port("o", Some(31000), at(20));
        assert_eq!(o.ready_at.get(&("o".into(), 1)), Some(&at(20)));
        // A new greeting: not Ready at generation 2 until the Deployment runs it.
        o.observe(&lolcow(2, "Moo again"), at(30));
        assert!(!o.ready_at.contains_key(&("o".into(), 2)));
        let names = ["o".to_owned()];
        let want: HashMap<String, i64> = [("o".to_owned(), 2)].into_iter().collect();
        assert_eq!(o.ready(&names, &want), 0);
        let mut updated = deployment(2, 2, 1, 1, lolcow_container("Moo again"), "Lolcow");
        updated.status = None;
        o.observe_deployment("o", Some(DeploymentView::of(&updated)), at(40));
        assert_eq!(o.ready(&names, &want), 0, "rolling out");
        let rolled = deployment(2, 2, 1, 1, lolcow_container("Moo again"), "Lolcow");
        o.observe_deployment("o", Some(DeploymentView::of(&rolled)), at(50));
        assert_eq!(o.ready(&names, &want), 1);
        let from: HashMap<String, Instant> = [("o".to_owned(), at(30))].into_iter().collect();
        assert_eq!(o.latencies(&names, &from, &want), vec![0.02]);
        // Gone: its children's events no longer make it Ready.
        o.forget("o");
        o.observe_deployment("o", None, at(60));
        assert!(o.generation.is_empty() && o.specs.is_empty());
    }

    fn pod(uid: &str, owner_kind: &str, terminating: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": uid, "uid": uid,
                "deletionTimestamp": if terminating { json!("2026-01-01T00:00:00Z") } else { json!(null) },
                "ownerReferences": [{ "apiVersion": "x/v1", "kind": owner_kind, "name": "o",
                    "uid": "u", "controller": true }],
            },
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn several_namespaces_keep_the_events_of_theirs_only() {
        let in_ns = |ns: &str| {
            let mut p = pod("p", "ReplicaSet", false);
            p.metadata.namespace = Some(ns.to_owned());
            Ok(Event::Apply(p))
        };
        let one = Namespaces(vec!["a".to_owned()]);
        let two = Namespaces(vec!["a".to_owned(), "b".to_owned()]);
        // One namespace is watched alone: whatever comes is its.
        assert!(event_of(&in_ns("a"), &one));
        assert!(event_of(&in_ns("b"), &two));
        assert!(!event_of(&in_ns("kube-system"), &two));
        assert!(event_of::<Pod>(&Ok(Event::InitDone), &two));
    }

    #[test]
    fn child_writes_are_creations_spec_changes_and_deletions_of_what_the_object_controls() {
        let mut c = Children {
            owner_kind: "PodSet".into(),
            ..Children::default()
        };
        let now = Instant::now();
        // Listed: there already, not a write.
        c.pod(&pod("a", "PodSet", false), now, true);
        assert_eq!(c.count("o"), 0);
        // Created, then marked for deletion (once), then the same again: two writes.
        c.pod(&pod("b", "PodSet", false), now, false);
        c.pod(&pod("a", "PodSet", true), now, false);
        c.pod(&pod("a", "PodSet", true), now, false);
        assert_eq!(c.count("o"), 2);
        // A ReplicaSet's pod is not the operator's write.
        c.pod(&pod("c", "ReplicaSet", false), now, false);
        assert_eq!(c.count("o"), 2);
        // A Deployment: created, its status changes (same generation), its spec changes.
        let mut meta = kube::core::ObjectMeta {
            uid: Some("d".into()),
            generation: Some(1),
            owner_references: pod("x", "PodSet", false).metadata.owner_references,
            ..Default::default()
        };
        c.deployment(&meta, now, false);
        c.deployment(&meta, now, false);
        meta.generation = Some(2);
        let later = now + Duration::from_millis(5);
        c.deployment(&meta, later, false);
        assert_eq!(c.count("o"), 4);
        assert_eq!(c.first_after("o", 3), Some(later));
        assert_eq!(c.first_after("o", 4), None);
    }

    #[test]
    fn pods_count_ready_only_when_not_terminating() {
        let mut p = Pods::default();
        let state = |uid: &str, terminating, ready| PodState {
            uid: uid.into(),
            terminating,
            ready,
        };
        p.observe(state("a", false, true));
        p.observe(state("b", false, false));
        assert!(!p.exactly_ready(2));
        p.observe(state("b", false, true));
        assert!(p.exactly_ready(2));
        p.observe(state("a", true, true));
        assert!(p.exactly_ready(1));
        p.gone("a");
        assert!(p.exactly_ready(1) && p.present.len() == 1);
    }
}
