//! Slim views of Kubernetes kinds for the operators' caches: only the fields a reconcile
//! reads, as a type of their own, so a watch deserializes each object straight into the
//! small shape and never builds the full one.
//!
//! A `k8s_openapi` `Pod` takes about 2.4 KiB before any field is set (its spec is stored
//! inline) and 4.1 KiB with the metadata and status of a running pod, even with its spec
//! and the rest of its status dropped; a [`SlimPod`] with the same metadata 1.7 KiB
//! (measured on the pods of a Memcached bench). With thousands of pods in a watched
//! namespace, the pod cache was most of an operator's memory, and parsing each pod's spec
//! a good part of its watch's CPU.
//!
//! A child an operator server-side applies (a Deployment, a Service) is compared with what
//! the operator wants, field by field, so [`Slim`] keeps the fields the operator's field
//! manager owns ([`projection`]) and the status, as JSON text, and nothing a tenant added
//! beside them: what one cached child takes is bounded by what the operator applies
//! (and by `MAX_KEPT_SPEC`), not by what the object holds. A reconcile parses
//! it back into the full type ([`Slim::full`]) when it needs it.
//!
//! Pods keep only the labels in `KEPT_POD_LABELS`; every cached object only its
//! controller owner reference and its first finalizers.

use std::{
    borrow::Cow,
    collections::BTreeMap,
    fmt,
    marker::PhantomData,
    sync::atomic::{AtomicU64, Ordering},
};

use k8s_openapi::{
    NamespaceResourceScope,
    api::core::v1::Pod,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time},
};
use kube::Resource;
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::{Value, value::RawValue};

pub mod projection;

/// `metadata` without `managedFields`: [`SlimPod`] and [`Slim`] parse into it, and the JSON of the
/// managed fields (often the larger part of an object's metadata, and a tree of maps once
/// parsed) is skipped over without being built.
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct LeanMeta {
    annotations: Pairs,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Pairs,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

impl From<LeanMeta> for ObjectMeta {
    fn from(m: LeanMeta) -> Self {
        ObjectMeta {
            annotations: m.annotations.to_map(),
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels.to_map(),
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        }
    }
}

/// Labels or annotations as a cache keeps them: the pairs, sorted by key, in one
/// allocation of their exact size. A `BTreeMap<String, String>`, as `ObjectMeta` holds
/// them, allocates a node with room for eleven entries (544 bytes) for a single label;
/// with the strings, the labels of a memcached pod took about 700 bytes that way and
/// about 300 this way, and they were the largest part of a cached pod (heaptrack, 1,000
/// Memcacheds of 3 pods).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pairs(Box<[(Box<str>, Box<str>)]>);

impl Pairs {
    /// The value under `key`.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    /// The pairs, by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    /// How many pairs there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The bytes of its keys and values together.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.0.iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The pairs as `ObjectMeta` holds them (`None` when there are none, as the API server
    /// leaves the field out).
    #[must_use]
    pub fn to_map(&self) -> Option<BTreeMap<String, String>> {
        (!self.is_empty()).then(|| {
            self.iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
    }

    /// Only the pairs whose key is one of `keys`.
    #[must_use]
    pub fn kept(self, keys: &[&str]) -> Self {
        if self.iter().all(|(k, _)| keys.contains(&k)) {
            return self;
        }
        Pairs(
            self.0
                .into_vec()
                .into_iter()
                .filter(|(k, _)| keys.contains(&&**k))
                .collect(),
        )
    }

    fn from_pairs(mut pairs: Vec<(Box<str>, Box<str>)>) -> Self {
        // Stable: a JSON object may repeat a key, and the last one counts, as when it is
        // read into a map; the repeats stay in their order for the dedup below.
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        pairs.reverse();
        pairs.dedup_by(|later, earlier| later.0 == earlier.0);
        pairs.reverse();
        Pairs(pairs.into_boxed_slice())
    }
}

impl From<Option<BTreeMap<String, String>>> for Pairs {
    fn from(map: Option<BTreeMap<String, String>>) -> Self {
        Pairs(
            map.unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str()))
                .collect(),
        )
    }
}

impl Serialize for Pairs {
    /// A JSON object, as the map it stands for.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for Pairs {
    /// Reads a JSON object of strings (or `null`) straight into the pairs, never building
    /// the map.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Pairs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of strings or null")
            }
            fn visit_unit<E>(self) -> Result<Pairs, E> {
                Ok(Pairs::default())
            }
            fn visit_none<E>(self) -> Result<Pairs, E> {
                Ok(Pairs::default())
            }
            fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Pairs, D::Error> {
                d.deserialize_map(self)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Pairs, A::Error> {
                let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
                while let Some((k, v)) = map.next_entry::<Cow<'de, str>, Cow<'de, str>>()? {
                    pairs.push((Box::from(&*k), Box::from(&*v)));
                }
                Ok(Pairs::from_pairs(pairs))
            }
        }
        d.deserialize_option(Visitor)
    }
}

