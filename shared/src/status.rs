//! The end of every reconcile: write the status it computed, when it changed, and announce
//! the condition transitions with events (`write_status`).
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
///
/// The `resourceVersion` each write left the object at is kept too: the watch event of
/// exactly that version is the echo of the write, which holds nothing the reconcile that
/// wrote it did not know, so it does not trigger another (`take_echo`);
/// the cache then holds the write, and the entry goes.
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
    /// `resourceVersion` the write left the object at.
    after: String,
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

    /// Whether version `version` of object `uid`, just cached, is the one a remembered
    /// write left it at: the echo of that write. The write is then forgotten (the cache
    /// holds it).
    pub(crate) fn take_echo(&self, uid: &str, version: &str) -> bool {
        let Ok(mut written) = self.written.lock() else {
            return false;
        };
        let echo = written.get(uid).is_some_and(|w| w.after == version);
        if echo {
            written.remove(uid);
        }
        echo
    }

    /// Records that `new` (hashed) was written from version `version` of `uid`, leaving it
    /// at version `after`.
    pub(crate) fn wrote(&self, uid: &str, version: &str, new: u64, after: &str) {
        if let Ok(mut written) = self.written.lock() {
            let at = Instant::now();
            written.touched(at);
            written.insert(
                uid,
                Written {
                    before: version.to_owned(),
                    status: new,
                    after: after.to_owned(),
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
/// the `resourceVersion` the write left the object at (empty if the answer had none),
/// `None` when nothing was written.
///
/// An object deleted meanwhile (`404` on the status write) has nothing left to describe:
/// no write, no event, no error.
///
/// # Errors
/// [`Error::Kube`] when the status patch fails otherwise (`403`, `409`, `422`, ...).
pub(crate) async fn write_status<K>(
    api: &Api<K>,
    events: &Events,
    obj: &K,
    new: &K::Status,
    announced: &[Announce],
) -> Result<Option<String>, Error>
where
    K: Resource<DynamicType = ()> + HasStatus + DeserializeOwned + Clone + std::fmt::Debug,
    K::Status: Serialize + PartialEq + HasConditions,
{
    let old = obj.status();
    let written = match patch_status(api, obj, old, new).await {
        Ok(Some(written)) => written,
        Ok(None) => return Ok(None),
        Err(Error::Kube(kube::Error::Api(s))) if s.code == 404 => {
            tracing::debug!(object = %obj.name_any(), "gone before its status was written");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let old = old.map(HasConditions::conditions).unwrap_or_default();
    events
        .announce(obj, &announcements(old, new.conditions(), announced))
        .await;
    Ok(Some(written.resource_version().unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_echo_of_a_write_is_the_version_it_left() {
        let writes = StatusWrites::default();
        assert!(!writes.take_echo("u", "11"));
        writes.wrote("u", "10", 7, "11");
        // Not the echo: another object, or someone's later write.
        assert!(!writes.take_echo("v", "11"));
        assert!(!writes.take_echo("u", "12"));
        // Until the echo comes, a reconcile on the cached version 10 sees the write.
        assert!(writes.already_written("u", "10", || Some(7)));
        assert!(!writes.already_written("u", "10", || Some(8)));
        // The echo: forgotten, the cache holds it.
        assert!(writes.take_echo("u", "11"));
        assert!(writes.is_empty());
        assert!(!writes.take_echo("u", "11"));
    }
}
