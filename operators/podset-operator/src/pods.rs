//! What the operator keeps of its pods: a few facts per pod ([`PodFacts`]) in an index by
//! the UID of the PodSet controlling it ([`Pods`]), rather than a cached pod object.
//!
//! A reconcile reads of each pod its name, UID (the precondition of its delete), creation
//! time (scale-down order), phase, readiness, whether it is being deleted, and whether it
//! carries our labels. The watch still parses each pod (as a `SlimPod`, briefly); the index
//! keeps about 200 bytes of it, where a cached `SlimPod` and its key in a store took about
//! a kilobyte (docs/performance.md, "How the cost grows with N").

use std::{
    hash::{BuildHasher, Hasher, RandomState},
    sync::LazyLock,
};

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::OwnerReference};
use kube::{Resource, ResourceExt};
use shared::{namespaces::ScopedIndex, slim::SlimPod};

use crate::{api::PodSet, desired};

/// The pods of every watched scope, by the UID of their controller.
pub type Pods = ScopedIndex<SlimPod, PodFacts>;

/// An empty [`Pods`] index. Nothing is kept of a pod no PodSet controls (anyone can label
/// a pod as ours).
#[must_use]
pub fn index() -> Pods {
    ScopedIndex::new(|pod: &SlimPod| Some((podset_uid(pod)?, PodFacts::of(pod))))
}

/// The UID of the PodSet controlling `pod`, if one does.
fn podset_uid(pod: &SlimPod) -> Option<String> {
    let owner = pod
        .owner_references()
        .iter()
        .find(|r| r.controller == Some(true))?;
    is_podset(owner).then(|| owner.uid.clone())
}

/// Whether `owner` names a PodSet (of this API group and version), whatever its UID.
#[must_use]
pub fn is_podset(owner: &OwnerReference) -> bool {
    owner.kind == PodSet::kind(&()) && owner.api_version == PodSet::api_version(&())
}

/// Where a pod is in its life, as far as counting it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// `Pending`, or no phase reported yet.
    Pending,
    /// `Running`.
    Running,
    /// `Succeeded`, `Failed`, `Unknown` or anything else: not a replica.
    Other,
}

/// What a reconcile reads of one pod, besides its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    /// `metadata.uid`: the precondition of its delete.
    pub uid: Option<Box<str>>,
    /// `metadata.creationTimestamp`, in seconds of the epoch (`i64::MIN` when unset).
    pub created: i64,
    /// `status.phase`.
    pub phase: Phase,
    /// Whether its `Ready` condition is `True`.
    pub ready: bool,
    /// Whether it is being deleted (`metadata.deletionTimestamp` set).
    pub terminating: bool,
    /// A keyed hash of its values of our labels' keys ([`labels_hash`]).
    labels: u64,
}

impl PodFacts {
    /// The facts of `pod`.
    #[must_use]
    pub fn of(pod: &SlimPod) -> Self {
        let phase = match pod.phase() {
            None | Some("Pending") => Phase::Pending,
            Some("Running") => Phase::Running,
            Some(_) => Phase::Other,
        };
        let labels = pod.labels();
        Self {
            uid: pod.uid().map(Into::into),
            created: pod
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(i64::MIN, |t| t.0.as_second()),
            phase,
            ready: pod.ready(),
            terminating: pod.deletion_timestamp().is_some(),
            labels: labels_hash(LABEL_KEYS.iter().map(|k| labels.get(k))),
        }
    }

    /// Whether the pod carries every one of `ours`, with its value.
    #[must_use]
    pub fn has(&self, ours: OurLabels) -> bool {
        self.labels == ours.0
    }
}

/// The labels [`desired::pod_labels`] gives the pods of one PodSet, as [`PodFacts::has`]
/// compares them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OurLabels(u64);

impl OurLabels {
    /// The labels of the pods of `ps`.
    #[must_use]
    pub fn of(ps: &PodSet) -> Self {
        let want = desired::pod_labels(ps);
        OurLabels(labels_hash(want.values().map(|v| Some(v.as_str()))))
    }
}

/// One pod of a PodSet as a reconcile reads it: its name and [`PodFacts`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OurPod {
    /// `metadata.name`.
    pub name: String,
    /// The rest of what is read of it.
    pub facts: PodFacts,
}

impl OurPod {
    /// The pods of PodSet `uid` in `namespace`, by name, as `pods` holds them.
    #[must_use]
    pub fn of_podset(pods: &Pods, namespace: &str, uid: &str) -> Vec<OurPod> {
        pods.get(namespace, uid)
            .into_iter()
            .map(|(name, facts)| OurPod { name, facts })
            .collect()
    }