/// The only labels a [`SlimPod`] keeps: those the operators read or set on their pods (the
/// `app.kubernetes.io` ones, PodSet's `app` and `version`, and the Deployment controller's
/// `pod-template-hash`). A pod's labels are a tenant's to set, and any others, however
/// many, are dropped while parsing.
pub(crate) const KEPT_POD_LABELS: &[&str] = &[
    "app",
    "version",
    "pod-template-hash",
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/component",
    "app.kubernetes.io/version",
];

/// A Pod as the operators cache it: its metadata without `managedFields`, `status.phase`
/// and whether its `Ready` condition is `True`. Watched and listed as the `v1` `pods`
/// resource; every other field of the API object is skipped while parsing.
///
/// The labels are kept apart from the metadata, as [`Pairs`] ([`SlimPod::labels`]);
/// `metadata.labels` stays empty.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlimPod {
    /// The pod's metadata, without `managedFields`, labels and annotations.
    pub metadata: ObjectMeta,
    /// The pod's labels.
    pub labels: Pairs,
    /// `status.phase` and readiness, when the pod has a status.
    pub status: Option<SlimPodStatus>,
}

impl<'de> Deserialize<'de> for SlimPod {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: Option<LeanMeta>,
            #[serde(default)]
            status: Option<SlimPodStatus>,
        }
        let wire = Wire::deserialize(d)?;
        let mut meta = wire.metadata.unwrap_or_default();
        let labels = std::mem::take(&mut meta.labels).kept(KEPT_POD_LABELS);
        meta.annotations = Pairs::default();
        bound_meta(&mut meta);
        meta.finalizers = None;
        Ok(SlimPod {
            metadata: meta.into(),
            labels,
            status: wire.status,
        })
    }
}

/// The part of a pod's status the operators read.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct SlimPodStatus {
    /// `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`.
    #[serde(default)]
    pub phase: Option<String>,
    /// Whether `status.conditions` has `Ready` at `True`. Read while parsing: the
    /// conditions themselves (five per running pod, two strings each) are not kept, which
    /// took about 250 bytes per cached pod.
    #[serde(default, rename = "conditions", deserialize_with = "ready_condition")]
    pub ready: bool,
}

/// One entry of `status.conditions`, borrowed from the input while it is read.
#[derive(Deserialize)]
struct ConditionRef<'a> {
    #[serde(rename = "type", borrow)]
    type_: Cow<'a, str>,
    #[serde(borrow)]
    status: Cow<'a, str>,
}

impl ConditionRef<'_> {
    fn is_ready(&self) -> bool {
        self.type_ == "Ready" && self.status == "True"
    }
}

/// Reads `status.conditions` (a list, or `null`) into whether `Ready` is `True`.
fn ready_condition<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    struct Conditions;
    impl<'de> serde::de::Visitor<'de> for Conditions {
        type Value = bool;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of pod conditions or null")
        }
        fn visit_unit<E>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_none<E>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_seq(self)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
            let mut ready = false;
            while let Some(c) = seq.next_element::<ConditionRef<'de>>()? {
                ready |= c.is_ready();
            }
            Ok(ready)
        }
    }
    d.deserialize_option(Conditions)
}

impl SlimPod {
    /// The pod's labels (`metadata.labels` of the cached pod is empty).
    #[must_use]
    pub fn labels(&self) -> &Pairs {
        &self.labels
    }

    /// `status.phase`, if reported.
    #[must_use]
    pub fn phase(&self) -> Option<&str> {
        self.status.as_ref()?.phase.as_deref()
    }

