//! Releasing the finalizer of Memcacheds the operator can no longer reconcile: the
//! namespace-scoped install's answer to a watched namespace deleted while the operator was
//! down.
//!
//! Installed namespace-scoped, the operator reaches each watched namespace through a Role
//! there. Deleting the namespace deletes that Role in the same sweep that marks its
//! Memcacheds deleted; an operator that was down (or rolling) meanwhile starts with its
//! watches of Deployments, Services and pods there refused (403), so the runner never
//! reconciles that namespace, `cache.example.com/finalizer` stays, and the namespace stays
//! Terminating. The same happens to a Memcached deleted in a watched namespace whose Role
//! an admin removed.
//!
//! For each watched namespace, a task follows the scope's watches
//! ([`shared::namespaces::ScopeStatus`]). While the scope is *stranded* (its reconciles
//! held back because a watch fails before its first list, [`is_stranded`]) for longer than
//! [`GRACE`], it lists the namespace's Memcacheds and removes the finalizer from those
//! being deleted, with preconditions on the object's UID, `resourceVersion` and the
//! finalizer's position: an object that changed meanwhile keeps it until the next pass.
//! Nothing else is needed on the way out: the Deployment and Service go by garbage
//! collection through their owner references, and in a namespace being deleted neither a
//! status nor an event could be written anyway.
//!
//! The list and the patch go through the namespaced install's `memcached-operator-finalizer`
//! ClusterRole (get, list, watch and patch of Memcacheds, in every namespace: RBAC cannot
//! follow a namespace's deletion), which outlives the namespace's Role. A scope that
//! reconciles normally costs nothing here: no request until it is stranded.
//!
//! Not covered, by design: a namespace that left `WATCH_NAMESPACE` (no process of this
//! install looks at it any more, and another install may own it) and an operator removed
//! altogether. Delete their Memcacheds while the operator still serves them (`cargo xtask
//! undeploy` does so first).

use std::time::Duration;

use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, ObjectMeta, Patch, PatchParams},
};
use serde_json::json;
use shared::namespaces::ScopeStatus;
use tokio::sync::watch;

use crate::{FINALIZER, api::Memcached};

/// How long a scope must stay stranded before its finalizers are released: the Role of a
/// namespace being re-created, or a failure at startup that the watch's retry clears, is
/// not worth skipping the normal clean-up for.
pub const GRACE: Duration = Duration::from_secs(5);

/// The pause after a pass that found Memcacheds to release (released, or changed meanwhile).
pub const SOON: Duration = Duration::from_secs(5);

/// The longest pause between passes over a namespace that stays stranded with nothing to
/// release (doubling from [`SOON`]): a Memcached deleted there later waits at most this.
pub const MAX_PAUSE: Duration = Duration::from_secs(60);

/// Objects listed per request.
const PAGE: u32 = 500;

/// Whether the runner holds back every reconcile of the scope: a watch has failed before
/// its first full list (a namespace whose Role is gone answers 403), so it has not synced.
/// A scope still listing (no failure yet) or synced (a watch failing later keeps its
/// cache, and the scope still reconciles) is not.
#[must_use]
pub fn is_stranded(status: &ScopeStatus) -> bool {
    !status.synced() && status.failure().is_some()
}

/// A Memcached whose finalizer may be removed: what the removal's preconditions check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stranded {
    /// Its name.
    pub name: String,
    /// Its UID: a Memcached re-created under the same name is another object.
    pub uid: String,
    /// The `resourceVersion` it was seen at: any change meanwhile fails the patch.
    pub resource_version: String,
    /// Where [`FINALIZER`] is in `metadata.finalizers`.
    pub index: usize,
}

/// `meta`, when it describes a Memcached being deleted that carries [`FINALIZER`].
#[must_use]
pub fn stranded(meta: &ObjectMeta) -> Option<Stranded> {
    meta.deletion_timestamp.as_ref()?;
    let index = meta
        .finalizers
        .as_ref()?
        .iter()
        .position(|f| f == FINALIZER)?;
    Some(Stranded {
        name: meta.name.clone()?,
        uid: meta.uid.clone()?,
        resource_version: meta.resource_version.clone()?,
        index,
    })
}

/// The JSON patch that removes the finalizer of `s`, and only from the very version that
/// was seen: it tests the UID, the `resourceVersion` and the finalizer at its index first
/// (the API server applies none of it when a test fails).
#[must_use]
pub fn release_patch(s: &Stranded) -> serde_json::Value {
    let at = format!("/metadata/finalizers/{}", s.index);
    json!([
        {"op": "test", "path": "/metadata/uid", "value": s.uid},
        {"op": "test", "path": "/metadata/resourceVersion", "value": s.resource_version},
        {"op": "test", "path": at, "value": FINALIZER},
        {"op": "remove", "path": at},
    ])
}

