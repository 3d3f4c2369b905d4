//! Mode `for-life`: operator-sdk's leader-for-life ConfigMap lock (see the parent module's doc).
//!
//! When the Pod that owns the lock is gone, its lock may be removed and another Pod takes
//! over. Gone means, as operator-sdk (operator-lib's `leader` package) judges it and
//! slightly stricter:
//! - no Pod of that name, or one with another UID (deleted; garbage collection removes its
//!   lock too, a candidate does not wait for it);
//! - phase `Failed` (for instance `Evicted` by the kubelet under node pressure) or
//!   `Succeeded`: terminal, its containers never run again;
//! - not gone while merely being deleted, even past its `deletionTimestamp`: its process
//!   may still be reconciling during its grace period, and a Pod still there after it is
//!   one whose kubelet has not reported its containers stopped (it sets a terminal phase,
//!   or the Pod goes, once they are): operator-sdk takes over from a Pod past its grace
//!   period, which can run two leaders at once;
//! - scheduled on a Node that no longer exists, or whose `Ready` condition is not `True`
//!   (`False`, or `Unknown` when the node stopped reporting: unreachable). This read is
//!   cluster-scoped and optional: without the `nodes get` the for-life RBAC grants, a
//!   warning is logged once and a NotReady node keeps its leader.
//!
//! The candidate then deletes the lock with a UID precondition (only the lock it judged,
//! never one a faster candidate created meanwhile) and creates its own at once. It does not
//! delete the old Pod (operator-lib does, which needs `delete` on Pods): a finished Pod runs
//! nothing, and a Pod on a lost node is the node lifecycle's to remove.
//!
//! Gone is judged from what the API server says, which is not always what runs: a Pod on a
//! NotReady Node (only its kubelet failed, say) or force-deleted (`--grace-period=0
//! --force`, or by the garbage collector of Pods on deleted Nodes) may still run its
//! process. Such an old leader, if it reaches the API server, sees its lock gone at its
//! next check, every retry period, and stops (its process exits when its controllers do
//! not stop within the grace). So a candidate that takes the lock over from another Pod
//! (or finds it gone after another Pod held it) waits [`handover_wait`] before it leads:
//! long enough for that check and that stop. What stays possible is an old leader cut off
//! from the API server at its checks: it cannot write meanwhile, but a reconcile it was
//! running may write once it is reconnected, before its next check (Kubernetes has no
//! fencing token to refuse that write).

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{ConfigMap, Node, Pod},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, PostParams, Preconditions},
};
use tokio::time::Instant;

use super::{
    LeaderConfig, LeaderElectionMode,
    renewal::{Check, Keep, Pace},
};

/// operator-sdk's leader-for-life lock: a ConfigMap owned by the leader's Pod.
#[derive(Debug)]
pub(crate) struct ForLifeLock {
    config_maps: Api<ConfigMap>,
    pods: Api<Pod>,
    nodes: Api<Node>,
    config: LeaderConfig,
    /// This replica's Pod UID, once read: the owner the lock names.
    my_uid: Option<String>,
    /// Whether reading a Node was forbidden already (the warning is logged once).
    nodes_forbidden: bool,
    /// Whether this candidate removed another Pod's lock.
    took_over: bool,
}

/// How long a for-life candidate waits between attempts at most (operator-sdk: 16 s).
const FOR_LIFE_MAX_WAIT: Duration = Duration::from_secs(16);