    /// Whether the pod's `Ready` condition is `True`.
    #[must_use]
    pub fn ready(&self) -> bool {
        self.status.as_ref().is_some_and(|s| s.ready)
    }

    /// `metadata.deletionTimestamp`: set once the pod is being deleted.
    #[must_use]
    pub fn deletion_timestamp(&self) -> Option<&Time> {
        self.metadata.deletion_timestamp.as_ref()
    }
}

impl From<Pod> for SlimPod {
    fn from(pod: Pod) -> Self {
        let mut metadata = pod.metadata;
        let labels = Pairs::from(metadata.labels.take()).kept(KEPT_POD_LABELS);
        SlimPod {
            metadata: ObjectMeta {
                managed_fields: None,
                annotations: None,
                ..metadata
            },
            labels,
            status: pod.status.map(|s| SlimPodStatus {
                phase: s.phase,
                ready: s
                    .conditions
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True"),
            }),
        }
    }
}

impl Resource for SlimPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Pod".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }

    fn api_version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "pods".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// An object of kind `K` as a cache keeps it: the metadata without `managedFields`, its
/// labels and annotations as [`Pairs`], and the JSON text of its `spec` and `status`.
/// Watched and listed as `K`'s resource; [`Slim::full`] gives the object back as `K`, all
/// of it but `managedFields`.
///
/// It also remembers the `fingerprint` of the one desired
/// object this very version was last found to hold ([`Slim::holds`]), so a reconcile that
/// wants the same again skips parsing and comparing the child: a version never changes,
/// and the next one is a new `Slim` that holds nothing.
pub struct Slim<K> {
    /// The object's metadata, without `managedFields`, labels and annotations.
    pub metadata: ObjectMeta,
    labels: Pairs,
    annotations: Pairs,
    spec: Option<Box<RawValue>>,
    status: Option<Box<RawValue>>,
    /// The fingerprint of the desired object this version holds, 0 for none known.
    holds: AtomicU64,
    kind: PhantomData<fn() -> K>,
}

impl<K> Slim<K> {
    /// The object's labels (`metadata.labels` of the cached object is empty).
    #[must_use]
    pub fn labels(&self) -> &Pairs {
        &self.labels
    }

    /// The object's annotations (`metadata.annotations` of the cached object is empty).
    #[must_use]
    pub fn annotations(&self) -> &Pairs {
        &self.annotations
    }

    /// Whether this version was found to hold every field of the desired object whose
    /// `fingerprint` is `fingerprint` ([`Slim::found_holding`]).
    #[must_use]
    pub fn holds(&self, fingerprint: u64) -> bool {
        fingerprint != 0 && self.holds.load(Ordering::Relaxed) == fingerprint
    }

    /// Records that this version holds every field of the desired object whose
    /// fingerprint is `fingerprint` (the caller compared them, and owns the object).
    pub fn found_holding(&self, fingerprint: u64) {
        self.holds.store(fingerprint, Ordering::Relaxed);
    }
}

fn no_pairs(pairs: &&Pairs) -> bool {
    pairs.is_empty()
}

/// The metadata of a [`Slim`] as it is written out: its `ObjectMeta` (whose labels and
/// annotations are empty) with the kept [`Pairs`] beside it, without copying either.
#[derive(Serialize)]
struct WholeMeta<'a> {
    #[serde(flatten)]
    meta: &'a ObjectMeta,
    #[serde(skip_serializing_if = "no_pairs")]
    labels: &'a Pairs,
    #[serde(skip_serializing_if = "no_pairs")]
    annotations: &'a Pairs,
}

impl<K> Clone for Slim<K> {
    fn clone(&self) -> Self {
        Slim {
            metadata: self.metadata.clone(),
            labels: self.labels.clone(),
            annotations: self.annotations.clone(),
            spec: self.spec.clone(),
            status: self.status.clone(),
            holds: AtomicU64::new(self.holds.load(Ordering::Relaxed)),
            kind: PhantomData,
        }
    }
}

