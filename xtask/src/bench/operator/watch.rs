//! What the bench's own watches see: the custom resources and the pods of the bench namespace.

use super::timing::seconds;
use anyhow::{Context, Result, ensure};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::core::{ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The custom resources as watched.
#[derive(Default)]
pub(super) struct Objects {
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
    /// Changes seen after the initial list.
    pub(super) changes: u64,
    /// Pods listed during a re-list, applied at its end.
    pub(super) relist: Option<Vec<(String, bool)>>,
}

impl Objects {
    pub(super) fn observe(&mut self, obj: &DynamicObject, now: Instant) {
        let name = obj.name_any();
        let generation = obj.metadata.generation.unwrap_or(0);
        self.generation.insert(name.clone(), generation);
        let status = &obj.data["status"];
        let observed = status["observedGeneration"].as_i64().unwrap_or(0);
        let ready = status["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        if ready && observed >= generation {
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
    pub(super) fn observe(&mut self, uid: String, terminating: bool) {
        self.ever.insert(uid.clone());
        self.present.insert(uid.clone());
        if terminating {
            self.active.remove(&uid);
        } else {
            self.active.insert(uid);
        }
    }

    pub(super) fn gone(&mut self, uid: &str) {
        self.present.remove(uid);
        self.active.remove(uid);
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
    println!(
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
    println!(
        "    {count} stranger pods Running after {}s",
        seconds(started, Instant::now())
    );
    Ok(())
}

/// Watches the custom resources and the pods of `namespace` into shared state.
pub(super) fn spawn_watches(
    client: &Client,
    namespace: &str,
    resource: &ApiResource,
) -> (Arc<Mutex<Objects>>, Arc<Mutex<Pods>>) {
    let objects = Arc::new(Mutex::new(Objects::default()));
    let pods = Arc::new(Mutex::new(Pods::default()));
    let cr_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
    let state = objects.clone();
    tokio::spawn(async move {
        let mut stream = watcher::watcher(cr_api, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
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
                Err(e) => eprintln!("bench: custom resource watch: {e}"),
            }
        }
    });
    let pod_api: Api<PartialObjectMeta<Pod>> = Api::namespaced(client.clone(), namespace);
    let state = pods.clone();
    tokio::spawn(async move {
        // The stranger pods are not the operator's business, nor the bench's count.
        let config = watcher::Config::default().labels(&format!("!{STRANGER_LABEL}"));
        let mut stream = watcher::watcher(pod_api, config).boxed();
        while let Some(event) = stream.next().await {
            let Ok(mut s) = state.lock() else { break };
            match event {
                Ok(Event::Apply(p)) => {
                    s.changes += 1;
                    let terminating = p.metadata.deletion_timestamp.is_some();
                    s.observe(p.uid().unwrap_or_default(), terminating);
                }
                Ok(Event::Delete(p)) => {
                    s.changes += 1;
                    s.gone(&p.uid().unwrap_or_default());
                }
                Ok(Event::Init) => s.relist = Some(Vec::new()),
                Ok(Event::InitApply(p)) => {
                    let entry = (
                        p.uid().unwrap_or_default(),
                        p.metadata.deletion_timestamp.is_some(),
                    );
                    s.relist.get_or_insert_with(Vec::new).push(entry);
                }
                Ok(Event::InitDone) => {
                    let listed = s.relist.take().unwrap_or_default();
                    s.present.clear();
                    s.active.clear();
                    for (uid, terminating) in listed {
                        s.observe(uid, terminating);
                    }
                }
                Err(e) => eprintln!("bench: pod watch: {e}"),
            }
        }
    });
    (objects, pods)
}
