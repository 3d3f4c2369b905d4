//! The end of every reconcile: write the status it computed, when it changed, and announce
//! the condition transitions with events ([`publish_status`]).
//!
//! The status itself is computed by each operator (its `status` module, pure, with
//! [`Conditions`](crate::conditions::Conditions) and the clock of
//! [`conditions::now`](crate::conditions::now)).

use std::{
    hash::{DefaultHasher, Hash, Hasher},
    sync::Mutex,
    time::{Duration, Instant},
};

use kube::{Api, Resource, ResourceExt, core::object::HasStatus};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    apply::patch_status,
    conditions::HasConditions,
    error::Error,
    events::{Announce, Events, announcements},
    expiring::Expiring,
};

/// The status writes whose watch event has not reached the cache yet, by object UID.
///
/// A reconcile compares the status it computed with the cached object's. When the watch
/// lags behind the operator's own writes (a busy API server), a reconcile that runs
/// between a status write and its watch event sees the old status and writes the same
/// new one again, with its events. Remembering each write (the object's
/// `resourceVersion` before it, and a hash of the status written) lets that reconcile
/// see the cache is behind a write that already holds this status, and skip it. An entry
/// lives until the cache shows a newer version of the object (anyone's write, ours
/// included), so at rest the map is empty.
#[derive(Debug)]
pub struct StatusWrites {
    written: Mutex<Expiring<Written>>,
}

#[derive(Debug)]
struct Written {
    /// `resourceVersion` of the object the write was computed from.
    before: String,
    /// Hash of the status written (its JSON).
    status: u64,
    at: Instant,
}

/// How long a write is remembered at most, in case its object's later versions are
/// never seen (it was deleted).
const REMEMBER_WRITES: Duration = Duration::from_secs(600);

impl Default for StatusWrites {
    fn default() -> Self {
        Self {
            written: Mutex::new(Expiring::new(REMEMBER_WRITES)),
        }
    }
}

impl StatusWrites {
    /// Whether the status hashed by `new` was already written from the version `version`
    /// of object `uid` that the cache still shows. Forgets the write once the cache
    /// shows another version. `new` runs only when a write from `version` is remembered
    /// (rarely: at rest the map is empty), so a reconcile does not serialise its status
    /// for nothing.
    pub(crate) fn already_written(
        &self,
        uid: &str,
        version: &str,
        new: impl FnOnce() -> Option<u64>,
    ) -> bool {
        let Ok(mut written) = self.written.lock() else {
            return false;
        };
        written.prune(Instant::now(), uid, |w| Some(w.at));
        match written.get(uid) {
            Some(w) if w.before == version => new() == Some(w.status),
            Some(_) => {
                written.remove(uid);
                false
            }
            None => false,
        }
    }

    /// Records that `new` (hashed) was written from version `version` of `uid`.
    pub(crate) fn wrote(&self, uid: &str, version: &str, new: u64) {
        if let Ok(mut written) = self.written.lock() {
            let at = Instant::now();
            written.touched(at);
            written.insert(
                uid,
                Written {
                    before: version.to_owned(),
                    status: new,
                    at,
                },
            );
        }
    }

    /// How many writes are remembered.
    #[must_use]
    pub fn len(&self) -> usize {
        self.written.lock().map_or(0, |w| w.len())
    }

    /// Whether none is.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A hash of `status`'s JSON (`None` when it does not serialize).
pub(crate) fn status_hash<S: Serialize>(status: &S) -> Option<u64> {
    let json = serde_json::to_vec(status).ok()?;
    let mut hasher = DefaultHasher::new();
    json.hash(&mut hasher);
    Some(hasher.finish())
}

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