impl ForLifeLock {
    pub(super) fn new(client: Client, config: LeaderConfig) -> Self {
        // An owner reference cannot cross namespaces: the lock lives beside the Pod.
        let namespace = std::env::var("POD_NAMESPACE")
            .ok()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| config.namespace.clone());
        Self {
            config_maps: Api::namespaced(client.clone(), &namespace),
            pods: Api::namespaced(client.clone(), &namespace),
            nodes: Api::all(client),
            config,
            my_uid: None,
            nodes_forbidden: false,
            took_over: false,
        }
    }

    /// Tries until this Pod holds the lock; returns when it did and may lead (after
    /// [`handover_wait`] when another Pod held the lock before).
    pub(super) async fn acquire(&mut self) -> Instant {
        let mut wait = Duration::from_secs(1);
        let mut last_owner = String::new();
        loop {
            match self.try_acquire().await {
                Ok(None) => {
                    let handover =
                        handover_wait(&self.config, self.took_over || !last_owner.is_empty());
                    if !handover.is_zero() {
                        tracing::info!(lock = %self.config.lease_name, wait = ?handover, "acquired the leader-for-life lock another pod held; waiting for that pod's leader, should it still run, to see it gone and stop");
                        tokio::time::sleep(handover).await;
                    }
                    tracing::info!(lock = %self.config.lease_name, "acquired leadership for life");
                    return Instant::now();
                }
                Ok(Some(owner)) => {
                    if owner != last_owner {
                        tracing::info!(lock = %self.config.lease_name, %owner, "the pod that leads for life still runs; standing by");
                        last_owner = owner;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, lock = %self.config.lease_name, "cannot acquire the leader-for-life lock");
                }
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(FOR_LIFE_MAX_WAIT);
        }
    }

    /// `Ok(None)` when this Pod now holds the lock; `Ok(Some(owner))` when another Pod does.
    async fn try_acquire(&mut self) -> Result<Option<String>, ForLifeError> {
        let pod_name = std::env::var("POD_NAME").map_err(|_| ForLifeError::NoPodName)?;
        let me = self.pods.get(&pod_name).await?;
        let my_uid = me.meta().uid.clone().ok_or(ForLifeError::NoPodUid)?;
        self.my_uid = Some(my_uid.clone());
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: pod_name.clone(),
            uid: my_uid.clone(),
            ..OwnerReference::default()
        };
        let lock = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.config.lease_name.clone()),
                owner_references: Some(vec![owner]),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        // A second create right after removing the lock of a Pod that is gone.
        for _ in 0..2 {
            match self.config_maps.create(&PostParams::default(), &lock).await {
                Ok(_) => return Ok(None),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
            let existing = self.config_maps.get_opt(&self.config.lease_name).await?;
            let holder = match decide(&my_uid, existing.as_ref()) {
                Decision::Lead => return Ok(None),
                Decision::StandBy { owner } => return Ok(Some(owner)),
                Decision::CheckOwner(holder) => holder,
            };
            let Some(gone) = self.owner_gone(&holder).await? else {
                return Ok(Some(holder.name));
            };
            // Delete exactly the lock that was judged (precondition on its UID).
            let precondition = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: existing.and_then(|lock| lock.metadata.uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match self
                .config_maps
                .delete(&self.config.lease_name, &precondition)
                .await
            {
                Ok(_) => {
                    self.took_over = true;
                    tracing::info!(lock = %self.config.lease_name, previous = %holder.name, reason = %gone, "removed the lock of a pod that is gone");
                }
                // Removed already, or replaced by a faster candidate: the create says which.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Some("(a lock just replaced)".into()))
    }

    /// Why the Pod `owner` no longer counts as running the leader, if it does not.
    async fn owner_gone(&mut self, owner: &OwnerReference) -> Result<Option<Gone>, ForLifeError> {
        let pod = self.pods.get_opt(&owner.name).await?;
        let node = match pod_verdict(owner, pod.as_ref()) {
            PodVerdict::Gone(gone) => return Ok(Some(gone)),
            PodVerdict::Runs { node: None } => return Ok(None),
            PodVerdict::Runs { node: Some(node) } => node,
        };
        match self.nodes.get_opt(&node).await {
            Ok(found) => Ok(node_verdict(&node, found.as_ref())),
            Err(kube::Error::Api(s)) if s.code == 403 => {
                if !self.nodes_forbidden {
                    self.nodes_forbidden = true;
                    tracing::warn!(%node, "cannot read the node of the pod that leads for life (apply the leader-for-life RBAC, which grants `get` on nodes): a leader on a NotReady node will not be replaced");
                }
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl Keep for ForLifeLock {
    /// Whether the lock still exists and is owned by this Pod. An API error proves
    /// nothing: leadership for life has no expiry, so the leader keeps leading.
    async fn check(&mut self, _last_held: Instant) -> Check {
        let Some(my_uid) = self.my_uid.clone() else {
            return Check::Lost("this pod's UID is unknown".into());
        };
        match self.config_maps.get_opt(&self.config.lease_name).await {
            Ok(lock) => still_held(&my_uid, lock.as_ref()),
            Err(error) => Check::Unknown(error.to_string()),
        }
    }

    /// Held for the Pod's life: nothing to hand back.
    async fn release(&mut self) {}
}

/// How long a candidate that got the lock waits before it leads: nothing on a fresh lock
/// or its own Pod's; after another Pod held it, the old leader's detection and stop, as
/// its keep loop paces them ([`Pace`]): a retry period until its next check of the lock,
/// its grace to stop its controllers (else its process exits), and as much again for that
/// check's round trip and the exit. 7 s with the default timing.
fn handover_wait(config: &LeaderConfig, another_pod_held_it: bool) -> Duration {
    if !another_pod_held_it {
        return Duration::ZERO;
    }
    let old = Pace::of(LeaderElectionMode::ForLife, config);
    old.period + 2 * old.grace
}

/// What a candidate makes of the lock it could not create (operator-sdk's `Become`,
/// without the I/O).
#[derive(Debug, Clone, PartialEq)]
enum Decision {
    /// The lock is owned by this Pod (its process restarted): it still leads.
    Lead,
    /// Stand by: the lock is gone again or has no owner Pod.
    StandBy {
        /// What the "standing by" log line names as the owner.
        owner: String,
    },
    /// Another Pod owns the lock: whether it is gone ([`pod_verdict`], [`node_verdict`])
    /// decides between standing by and removing its lock.
    CheckOwner(OwnerReference),
}

/// Decides on the existing lock, purely. `my_uid` is this replica's Pod UID; `lock` the
/// ConfigMap read after the create conflicted (`None` when it was deleted in between).
fn decide(my_uid: &str, lock: Option<&ConfigMap>) -> Decision {
    let Some(lock) = lock else {
        return Decision::StandBy {
            owner: "(lock just deleted)".into(),
        };
    };
    let Some(holder) = lock.owner_references().iter().find(|o| o.kind == "Pod") else {
        return Decision::StandBy {
            owner: "(a lock without an owner Pod)".into(),
        };
    };
    if holder.uid == my_uid {
        Decision::Lead
    } else {
        Decision::CheckOwner(holder.clone())
    }
}

/// The leader's check of its own lock, purely: held while the lock names this Pod.
fn still_held(my_uid: &str, lock: Option<&ConfigMap>) -> Check {
    match decide(my_uid, lock) {
        Decision::Lead => Check::Held,
        Decision::StandBy { .. } if lock.is_none() => {
            Check::Lost("the leader-for-life lock was deleted".into())
        }
        Decision::StandBy { .. } => {
            Check::Lost("the leader-for-life lock no longer names this pod".into())
        }
        Decision::CheckOwner(other) => Check::Lost(format!(
            "the leader-for-life lock is now held by pod {}",
            other.name
        )),
    }
}

/// Why the Pod that owns the lock no longer counts as running the leader.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Gone {
    /// No Pod of that name.
    Deleted,
    /// A Pod of that name with another UID.
    Replaced,
    /// Phase `Failed` or `Succeeded`, with the status reason (`Evicted`...).
    Finished {
        phase: String,
        reason: Option<String>,
    },
    /// Its Node does not exist.
    NodeDeleted(String),
    /// Its Node's `Ready` condition is not `True`.
    NodeNotReady { node: String, status: String },
}

impl std::fmt::Display for Gone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Gone::Deleted => write!(f, "the pod was deleted"),
            Gone::Replaced => write!(f, "the pod was replaced by another of the same name"),
            Gone::Finished {
                phase,
                reason: Some(reason),
            } => write!(f, "the pod is {phase} ({reason})"),
            Gone::Finished {
                phase,
                reason: None,
            } => write!(f, "the pod is {phase}"),
            Gone::NodeDeleted(node) => write!(f, "the pod's node {node} no longer exists"),
            Gone::NodeNotReady { node, status } => {
                write!(f, "the pod's node {node} is not ready (Ready={status})")
            }
        }
    }
}

/// What the Pod read by the owner's name says.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PodVerdict {
    /// The owner is gone.
    Gone(Gone),
    /// It may still run the leader; on `node`, which decides next ([`node_verdict`]).
    Runs { node: Option<String> },
}

/// Judges the owner's Pod, purely. `pod` was read by the owner's name.
fn pod_verdict(owner: &OwnerReference, pod: Option<&Pod>) -> PodVerdict {
    let Some(pod) = pod else {
        return PodVerdict::Gone(Gone::Deleted);
    };
    if pod.meta().uid.as_deref() != Some(owner.uid.as_str()) {
        return PodVerdict::Gone(Gone::Replaced);
    }
    let status = pod.status.as_ref();
    if let Some(phase) = status
        .and_then(|s| s.phase.as_deref())
        .filter(|phase| matches!(*phase, "Failed" | "Succeeded"))
    {
        return PodVerdict::Gone(Gone::Finished {
            phase: phase.to_owned(),
            reason: status.and_then(|s| s.reason.clone()),
        });
    }
    // Being deleted, even past its deadline, is not gone: until its kubelet reports its
    // containers stopped (a terminal phase, above) or the Pod goes, its process may run.
    PodVerdict::Runs {
        node: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
    }
}

/// Judges the owner's Node `name`, purely: `node` is what was read (`None`: not found).
/// A Node without a `Ready` condition has not reported yet: not judged.
fn node_verdict(name: &str, node: Option<&Node>) -> Option<Gone> {
    let Some(node) = node else {
        return Some(Gone::NodeDeleted(name.to_owned()));
    };
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))?;
    (ready.status != "True").then(|| Gone::NodeNotReady {
        node: name.to_owned(),
        status: ready.status.clone(),
    })
}