/// What one pass over a namespace came to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Finalizers removed.
    pub released: usize,
    /// Memcacheds found stranded but left for the next pass (changed meanwhile, or the
    /// patch failed).
    pub left: usize,
}

impl Pass {
    /// The pause before the next pass, `previous` being the last one.
    #[must_use]
    pub fn next_pause(self, previous: Duration) -> Duration {
        if self.released + self.left > 0 {
            SOON
        } else {
            (previous * 2).clamp(SOON, MAX_PAUSE)
        }
    }
}

/// Follows the scope of `namespace` (`status`) until the runner shuts it down (the status'
/// sender is dropped with the scope's watches), releasing the finalizers of Memcacheds
/// there whenever it stays stranded for longer than [`GRACE`].
pub async fn release_while_stranded(
    client: Client,
    namespace: String,
    mut status: watch::Receiver<ScopeStatus>,
) {
    let api: Api<Memcached> = Api::namespaced(client, &namespace);
    loop {
        if status.wait_for(is_stranded).await.is_err() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(GRACE) => {}
            recovered = status.wait_for(|s| !is_stranded(s)) => {
                if recovered.is_err() {
                    return;
                }
                continue;
            }
        }
        tracing::info!(%namespace, "the namespace cannot be reconciled (its watches fail); releasing the finalizer of its deleted Memcacheds");
        let mut pause = SOON;
        loop {
            let pass = release_pass(&api, &namespace).await;
            pause = pass.next_pause(pause);
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                recovered = status.wait_for(|s| !is_stranded(s)) => {
                    if recovered.is_err() {
                        return;
                    }
                    tracing::info!(%namespace, "the namespace's watches work again; the controller takes over");
                    break;
                }
            }
        }
    }
}

/// Lists the Memcacheds of `namespace` (metadata only, by pages) and releases each one
/// being deleted that carries the finalizer.
async fn release_pass(api: &Api<Memcached>, namespace: &str) -> Pass {
    let mut pass = Pass::default();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = match api.list_metadata(&params).await {
            Ok(page) => page,
            Err(error) => {
                // Without the finalizer ClusterRole (list of Memcacheds) nothing can be
                // done: said at each pass, which backs off as if nothing was found.
                tracing::warn!(%namespace, %error, "cannot list the Memcacheds of a namespace that cannot be reconciled (is the memcached-operator-finalizer ClusterRole bound?); their finalizers stay");
                return pass;
            }
        };
        for s in page.items.iter().filter_map(|m| stranded(&m.metadata)) {
            if release(api, namespace, &s).await {
                pass.released += 1;
            } else {
                pass.left += 1;
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return pass,
        }
    }
}

