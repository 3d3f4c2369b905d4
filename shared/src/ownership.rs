//! Never adopting what we did not create: before a child is written, whoever already holds
//! its name is looked at, and only a child controlled by this very custom resource (its
//! controller owner reference carries the custom resource's UID) is written to.
//!
//! `decide` is the pure decision; `claim` (what the `children` kit calls before it
//! writes a child) finds the object (the label-filtered cache first, one GET only when the
//! cache does not show the name) and decides.
//!
//! A leftover (the child of an earlier custom resource of the same name) is looked at
//! again later (`leftover_recheck`, through
//! `Children::leftover_recheck`), less and less often while it stays.

use std::{
    fmt::Debug,
    sync::{Arc, LazyLock},
    time::{Duration, Instant},
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::ErrorBackoff;

/// How long to wait before the first look again at a leftover (the child of an earlier
/// custom resource of the same name); each further look while it stays waits twice as
/// long, up to 5 minutes. Garbage
/// collection normally removes a leftover and its deletion (it carries the operator's
/// labels) triggers a reconcile; a leftover whose labels someone removed is not in the
/// label-filtered watch, so its deletion announces nothing, and only these looks bring the
/// reconcile back. One that never goes (stuck Terminating behind a finalizer nobody
/// removes) costs a look every 5 minutes, not every 5 s.
pub const LEFTOVER_RECHECK: Duration = Duration::from_secs(5);

/// The longest wait between two looks at a [`Claim::Leftover`].
pub(crate) const LEFTOVER_RECHECK_MAX: Duration = Duration::from_secs(300);

/// Per custom resource, how often its leftover was looked at: the schedule of the next
/// look ([`LEFTOVER_RECHECK`] doubling to [`LEFTOVER_RECHECK_MAX`]). Entries of custom
/// resources not seen for twice the maximum go (see [`ErrorBackoff`]).
#[derive(Debug)]
pub(crate) struct LeftoverRechecks(ErrorBackoff);

impl Default for LeftoverRechecks {
    fn default() -> Self {
        Self(ErrorBackoff::new(LEFTOVER_RECHECK, LEFTOVER_RECHECK_MAX))
    }
}

impl LeftoverRechecks {
    /// The custom resource `key` still finds a leftover at time `now`: how long to wait
    /// before looking again.
    pub(crate) fn still_there(&self, key: &str, now: Instant) -> Duration {
        self.0.failed_at(key, now)
    }

    /// The custom resource `key` found no leftover: its next one starts the schedule over.
    pub(crate) fn gone(&self, key: &str) {
        self.0.forget(key);
    }

    /// Whether no custom resource has a leftover being looked at.
    #[must_use]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The rechecks of this process: an operator process reconciles one kind, so a custom
/// resource's namespace and name are its key.
static LEFTOVERS: LazyLock<LeftoverRechecks> = LazyLock::new(LeftoverRechecks::default);

/// `namespace/name` of `obj`.
fn key_of<K: Resource>(obj: &K) -> String {
    format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

/// The custom resource `obj` still finds a [`Claim::Leftover`] in the way: how long to wait
/// before its next reconcile looks again (`Action::requeue` of this). 5 s the first time,
/// doubling with each reconcile that still finds one, up to 5 minutes.
#[must_use]
pub(crate) fn leftover_recheck<K: Resource>(obj: &K) -> Duration {
    LEFTOVERS.still_there(&key_of(obj), Instant::now())
}

/// The custom resource `obj` was reconciled and found no leftover: a later one is looked at
/// after 5 s again. Costs nothing while no custom resource waits on a leftover.
pub(crate) fn leftover_gone<K: Resource>(obj: &K) {
    if !LEFTOVERS.is_empty() {
        LEFTOVERS.gone(&key_of(obj));
    }
}

/// Condition reason (and event reason) of a child name held by someone else's object.
pub const REASON_NAME_CONFLICT: &str = "NameConflict";

/// A child name held by an object this custom resource does not control.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameConflict {
    /// The child's kind, e.g. `Service`.
    pub kind: String,
    /// The child's name.
    pub name: String,
    /// The custom resource's kind, e.g. `Lolcow`.
    pub owner_kind: String,
}

impl NameConflict {
    /// What to tell the user: which object is in the way and what to do.
    #[must_use]
    pub fn message(&self) -> String {
        format!(
            "{} {} exists and is not controlled by this {}; it is left untouched: delete or rename it",
            self.kind, self.name, self.owner_kind
        )
    }
}

impl std::fmt::Display for NameConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

/// Who holds a child's name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Claim<C> {
    /// No object has the name: the child may be created.
    Free,
    /// The child is ours (controller owner reference with our UID): it may be updated.
    Ours(C),
    /// A child of an earlier custom resource of the same kind and name (deleted and
    /// recreated): garbage collection removes it, and its deletion triggers a reconcile.
    Leftover,
    /// Someone else's object: never written, reported.
    Conflict(NameConflict),
}

/// Whether `child` has a controller owner reference pointing at `owner` (same UID).
#[must_use]
pub(crate) fn is_ours<C: Resource>(child: &C, owner: &OwnerReference) -> bool {
    crate::apply::is_controlled_by(child, &owner.uid)
}

/// Decides who holds the name of a child, given the object found with that name (`None`:
/// nothing has it) and the controller owner reference the child would carry.
#[must_use]
pub(crate) fn decide<C>(existing: Option<C>, owner: &OwnerReference) -> Claim<C>
where
    C: Resource<DynamicType = ()>,
{
    let Some(existing) = existing else {
        return Claim::Free;
    };
    if is_ours(&existing, owner) {
        return Claim::Ours(existing);
    }
    let earlier_owner = existing.owner_references().iter().any(|r| {
        r.controller == Some(true)
            && r.api_version == owner.api_version
            && r.kind == owner.kind
            && r.name == owner.name
            && r.uid != owner.uid
    });
    if earlier_owner {
        return Claim::Leftover;
    }
    Claim::Conflict(NameConflict {
        kind: C::kind(&()).into_owned(),
        name: existing.name_any(),
        owner_kind: owner.kind.clone(),
    })
}

/// Finds the object named `name` and decides who holds it: `cached` is what the
/// operator's (label-filtered) cache shows under that name; only when it shows nothing is
/// the API server asked (one GET), since an object without the operator's labels is not in
/// the cache. A child in sync therefore costs no read.
///
/// # Errors
/// [`kube::Error`] when the GET fails.
pub(crate) async fn claim<C>(
    api: &Api<C>,
    name: &str,
    cached: Option<Arc<C>>,
    owner: &OwnerReference,
) -> Result<Claim<C>, kube::Error>
where
    C: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let existing = match cached {
        Some(c) => Some(Arc::unwrap_or_clone(c)),
        None => api.get_opt(name).await?,
    };
    Ok(decide(existing, owner))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use kube::api::ObjectMeta;

    fn owner(uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "my.domain/v1alpha1".into(),
            kind: "Lolcow".into(),
            name: "moo".into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn service(refs: Vec<OwnerReference>) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("moo".into()),
                owner_references: (!refs.is_empty()).then_some(refs),
                ..ObjectMeta::default()
            },
            ..Service::default()
        }
    }

    #[test]
    fn nothing_there_is_free() {
        assert_eq!(decide::<Service>(None, &owner("u1")), Claim::Free);
    }

    #[test]
    fn our_controller_reference_is_ours() {
        let s = service(vec![owner("u1")]);
        assert_eq!(decide(Some(s.clone()), &owner("u1")), Claim::Ours(s));
    }

    #[test]
    fn a_stranger_is_a_conflict_naming_the_object() {
        let claim = decide(Some(service(vec![])), &owner("u1"));
        let Claim::Conflict(c) = claim else {
            panic!("expected a conflict, got {claim:?}");
        };
        assert_eq!((c.kind.as_str(), c.name.as_str()), ("Service", "moo"));
        assert_eq!(
            c.message(),
            "Service moo exists and is not controlled by this Lolcow; it is left untouched: delete or rename it"
        );
    }

    #[test]
    fn a_non_controller_reference_to_us_is_not_enough() {
        let mut r = owner("u1");
        r.controller = None;
        assert!(matches!(
            decide(Some(service(vec![r])), &owner("u1")),
            Claim::Conflict(_)
        ));
        let mut r = owner("u1");
        r.controller = Some(false);
        assert!(matches!(
            decide(Some(service(vec![r])), &owner("u1")),
            Claim::Conflict(_)
        ));
    }

    #[test]
    fn someone_elses_controller_is_a_conflict() {
        // Another kind, or the same kind under another name or API group.
        let mut other_kind = owner("u9");
        other_kind.kind = "Deployment".into();
        other_kind.api_version = "apps/v1".into();
        let mut other_name = owner("u9");
        other_name.name = "other".into();
        let mut other_group = owner("u9");
        other_group.api_version = "other.domain/v1".into();
        for r in [other_kind, other_name, other_group] {
            assert!(matches!(
                decide(Some(service(vec![r])), &owner("u1")),
                Claim::Conflict(_)
            ));
        }
    }

    #[test]
    fn a_leftover_is_looked_at_less_and_less_often_until_it_is_gone() {
        let rechecks = LeftoverRechecks::default();
        let t0 = Instant::now();
        let schedule: Vec<u64> = (0..9)
            .map(|i| {
                rechecks
                    .still_there("ns/moo", t0 + Duration::from_secs(i))
                    .as_secs()
            })
            .collect();
        assert_eq!(schedule, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        // Per custom resource.
        assert_eq!(rechecks.still_there("ns/other", t0).as_secs(), 5);
        // Gone: the next leftover of the same custom resource starts over.
        rechecks.gone("ns/moo");
        assert_eq!(rechecks.still_there("ns/moo", t0).as_secs(), 5);
        assert_eq!(rechecks.still_there("ns/moo", t0).as_secs(), 10);
        rechecks.gone("ns/moo");
        rechecks.gone("ns/other");
        assert!(rechecks.is_empty());
    }

    #[test]
    fn the_process_rechecks_key_custom_resources_by_namespace_and_name() {
        let mut lc = service(vec![]);
        lc.metadata.namespace = Some("leftover-test-ns".into());
        lc.metadata.name = Some("leftover-test-name".into());
        assert_eq!(key_of(&lc), "leftover-test-ns/leftover-test-name");
        assert_eq!(leftover_recheck(&lc), LEFTOVER_RECHECK);
        assert_eq!(leftover_recheck(&lc), 2 * LEFTOVER_RECHECK);
        leftover_gone(&lc);
        assert_eq!(leftover_recheck(&lc), LEFTOVER_RECHECK);
        leftover_gone(&lc);
    }

    #[test]
    fn a_child_of_an_earlier_namesake_is_a_leftover() {
        assert_eq!(
            decide(Some(service(vec![owner("u0")])), &owner("u1")),
            Claim::Leftover
        );
    }
}
