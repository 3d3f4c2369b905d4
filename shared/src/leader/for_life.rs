//! Mode `for-life`: operator-sdk's leader-for-life ConfigMap lock (see the parent module's doc).

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{ConfigMap, Pod},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, PostParams, Preconditions},
};

use tokio::sync::oneshot;

use super::{LeaderConfig, Leadership};

/// operator-sdk's leader-for-life lock: a ConfigMap owned by the leader's Pod.
#[derive(Debug)]
pub struct ForLifeLock {
    config_maps: Api<ConfigMap>,
    pods: Api<Pod>,
    config: LeaderConfig,
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
            pods: Api::namespaced(client, &namespace),
            config,
        }
    }

    pub(super) async fn acquire(&mut self) {
        let mut wait = Duration::from_secs(1);
        let mut last_owner = String::new();
        loop {
            match self.try_acquire().await {
                Ok(None) => {
                    tracing::info!(lock = %self.config.lease_name, "acquired leadership for life");
                    return;
                }
                Ok(Some(owner)) => {
                    if owner != last_owner {
                        tracing::info!(lock = %self.config.lease_name, %owner, "the pod that leads for life still exists; standing by");
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
        let pod = self.pods.get_opt(&holder.name).await?;
        if owner_gone(&holder, pod.as_ref()) {
            // The owner is gone but garbage collection has not removed the lock yet:
            // delete exactly that lock (precondition on its UID) and try again.
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
                    tracing::info!(lock = %self.config.lease_name, previous = %holder.name, "removed the lock of a pod that is gone")
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Some(holder.name))
    }

    /// Leadership held until the Pod is gone: never lost, nothing to hand back on shutdown.
    pub(super) fn keep_leading(self) -> Leadership {
        let (lost_tx, lost) = oneshot::channel();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = stop_rx.await;
            drop(lost_tx);
            None
        });
        Leadership { lost, stop, task }
    }
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
    /// Another Pod owns the lock: whether it still exists ([`owner_gone`]) decides
    /// between standing by and removing its lock.
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

/// Whether the Pod that owns the lock is gone: `pod` (read by the owner's name) is missing,
/// or is another Pod of the same name (a different UID). Its lock may then be removed.
fn owner_gone(owner: &OwnerReference, pod: Option<&Pod>) -> bool {
    pod.is_none_or(|p| p.meta().uid.as_deref() != Some(owner.uid.as_str()))
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

    #[test]
    fn owner_pod_gone_means_take_over_otherwise_stand_by() {
        let owner = pod_owner("operator-b", "uid-b");
        // Still there: stand by.
        assert!(!owner_gone(&owner, Some(&pod("operator-b", Some("uid-b")))));
        // Deleted, or replaced by a new Pod of the same name: the lock may go.
        assert!(owner_gone(&owner, None));
        assert!(owner_gone(&owner, Some(&pod("operator-b", Some("uid-c")))));
        assert!(owner_gone(&owner, Some(&pod("operator-b", None))));
    }
}