/// Removes the finalizer of `s` (preconditions in [`release_patch`]); whether it is gone.
async fn release(api: &Api<Memcached>, namespace: &str, s: &Stranded) -> bool {
    let patch = match serde_json::from_value(release_patch(s)) {
        Ok(patch) => Patch::Json::<()>(patch),
        Err(error) => {
            tracing::error!(%error, "the finalizer release patch does not parse (a bug)");
            return false;
        }
    };
    match api.patch(&s.name, &PatchParams::default(), &patch).await {
        Ok(mc) => {
            tracing::info!(%namespace, memcached = %mc.name_any(), "finalizer removed from a Memcached being deleted in a namespace that cannot be reconciled");
            true
        }
        // Gone meanwhile: nothing left to hold.
        Err(kube::Error::Api(e)) if e.code == 404 => true,
        // 409/422: it changed since the list (a test failed); seen again at the next pass.
        Err(kube::Error::Api(e)) if matches!(e.code, 409 | 422) => {
            tracing::debug!(%namespace, memcached = %s.name, error = %e.message, "changed meanwhile; left for the next pass");
            false
        }
        Err(error) => {
            tracing::warn!(%namespace, memcached = %s.name, %error, "cannot remove the finalizer of a Memcached being deleted");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use shared::namespaces::WatchStatus;

    fn watch(kind: &str, synced: bool, error: Option<&str>) -> WatchStatus {
        WatchStatus {
            kind: kind.into(),
            synced,
            error: error.map(Into::into),
        }
    }

    fn scope(watches: Vec<WatchStatus>) -> ScopeStatus {
        ScopeStatus {
            namespace: Some("ns".into()),
            watches,
        }
    }

    #[test]
    fn stranded_only_when_reconciles_are_held_back_by_a_failing_watch() {
        let forbidden = Some("deployments is forbidden");
        // The Role is gone: Memcacheds listed (the ClusterRole), Deployments refused.
        assert!(is_stranded(&scope(vec![
            watch("Memcached", true, None),
            watch("Deployment", false, forbidden),
        ])));
        // Still listing, nothing failed: the controller will reconcile.
        assert!(!is_stranded(&scope(vec![
            watch("Memcached", true, None),
            watch("Deployment", false, None),
        ])));
        // Synced, failing later: the scope keeps its cache and still reconciles (the
        // Memcached watch, through the ClusterRole, brings the deletion).
        assert!(!is_stranded(&scope(vec![
            watch("Memcached", true, None),
            watch("Deployment", true, forbidden),
        ])));
        assert!(!is_stranded(&scope(vec![])));
    }

    fn meta(deleting: bool, finalizers: &[&str]) -> ObjectMeta {
        ObjectMeta {
            name: Some("cache".into()),
            uid: Some("uid-1".into()),
            resource_version: Some("42".into()),
            deletion_timestamp: deleting.then_some(Time(jiff::Timestamp::UNIX_EPOCH)),
            finalizers: Some(finalizers.iter().map(|f| (*f).to_owned()).collect()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn only_deleted_memcacheds_that_carry_the_finalizer() {
        assert_eq!(
            stranded(&meta(true, &["other.example.com/keep", FINALIZER])),
            Some(Stranded {
                name: "cache".into(),
                uid: "uid-1".into(),
                resource_version: "42".into(),
                index: 1,
            })
        );
        assert_eq!(stranded(&meta(false, &[FINALIZER])), None, "not deleted");
        assert_eq!(stranded(&meta(true, &["other.example.com/keep"])), None);
        assert_eq!(stranded(&meta(true, &[])), None);
        let mut no_version = meta(true, &[FINALIZER]);
        no_version.resource_version = None;
        assert_eq!(stranded(&no_version), None, "no precondition, no patch");
    }

    #[test]
    fn the_patch_removes_only_the_version_seen() {
        let s = stranded(&meta(true, &["other.example.com/keep", FINALIZER])).unwrap();
        let patch = release_patch(&s);
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/metadata/uid", "value": "uid-1"},
                {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ])
        );
        // It is a JSON patch kube sends as such.
        let parsed: Patch<()> = Patch::Json(serde_json::from_value(patch).unwrap());
        assert!(matches!(parsed, Patch::Json(_)));
    }

    #[tokio::test]
    async fn a_pass_releases_what_it_can_and_leaves_what_changed() {
        use shared_testing::{Reply, Scripted};
        let item = |name: &str, deleting: bool, finalizers: &[&str]| {
            let mut m = meta(deleting, finalizers);
            m.name = Some(name.into());
            m.uid = Some(format!("uid-{name}"));
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": m})
        };
        let list = json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadataList",
            "metadata": {"resourceVersion": "50"},
            "items": [
                item("changed", true, &[FINALIZER]),
                item("live", false, &[FINALIZER]),
                item("foreign", true, &["other.example.com/keep"]),
                item("gone", true, &["other.example.com/keep", FINALIZER]),
            ],
        });
        let released = serde_json::to_value(crate::fixtures::memcached(1, None)).unwrap();
        let api = Scripted::new([
            Reply::Object(list),
            // A test failed: it changed since the list.
            Reply::error(422, "the test operation failed"),
            Reply::Object(released),
        ]);
        let mcs: Api<Memcached> = Api::namespaced(api.client(), "ns");
        let pass = release_pass(&mcs, "ns").await;
        assert_eq!(
            pass,
            Pass {
                released: 1,
                left: 1
            }
        );
        const PATH: &str = "/apis/cache.example.com/v1alpha1/namespaces/ns/memcacheds";
        assert_eq!(
            api.lines(),
            [
                format!("GET {PATH}"),
                format!("PATCH {PATH}/changed"),
                format!("PATCH {PATH}/gone")
            ]
        );
        let seen = api.seen();
        assert_eq!(seen[2].body[0]["value"], "uid-gone");
        assert_eq!(seen[2].body[3]["path"], "/metadata/finalizers/1");
    }

    #[test]
    fn passes_back_off_while_there_is_nothing_to_release() {
        let nothing = Pass::default();
        let mut pause = SOON;
        let mut pauses = Vec::new();
        for _ in 0..6 {
            pause = nothing.next_pause(pause);
            pauses.push(pause.as_secs());
        }
        assert_eq!(pauses, [10, 20, 40, 60, 60, 60]);
        let busy = Pass {
            released: 0,
            left: 1,
        };
        assert_eq!(busy.next_pause(MAX_PAUSE), SOON);
    }
}