impl<K: Resource<DynamicType = ()>> fmt::Debug for Slim<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slim")
            .field("kind", &K::kind(&()))
            .field("metadata", &self.metadata)
            .field("labels", &self.labels)
            .field("annotations", &self.annotations)
            .field("spec", &self.spec.as_deref().map(RawValue::get))
            .field("status", &self.status.as_deref().map(RawValue::get))
            .finish()
    }
}

/// A fingerprint of `desired` (a hash of its JSON, never 0), to remember which desired
/// object a cached child was found to hold ([`Slim::holds`]). Equal objects have equal
/// fingerprints within one process.
///
/// # Errors
/// [`crate::Error::Serialize`] when `desired` does not serialize.
pub(crate) fn fingerprint<K: Resource + Serialize>(desired: &K) -> Result<u64, crate::Error> {
    use std::hash::{Hash, Hasher};
    let json = serde_json::to_vec(desired).map_err(|source| crate::Error::Serialize {
        what: format!("desired {:?}", desired.meta().name),
        source,
    })?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    json.hash(&mut hasher);
    Ok(hasher.finish().max(1))
}

/// The fields of a `Slim` on the wire: everything but `apiVersion` and `kind`.
#[derive(Deserialize, Serialize)]
struct Parts<M, R> {
    #[serde(default)]
    metadata: M,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spec: Option<R>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<R>,
}

impl<'de, K> Deserialize<'de> for Slim<K> {
    /// Keeps, of the object the API server sent, its identity and controller, the labels,
    /// annotations and `spec` fields this operator's field manager owns (see [`projection`]),
    /// and its `status`, each within its bound; everything else is read and dropped.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        #[derive(Deserialize)]
        struct Wire {
            #[serde(default)]
            metadata: Option<Value>,
            #[serde(default)]
            spec: Option<Value>,
            #[serde(default)]
            status: Option<Box<RawValue>>,
        }
        let wire = Wire::deserialize(d)?;
        let mut metadata = match wire.metadata {
            Some(Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        };
        let managed = metadata
            .remove("managedFields")
            .filter(|m| m.as_array().is_some_and(|a| !a.is_empty()));
        let labels = metadata.remove("labels").unwrap_or(Value::Null);
        let annotations = metadata.remove("annotations").unwrap_or(Value::Null);
        let (labels, annotations, spec) = match managed {
            // From an API server: only what our field manager owns.
            Some(managed) => {
                let owned = projection::field_manager()
                    .and_then(|m| projection::owned_fields(&managed, m))
                    .unwrap_or_else(|| Value::Object(serde_json::Map::new()));
                let meta = owned.get("f:metadata");
                let pick = |value: Value, key: &str| match meta.and_then(|m| m.get(key)) {
                    Some(fields) => projection::project(&value, fields),
                    None => Value::Null,
                };
                let spec = wire.spec.map(|spec| {
                    let mut kept = match owned.get("f:spec") {
                        Some(fields) => projection::project(&spec, fields),
                        None => Value::Object(serde_json::Map::new()),
                    };
                    projection::keep_small_scalars(&spec, &mut kept);
                    kept
                });
                (
                    pick(labels, "f:labels"),
                    pick(annotations, "f:annotations"),
                    spec,
                )
            }
            // Built by hand (tests, fixtures): kept as they are, within the bounds.
            None => (labels, annotations, wire.spec),
        };
        let mut meta: LeanMeta =
            serde_json::from_value(Value::Object(metadata)).map_err(D::Error::custom)?;
        bound_meta(&mut meta);
        let pairs = |v: Value| -> Result<Pairs, D::Error> {
            let p = Pairs::deserialize(v).map_err(D::Error::custom)?;
            Ok(if p.bytes() > projection::MAX_KEPT_PAIRS {
                Pairs::default()
            } else {
                p
            })
        };
        let spec = spec
            .map(|s| serde_json::value::to_raw_value(&s).map_err(D::Error::custom))
            .transpose()?
            .filter(|s| s.get().len() <= projection::MAX_KEPT_SPEC);
        let status = wire
            .status
            .filter(|s| s.get().len() <= projection::MAX_KEPT_STATUS);
        Ok(Slim {
            metadata: meta.into(),
            labels: pairs(labels)?,
            annotations: pairs(annotations)?,
            spec,
            status,
            holds: AtomicU64::new(0),
            kind: PhantomData,
        })
    }
}

