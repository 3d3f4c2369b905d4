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

use super::LeaderConfig;

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
        let Some(existing) = self.config_maps.get_opt(&self.config.lease_name).await? else {
            return Ok(Some("(lock just deleted)".into()));
        };
        let Some(holder) = existing
            .owner_references()
            .iter()
            .find(|o| o.kind == "Pod")
            .cloned()
        else {
            return Ok(Some("(a lock without an owner Pod)".into()));
        };
        if holder.uid == my_uid {
            // This Pod led before (the process restarted): it still does.
            return Ok(None);
        }
        let alive = self
            .pods
            .get_opt(&holder.name)
            .await?
            .is_some_and(|p| p.meta().uid.as_deref() == Some(holder.uid.as_str()));
        if !alive {
            // The owner is gone but garbage collection has not removed the lock yet:
            // delete exactly that lock (precondition on its UID) and try again.
            let precondition = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: existing.meta().uid.clone(),
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