    /// `pod`, as the API server just returned it.
    #[must_use]
    pub fn from_pod(pod: Pod) -> Self {
        let pod = SlimPod::from(pod);
        OurPod {
            name: pod.name_any(),
            facts: PodFacts::of(&pod),
        }
    }
}

/// The keys of the labels every pod of ours carries, in [`desired::pod_labels`]'s order
/// (the same for every PodSet; only the values differ).
static LABEL_KEYS: LazyLock<Vec<String>> =
    LazyLock::new(|| desired::pod_labels_named("").into_keys().collect());

/// The key of [`labels_hash`], new in every process: a tenant cannot make up labels whose
/// hash matches ours.
static LABELS_HASH_KEY: LazyLock<RandomState> = LazyLock::new(RandomState::new);

/// A keyed hash of label values in [`LABEL_KEYS`] order (`None`: the pod lacks that label).
fn labels_hash<'a>(values: impl Iterator<Item = Option<&'a str>>) -> u64 {
    let mut hasher = LABELS_HASH_KEY.build_hasher();
    for value in values {
        match value {
            Some(v) => {
                hasher.write_u8(1);
                hasher.write(v.as_bytes());
                hasher.write_u8(0xff);
            }
            None => hasher.write_u8(0),
        }
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixtures::podset;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use shared_testing::pod_status;

    fn pod(labels: &[(&str, &str)], phase: Option<&str>) -> SlimPod {
        Pod {
            metadata: ObjectMeta {
                name: Some("demo-pod-a".into()),
                namespace: Some("ns".into()),
                uid: Some("pod-uid".into()),
                creation_timestamp: Some(Time(crate::fixtures::t(42))),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                owner_references: Some(vec![OwnerReference {
                    api_version: PodSet::api_version(&()).into_owned(),
                    kind: "PodSet".into(),
                    controller: Some(true),
                    uid: "uid-1".into(),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            spec: None,
            status: phase.map(|p| pod_status(p, p == "Running")),
        }
        .into()
    }

    #[test]
    fn the_facts_of_a_pod() {
        let ps = podset(1);
        let ours = desired::pod_labels(&ps);
        let ours: Vec<(&str, &str)> = ours.iter().map(|(k, v)| (&**k, &**v)).collect();
        let facts = PodFacts::of(&pod(&ours, Some("Running")));
        assert_eq!(facts.uid.as_deref(), Some("pod-uid"));
        assert_eq!(facts.created, 42);
        assert_eq!(facts.phase, Phase::Running);
        assert!(facts.ready && !facts.terminating);
        assert!(facts.has(OurLabels::of(&ps)));
        assert_eq!(PodFacts::of(&pod(&ours, None)).phase, Phase::Pending);
        assert_eq!(
            PodFacts::of(&pod(&ours, Some("Pending"))).phase,
            Phase::Pending
        );
        assert_eq!(
            PodFacts::of(&pod(&ours, Some("Failed"))).phase,
            Phase::Other
        );
        assert_eq!(
            PodFacts::of(&pod(&ours, Some("Unknown"))).phase,
            Phase::Other
        );
        // Filed under its PodSet's UID; a pod another kind controls is not kept.
        let mut p = pod(&ours, None);
        assert_eq!(podset_uid(&p).as_deref(), Some("uid-1"));
        if let Some(owners) = p.metadata.owner_references.as_mut() {
            owners[0].kind = "ReplicaSet".into();
        }
        assert_eq!(podset_uid(&p), None);
    }

    #[test]
    fn labels_are_ours_only_with_every_key_and_value() {
        let ps = podset(1);
        let ours = desired::pod_labels(&ps);
        type Labels = Vec<(String, String)>;
        let with = |edit: &dyn Fn(&mut Labels)| {
            let mut labels: Vec<(String, String)> = ours.clone().into_iter().collect();
            edit(&mut labels);
            let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (&**k, &**v)).collect();
            PodFacts::of(&pod(&labels, Some("Running"))).has(OurLabels::of(&ps))
        };
        assert!(with(&|_| {}));
        assert!(
            with(&|l| l.push(("team".into(), "a".into()))),
            "others' labels are fine"
        );
        assert!(!with(&|l| l[0].1 = "other".into()), "a value edited");
        assert!(
            !with(&|l| {
                l.remove(0);
            }),
            "a label removed"
        );
        assert!(!with(&|l| l[0].1.clear()), "a value emptied");
        // Another PodSet's labels are not this one's.
        let mut other = podset(1);
        other.metadata.name = Some("other".into());
        let ours: Vec<(&str, &str)> = ours.iter().map(|(k, v)| (&**k, &**v)).collect();
        assert!(!PodFacts::of(&pod(&ours, Some("Running"))).has(OurLabels::of(&other)));
    }
}
