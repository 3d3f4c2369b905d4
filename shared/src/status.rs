//! The end of every reconcile: write the status it computed, when it changed, and announce
//! the condition transitions with events ([`publish_status`]).
//!
//! The status itself is computed by each operator (its `status` module, pure, with
//! [`Conditions`](crate::conditions::Conditions) and the clock of
//! [`conditions::now`](crate::conditions::now)).

use kube::{Api, Resource, ResourceExt, core::object::HasStatus};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    apply::patch_status,
    conditions::HasConditions,
    error::Error,
    events::{Announce, Events, announcements},
    run::Toolkit,
};

/// Patches the status of `obj` to `new` unless it already is `new`, then publishes the
/// events the condition transitions deserve by the one rule of
/// [`announcements`], for the condition types listed in `announced`. Returns
/// whether the status was written.
///
/// An object deleted meanwhile (`404` on the status write) has nothing left to describe:
/// no write, no event, no error.
///
/// # Errors
/// [`Error::Kube`] when the status patch fails otherwise (`403`, `409`, `422`, ...).
pub async fn publish_status<K>(
    api: &Api<K>,
    events: &Events,
    obj: &K,
    new: &K::Status,
    announced: &[Announce],
) -> Result<bool, Error>
where
    K: Resource<DynamicType = ()> + HasStatus + DeserializeOwned + Clone + std::fmt::Debug,
    K::Status: Serialize + PartialEq + HasConditions,
{
    let old = obj.status();
    match patch_status(api, obj, old, new).await {
        Ok(true) => {}
        Ok(false) => return Ok(false),
        Err(Error::Kube(kube::Error::Api(s))) if s.code == 404 => {
            tracing::debug!(object = %obj.name_any(), "gone before its status was written");
            return Ok(false);
        }
        Err(e) => return Err(e),
    }
    let old = old.map(HasConditions::conditions).unwrap_or_default();
    events
        .announce(obj, &announcements(old, new.conditions(), announced))
        .await;
    Ok(true)
}

impl Toolkit {
    /// [`publish_status`] of `obj` through the API of its namespace, announcing with this
    /// operator's events: the tail of every reconcile.
    ///
    /// # Errors
    /// As [`publish_status`].
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
        publish_status(&api, &self.events, obj, new, announced).await
    }
}