/// Why a leader-for-life attempt failed.
#[derive(Debug, thiserror::Error)]
enum ForLifeError {
    /// The downward API did not provide the Pod's name.
    #[error("leader-for-life needs POD_NAME (and POD_NAMESPACE) from the downward API")]
    NoPodName,
    /// The Pod object has no UID (never happens for a stored object).
    #[error("the operator's Pod has no UID")]
    NoPodUid,
    /// The API call failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use k8s_openapi::{
        api::core::v1::{NodeCondition, NodeStatus, PodSpec, PodStatus},
        apimachinery::pkg::apis::meta::v1::Time,
    };

    use super::*;

    fn pod_owner(name: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: name.into(),
            uid: uid.into(),
            ..OwnerReference::default()
        }
    }

    fn lock(owners: Vec<OwnerReference>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("operator-lock".into()),
                uid: Some("lock-uid".into()),
                owner_references: Some(owners),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    fn pod(name: &str, uid: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: uid.map(Into::into),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    #[test]
    fn lock_of_this_pod_still_leads() {
        let mine = lock(vec![pod_owner("operator-a", "uid-a")]);
        assert_eq!(decide("uid-a", Some(&mine)), Decision::Lead);
    }

    #[test]
    fn lock_gone_or_without_owner_pod_stands_by() {
        assert_eq!(
            decide("uid-a", None),
            Decision::StandBy {
                owner: "(lock just deleted)".into()
            }
        );
        let not_a_pod = OwnerReference {
            kind: "ReplicaSet".into(),
            ..pod_owner("operator", "uid-a")
        };
        for owners in [vec![], vec![not_a_pod]] {
            assert_eq!(
                decide("uid-a", Some(&lock(owners))),
                Decision::StandBy {
                    owner: "(a lock without an owner Pod)".into()
                }
            );
        }
    }

    #[test]
    fn lock_of_another_pod_depends_on_that_pod() {
        let theirs = pod_owner("operator-b", "uid-b");
        assert_eq!(
            decide("uid-a", Some(&lock(vec![theirs.clone()]))),
            Decision::CheckOwner(theirs)
        );
    }

    /// The owner's Pod, running on node `kwok-1`.
    fn running(uid: &str) -> Pod {
        let mut p = pod("operator-b", Some(uid));
        p.spec = Some(PodSpec {
            node_name: Some("kwok-1".into()),
            ..PodSpec::default()
        });
        p.status = Some(PodStatus {
            phase: Some("Running".into()),
            ..PodStatus::default()
        });
        p
    }

    fn runs_on_its_node() -> PodVerdict {
        PodVerdict::Runs {
            node: Some("kwok-1".into()),
        }
    }

    #[test]
    fn owner_pod_deleted_or_replaced_is_gone() {
        let owner = pod_owner("operator-b", "uid-b");
        assert_eq!(pod_verdict(&owner, None), PodVerdict::Gone(Gone::Deleted));
        for other in [running("uid-c"), pod("operator-b", None)] {
            assert_eq!(
                pod_verdict(&owner, Some(&other)),
                PodVerdict::Gone(Gone::Replaced)
            );
        }
    }

    #[test]
    fn running_owner_pod_depends_on_its_node() {
        let owner = pod_owner("operator-b", "uid-b");
        assert_eq!(
            pod_verdict(&owner, Some(&running("uid-b"))),
            runs_on_its_node()
        );
        // Pending and Unknown are not terminal; without a node there is nothing to read.
        for phase in [None, Some("Pending"), Some("Unknown")] {
            let mut p = running("uid-b");
            p.status = Some(PodStatus {
                phase: phase.map(Into::into),
                ..PodStatus::default()
            });
            p.spec = None;
            assert_eq!(
                pod_verdict(&owner, Some(&p)),
                PodVerdict::Runs { node: None },
                "{phase:?}"
            );
        }
    }

    #[test]
    fn evicted_failed_or_succeeded_owner_pod_is_gone() {
        let owner = pod_owner("operator-b", "uid-b");
        let cases = [
            ("Failed", Some("Evicted"), "the pod is Failed (Evicted)"),
            ("Failed", None, "the pod is Failed"),
            ("Succeeded", None, "the pod is Succeeded"),
        ];
        for (phase, reason, says) in cases {
            let mut p = running("uid-b");
            p.status = Some(PodStatus {
                phase: Some(phase.into()),
                reason: reason.map(Into::into),
                ..PodStatus::default()
            });
            let gone = Gone::Finished {
                phase: phase.into(),
                reason: reason.map(Into::into),
            };
            assert_eq!(gone.to_string(), says);
            assert_eq!(pod_verdict(&owner, Some(&p)), PodVerdict::Gone(gone));
        }
    }

    #[test]
    fn owner_pod_being_deleted_is_gone_only_once_its_kubelet_says_it_stopped() {
        let owner = pod_owner("operator-b", "uid-b");
        let deleting = |at: &str| {
            let mut p = running("uid-b");
            p.metadata.deletion_timestamp = Some(Time(at.parse().unwrap()));
            p
        };
        // Within its grace period or past it, its process may still reconcile: not gone
        // (the deadline is not even looked at).
        for deadline in ["2026-01-01T00:01:00Z", "2999-01-01T00:00:00Z"] {
            assert_eq!(
                pod_verdict(&owner, Some(&deleting(deadline))),
                runs_on_its_node(),
                "{deadline}"
            );
        }
        // Its kubelet stopped its containers: a terminal phase.
        let mut stopped = deleting("2026-01-01T00:01:00Z");
        stopped.status = Some(PodStatus {
            phase: Some("Failed".into()),
            ..PodStatus::default()
        });
        assert_eq!(
            pod_verdict(&owner, Some(&stopped)),
            PodVerdict::Gone(Gone::Finished {
                phase: "Failed".into(),
                reason: None
            })
        );
    }

    fn config() -> LeaderConfig {
        LeaderConfig {
            lease_name: "operator-leader".into(),
            namespace: "ns".into(),
            identity: "operator-a".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    #[test]
    fn a_new_leader_waits_for_the_old_one_to_see_its_lock_gone_and_stop() {
        let config = config();
        // A fresh lock, or this Pod's own: no one to wait for.
        assert_eq!(handover_wait(&config, false), Duration::ZERO);
        // Taken over: the old leader checks within a retry period, then stops within its
        // grace or its process exits; the new one waits longer than both.
        let wait = handover_wait(&config, true);
        assert_eq!(wait, Duration::from_secs(7));
        let old = Pace::of(LeaderElectionMode::ForLife, &config);
        assert!(wait > old.period + old.grace, "{wait:?} {old:?}");
    }

    fn node(ready: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("kwok-1".into()),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                conditions: Some(
                    [
                        Some(("MemoryPressure", "False")),
                        ready.map(|status| ("Ready", status)),
                    ]
                    .into_iter()
                    .flatten()
                    .map(|(type_, status)| NodeCondition {
                        type_: type_.into(),
                        status: status.into(),
                        ..NodeCondition::default()
                    })
                    .collect(),
                ),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    #[test]
    fn owner_on_a_node_not_ready_or_gone_is_gone() {
        assert_eq!(node_verdict("kwok-1", Some(&node(Some("True")))), None);
        // Not reported yet: not judged.
        assert_eq!(node_verdict("kwok-1", Some(&node(None))), None);
        for status in ["False", "Unknown"] {
            let gone = node_verdict("kwok-1", Some(&node(Some(status)))).unwrap();
            assert_eq!(
                gone,
                Gone::NodeNotReady {
                    node: "kwok-1".into(),
                    status: status.into()
                }
            );
            assert_eq!(
                gone.to_string(),
                format!("the pod's node kwok-1 is not ready (Ready={status})")
            );
        }
        assert_eq!(
            node_verdict("kwok-1", None),
            Some(Gone::NodeDeleted("kwok-1".into()))
        );
    }

    #[test]
    fn the_leader_keeps_leading_while_its_lock_names_it() {
        let mine = lock(vec![pod_owner("operator-a", "uid-a")]);
        assert_eq!(still_held("uid-a", Some(&mine)), Check::Held);
        let theirs = lock(vec![pod_owner("operator-b", "uid-b")]);
        assert_eq!(
            still_held("uid-a", Some(&theirs)),
            Check::Lost("the leader-for-life lock is now held by pod operator-b".into())
        );
        assert_eq!(
            still_held("uid-a", None),
            Check::Lost("the leader-for-life lock was deleted".into())
        );
        assert_eq!(
            still_held("uid-a", Some(&lock(vec![]))),
            Check::Lost("the leader-for-life lock no longer names this pod".into())
        );
    }
}
