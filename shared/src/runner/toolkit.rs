//! What an operator is ([`Operator`]), what its reconcile gets ([`Toolkit`]) and what the
//! runner asks of its context between reconciles ([`Pacing`]).

use std::fmt::Debug;

use kube::{Api, Client, Resource, ResourceExt, core::object::HasStatus};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    backoff::Progress,
    conditions::HasConditions,
    error::Error,
    events::{Announce, Events},
    runner::metrics::{Metrics, ObjectGauges},
    status::{StatusWrites, status_hash, write_status},
};

/// Names of an operator.
#[derive(Debug, Clone, Copy)]
pub struct Operator {
    /// The operator's name: binary, field manager, event reporter, `deploy/<name>/` folder.
    pub name: &'static str,
    /// The controller's name (the `controller` label of metrics and logs), e.g. `podset`.
    pub controller: &'static str,
}

/// What the runner asks an operator's reconcile context about an object of kind `K` before
/// it folds a trigger into the debounce (`--reconcile-debounce`).
///
/// A spec change (a new `metadata.generation`) is reconciled at once; every other trigger
/// (a child's event, the echo of a status write) is folded, so the pods a reconcile
/// created, coming and becoming Ready one after another, cost one status write rather than
/// one each. How long it is folded depends on where the object stands
/// ([`Pacing::progress`]): the trigger that *completes* a change (the last pod Ready) runs
/// at once, as a person watching `kubectl get` waits for it; one of an object still on
/// its way there is folded for the progress interval (`PROGRESS_INTERVAL`, 15 s), so its
/// progress is written at most that often, however far apart its pods come; any other
/// until the object's triggers have been quiet for the debounce.
pub trait Pacing<K> {
    /// Where `obj` stands, from the caches. Asked only for a trigger the debounce would
    /// fold, so keep it to cache reads, cheapest check first. The reconcile still decides
    /// what is written: a wrong [`Progress::Completes`] costs one reconcile. The default,
    /// [`Progress::Settled`], folds every such trigger until they are quiet. A reconcile
    /// that polls something on the requeue it asks for should not answer
    /// [`Progress::Converging`]: the runner cannot tell that requeue from a watch trigger,
    /// and would fold it for the whole progress interval.
    fn progress(&self, obj: &K) -> Progress {
        let _ = obj;
        Progress::Settled
    }
}

/// The namespace of `obj` when a [`Pacing::progress`] has something to decide: `obj` is
/// not being deleted and its stored status does not say `Ready` for its generation yet.
#[must_use]
pub fn awaiting_ready<K>(obj: &K) -> Option<String>
where
    K: Resource + HasStatus,
    K::Status: HasConditions,
{
    let meta = obj.meta();
    let done = meta.deletion_timestamp.is_some()
        || crate::conditions::says_ready(obj.status(), meta.generation);
    if done { None } else { meta.namespace.clone() }
}

/// What the runner hands an operator to build its reconcile context from.
#[derive(Clone)]
pub struct Toolkit {
    /// The Kubernetes client.
    pub client: Client,
    /// The operator's names (its `name` is the field manager).
    pub operator: Operator,
    /// Status writes the cache has not shown yet ([`Toolkit::publish_status`]); toolkits
    /// that share it skip each other's writes.
    pub status_writes: std::sync::Arc<StatusWrites>,
    /// Event publisher reporting as the operator.
    pub events: Events,
    /// The process's metrics (`/metrics`).
    pub(crate) metrics: Metrics,
}

impl Debug for Toolkit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Toolkit")
            .field("operator", &self.operator)
            .finish_non_exhaustive()
    }
}

impl Toolkit {
    /// The toolkit of `operator` around `client` (the runner's, and a reconcile test's).
    #[must_use]
    pub fn new(client: Client, operator: Operator) -> Self {
        Self {
            events: Events::new(client.clone(), operator.name),
            client,
            operator,
            status_writes: std::sync::Arc::default(),
            metrics: Metrics::new(),
        }
    }

    /// Adds per-object gauges of the operator's own to `/metrics`.
    pub fn add_object_gauges(&self, source: std::sync::Arc<dyn ObjectGauges>) {
        self.metrics.add_object_gauges(source);
    }

    /// `write_status` of `obj` through the API of its namespace, announcing with this
    /// operator's events: the tail of every reconcile.
    ///
    /// # Errors
    /// As the status write.
    pub async fn publish_status<K>(
        &self,
        obj: &K,
        new: &K::Status,
        announced: &[Announce],
    ) -> Result<bool, Error>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + HasStatus
            + DeserializeOwned
            + Clone
            + std::fmt::Debug,
        K::Status: Serialize + PartialEq + HasConditions,
    {
        let api = Api::namespaced(self.client.clone(), &obj.namespace().unwrap_or_default());
        let meta = obj.meta();
        let seen = meta.uid.as_deref().zip(meta.resource_version.as_deref());
        if let Some((uid, version)) = seen
            && self
                .status_writes
                .already_written(uid, version, || status_hash(new))
        {
            tracing::debug!(object = %obj.name_any(), "status already written; the cache lags");
            return Ok(false);
        }
        let after = write_status(&api, &self.events, obj, new, announced).await?;
        if let Some(after) = &after
            && let Some((uid, version)) = seen
            && let Some(hash) = status_hash(new)
        {
            self.status_writes.wrote(uid, version, hash, after);
        }
        Ok(after.is_some())
    }
}