/// Bounds what a cached object's metadata keeps whatever its content: only the controller
/// owner reference (the API server allows one), the first [`projection::MAX_KEPT_FINALIZERS`]
/// finalizers, no `generateName` or `selfLink`.
fn bound_meta(meta: &mut LeanMeta) {
    if let Some(refs) = &mut meta.owner_references {
        refs.retain(|r| r.controller == Some(true));
        refs.truncate(1);
        refs.shrink_to_fit();
    }
    if let Some(finalizers) = &mut meta.finalizers {
        finalizers.truncate(projection::MAX_KEPT_FINALIZERS);
        finalizers.shrink_to_fit();
    }
    meta.generate_name = None;
    meta.self_link = None;
}

impl<K: Resource<DynamicType = ()> + DeserializeOwned + Serialize> Slim<K> {
    /// The object as `K`, parsed from the kept JSON.
    ///
    /// The kept fields of the spec are those our field manager owns: when someone else took
    /// over a field `K` requires (its spec then does not parse), the object comes without
    /// its spec, which a comparison with the desired one finds out of sync.
    ///
    /// # Errors
    /// [`crate::Error::Serialize`] if the kept metadata and status are not a `K` (they came
    /// from one).
    pub fn full(&self) -> Result<K, crate::Error> {
        let parse = |spec: Option<&RawValue>| {
            let parts = Parts {
                metadata: WholeMeta {
                    meta: &self.metadata,
                    labels: &self.labels,
                    annotations: &self.annotations,
                },
                spec,
                status: self.status.as_deref(),
            };
            serde_json::to_string(&parts).and_then(|text| serde_json::from_str(&text))
        };
        parse(self.spec.as_deref())
            .or_else(|_| parse(None))
            .map_err(|source| crate::Error::Serialize {
                what: format!("cached {} {:?}", K::kind(&()), self.metadata.name),
                source,
            })
    }

    /// The compact form of `object`, as the cache would hold it.
    ///
    /// # Errors
    /// [`crate::Error::Serialize`] if `object` does not serialise.
    pub fn from_full(object: &K) -> Result<Self, crate::Error> {
        serde_json::to_string(object)
            .and_then(|text| serde_json::from_str(&text))
            .map_err(|source| crate::Error::Serialize {
                what: format!("{} {:?}", K::kind(&()), object.meta().name),
                source,
            })
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Slim<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(_: &()) -> Cow<'_, str> {
        K::kind(&())
    }

