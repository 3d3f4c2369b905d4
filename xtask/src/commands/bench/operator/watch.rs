//! What the bench's own watches see: the custom resources, the pods and the Deployments of
//! the bench namespaces, each event stamped with the bench's clock when it arrives.

use super::timing::seconds;
use anyhow::{Context, Result, ensure};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::core::{ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xtask::{say, say_err};

/// How an implementation's status says that an object is Ready at its spec.
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
}

impl StatusShape {
    /// Whether `obj`'s status says it is Ready at its current spec.
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
        }
    }
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
        meta.owner_references
            .as_ref()?
            .iter()
            .find(|o| o.controller == Some(true) && o.kind == self.owner_kind)
            .map(|o| o.name.clone())
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
    pub(super) fn observe(&mut self, obj: &DynamicObject, now: Instant) {
        let name = obj.name_any();
        let generation = obj.metadata.generation.unwrap_or(0);
        self.generation.insert(name.clone(), generation);
        if self.shape.is_ready(obj) {
            self.ready_at.entry((name, generation)).or_insert(now);
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
                    s.generation.remove(&obj.name_any());
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
    // Metadata only: the generation and the owner are all the bench reads.
    let deployment_api: Api<PartialObjectMeta<Deployment>> = namespaces.api(client);
    let children = watches.children.clone();
    tokio::spawn(async move {
        let mut stream = watcher::watcher(deployment_api, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            if !event_of(&event, &namespaces) {
                continue;
            }
            let now = Instant::now();
            let Ok(mut c) = children.lock() else { break };
            match event {
                Ok(Event::Apply(d)) => c.deployment(&d.metadata, now, false),
                Ok(Event::InitApply(d)) => c.deployment(&d.metadata, now, true),
                Ok(Event::Delete(_) | Event::Init | Event::InitDone) => {}
                Err(e) => say_err!("bench: Deployment watch: {e}"),
            }
        }
    });
    watches
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