    fn group(_: &()) -> Cow<'_, str> {
        K::group(&())
    }

    fn version(_: &()) -> Cow<'_, str> {
        K::version(&())
    }

    fn api_version(_: &()) -> Cow<'_, str> {
        K::api_version(&())
    }

    fn plural(_: &()) -> Cow<'_, str> {
        K::plural(&())
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use kube::ResourceExt;

    fn running_pod() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u1",
                "labels": {"app": "x"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "o1", "controller": true}],
                "managedFields": [{"manager": "m", "operation": "Apply"}]
            },
            "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}], "nodeName": "n"},
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.1",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"}
                ],
                "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0, "image": "busybox", "imageID": ""}]
            }
        })
    }

    #[test]
    fn parses_what_reconciles_read_and_skips_the_rest() {
        let pod: SlimPod = serde_json::from_value(running_pod()).unwrap();
        assert_eq!(pod.name_any(), "p");
        assert_eq!(pod.namespace().as_deref(), Some("ns"));
        assert_eq!(pod.labels().get("app"), Some("x"));
        assert_eq!(pod.owner_references()[0].uid, "o1");
        assert_eq!(pod.phase(), Some("Running"));
        assert!(pod.ready());
        assert!(pod.deletion_timestamp().is_none());
    }

    #[test]
    fn matches_the_full_pod_it_comes_from() {
        let full: Pod = serde_json::from_value(running_pod()).unwrap();
        let parsed: SlimPod = serde_json::from_value(running_pod()).unwrap();
        assert_eq!(parsed.metadata.managed_fields, None);
        assert_eq!(SlimPod::from(full), parsed);
    }

    /// The field manager of the objects in these tests.
    const MANAGER: &str = "m";

    /// Every field of `ObjectMeta` but `managedFields`, as the API server sends it.
    fn full_metadata() -> serde_json::Value {
        serde_json::json!({
            "annotations": {"a": "1"},
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "deletionGracePeriodSeconds": 30,
            "deletionTimestamp": "2026-01-01T00:01:00Z",
            "finalizers": ["f"],
            "generateName": "g-",
            "generation": 4,
            "labels": {"app": "x"},
            "managedFields": [{"manager": "m", "operation": "Apply", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}}}],
            "name": "n",
            "namespace": "ns",
            "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "o1", "controller": true}],
            "resourceVersion": "42",
            "selfLink": "/x",
            "uid": "u1"
        })
    }

    /// `metadata` (or `null`) as the caches read it, back into an `ObjectMeta`.
    fn lean_meta(metadata: serde_json::Value) -> serde_json::Result<ObjectMeta> {
        Ok(serde_json::from_value::<Option<LeanMeta>>(metadata)?
            .unwrap_or_default()
            .into())
    }

    #[test]
    fn lean_metadata_is_the_object_meta_without_managed_fields() {
        let mut want: ObjectMeta = serde_json::from_value(full_metadata()).unwrap();
        assert!(want.managed_fields.is_some());
        want.managed_fields = None;
        let lean = lean_meta(full_metadata()).unwrap();
        assert_eq!(lean, want);
        // Every field of `ObjectMeta` is set above, so a field `LeanMeta` missed shows here.
        let all = serde_json::to_value(&want).unwrap();
        let without_managed = full_metadata().as_object().unwrap().len() - 1;
        assert_eq!(all.as_object().unwrap().len(), without_managed);
        assert_eq!(
            lean_meta(serde_json::Value::Null).unwrap(),
            ObjectMeta::default()
        );
        // A child keeps of its metadata what the field manager `m` owns (the label `app`),
        // its identity, its controller and finalizers.
        projection::set_field_manager(MANAGER);
        let slim: Slim<k8s_openapi::api::apps::v1::Deployment> =
            serde_json::from_value(serde_json::json!({"metadata": full_metadata()})).unwrap();
        let kept = ObjectMeta {
            annotations: None,
            generate_name: None,
            self_link: None,
            ..want
        };
        assert_eq!(slim.full().unwrap().metadata, kept);
        assert_eq!(slim.clone().full().unwrap().metadata, kept);
        // Kept apart, not twice.
        assert_eq!(
            (slim.metadata.labels, slim.metadata.annotations),
            (None, None)
        );
        assert_eq!(slim.labels.get("app"), Some("x"));
        assert_eq!(slim.annotations.get("a"), None);
    }

    #[test]
    fn pairs_are_read_sorted_and_found_by_key() {
        let pairs: Pairs =
            serde_json::from_str(r#"{"b": "2", "a": "1", "c\u0021": "3", "a": "last"}"#).unwrap();
        assert_eq!(
            pairs.iter().collect::<Vec<_>>(),
            [("a", "last"), ("b", "2"), ("c!", "3")],
            "sorted, a repeated key counts once with its last value, escapes read"
        );
        assert_eq!(
            (pairs.get("a"), pairs.get("c!"), pairs.get("d")),
            (Some("last"), Some("3"), None)
        );
        assert_eq!(pairs.len(), 3);
        let map = pairs.to_map().unwrap();
        assert_eq!(Pairs::from(Some(map)), pairs);
        let none: Pairs = serde_json::from_str("null").unwrap();
        assert!(none.is_empty());
        assert_eq!(none.to_map(), None);
        assert_eq!(Pairs::from(None), none);
        assert!(serde_json::from_str::<Pairs>(r#"{"a": 1}"#).is_err());
    }

    #[test]
    fn a_pod_keeps_its_labels_apart_and_no_annotations() {
        let mut json = running_pod();
        json["metadata"]["annotations"] = serde_json::json!({"note": "x"});
        let pod: SlimPod = serde_json::from_value(json).unwrap();
        assert_eq!(pod.metadata.labels, None);
        assert_eq!(pod.metadata.annotations, None);
        assert_eq!(pod.labels().get("app"), Some("x"));
    }

    #[test]
    fn a_pod_without_status_or_conditions_is_not_ready() {
        let bare: SlimPod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}})).unwrap();
        assert!(!bare.ready());
        assert_eq!(bare.phase(), None);
        let pending: SlimPod = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Pending", "conditions": null}}),
        )
        .unwrap();
        assert!(!pending.ready());
        assert_eq!(pending.phase(), Some("Pending"));
        let not_ready: SlimPod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}
        }))
        .unwrap();
        assert!(!not_ready.ready());
        // Escaped strings cannot be borrowed from the input; they are read all the same.
        let escaped: SlimPod = serde_json::from_str(
            r#"{"metadata": {"name": "p"}, "status": {"conditions": [
                {"type": "PodScheduled", "status": "True", "reason": "x"},
                {"type": "Re\u0061dy", "status": "Tru\u0065", "lastTransitionTime": null}]}}"#,
        )
        .unwrap();
        assert!(escaped.ready());
        let bad =
            serde_json::from_str::<SlimPod>(r#"{"status": {"conditions": {"type": "Ready"}}}"#);
        assert!(
            bad.unwrap_err()
                .to_string()
                .contains("a list of pod conditions")
        );
    }

    #[test]
    fn is_the_v1_pods_resource() {
        assert_eq!(SlimPod::kind(&()), "Pod");
        assert_eq!(SlimPod::api_version(&()), "v1");
        assert_eq!(SlimPod::plural(&()), "pods");
        assert_eq!(
            SlimPod::url_path(&(), Some("ns")),
            "/api/v1/namespaces/ns/pods"
        );
    }

    fn deployment() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "ns", "generation": 2, "labels": {"app": "x"}},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "x"}},
                "template": {
                    "metadata": {"labels": {"app": "x"}},
                    "spec": {"containers": [{"name": "c", "image": "memcached", "ports": [{"containerPort": 11211, "protocol": "TCP"}]}]}
                }
            },
            "status": {"replicas": 3, "readyReplicas": 2, "observedGeneration": 2}
        })
    }

    #[test]
    fn a_slim_child_gives_back_the_whole_object() {
        use k8s_openapi::api::apps::v1::Deployment;
        let full: Deployment = serde_json::from_value(deployment()).unwrap();
        let slim: Slim<Deployment> = serde_json::from_value(deployment()).unwrap();
        assert_eq!(slim.name_any(), "d");
        assert_eq!(slim.metadata.generation, Some(2));
        assert_eq!(slim.full().unwrap(), full);
        let again = Slim::<Deployment>::from_full(&full).unwrap();
        assert_eq!(again.full().unwrap(), full);
        assert_eq!(
            Slim::<Deployment>::url_path(&(), Some("ns")),
            "/apis/apps/v1/namespaces/ns/deployments"
        );
        assert_eq!(Slim::<Deployment>::kind(&()), "Deployment");
    }

    #[test]
    fn a_slim_child_without_spec_or_status() {
        use k8s_openapi::api::core::v1::Service;
        let slim: Slim<Service> =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "s"}})).unwrap();
        let full = slim.full().unwrap();
        assert_eq!(full.metadata.name.as_deref(), Some("s"));
        assert!(full.spec.is_none() && full.status.is_none());
    }

    #[test]
    fn a_version_remembers_the_desired_object_it_holds_and_the_next_holds_nothing() {
        use k8s_openapi::api::apps::v1::Deployment;
        let desired: Deployment = serde_json::from_value(deployment()).unwrap();
        let mut other = desired.clone();
        other.spec.as_mut().unwrap().replicas = Some(4);
        let (want, not) = (fingerprint(&desired).unwrap(), fingerprint(&other).unwrap());
        assert_ne!(want, not);
        assert_eq!(want, fingerprint(&desired.clone()).unwrap());

        let cached: Slim<Deployment> = serde_json::from_value(deployment()).unwrap();
        assert!(
            !cached.holds(want),
            "a version fresh from a watch holds nothing known"
        );
        cached.found_holding(want);
        assert!(cached.holds(want));
        assert!(
            !cached.holds(not),
            "another desired object is compared afresh"
        );
        assert!(!cached.holds(0));
        assert!(cached.clone().holds(want), "a clone is the same version");
        let next: Slim<Deployment> = serde_json::from_value(deployment()).unwrap();
        assert!(
            !next.holds(want),
            "the next version, from the watch, holds nothing known"
        );
    }
}
