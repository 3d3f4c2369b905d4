//! One way to write a child: a reconcile hands [`Children`] its primary and each desired
//! child (built by its pure builders) with the cached child of that name, and gets back
//! what happened to it ([`Child`]: its [`Outcome`] and the child as it now is); at the end
//! [`Children::prune`] deletes the children it made that are no longer desired, and
//! [`Children::problems`] and [`Children::leftover_recheck`] are what the status and the
//! requeue read. (The idea of operator-rs's `ClusterResources`.)
//!
//! For each child the kit:
//! - skips everything when the cached version was already found to hold the same desired
//!   object ([`Slim::holds`]): no parse, no comparison, no request;
//! - claims the name (never adopting a stranger's object: [`ownership`]): the cached object, one GET only when the cache shows
//!   nothing; a stranger's object is never written ([`Problem::NameConflict`]), a child of
//!   an earlier primary of the same name is waited for ([`Outcome::Leftover`]);
//! - writes it only when the cached object lacks a desired field: server-side apply, or
//!   for a change of the count alone of a kind with a `scale` subresource, the count alone
//!   to that subresource ([`Children::apply_scalable`]);
//! - turns a refusal into a value: `403`/`422` are a [`Problem::Refused`] for the status, a
//!   namespace being deleted is [`Outcome::NamespaceTerminating`] (after which nothing more
//!   is sent there), anything else is an error to retry.
//!
//! Children created by name-generation (pods) use [`Children::create`] (slow-start
//! batches) and [`delete`]; a failed write of any kind means the same through
//! [`Outcome::of_error`].

use std::{borrow::Cow, collections::BTreeSet, fmt::Debug, sync::Arc, time::Duration};

use k8s_openapi::{NamespaceResourceScope, apimachinery::pkg::apis::meta::v1::OwnerReference};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, PostParams, Preconditions},
};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    apply::{self, is_controlled_by, namespace_terminating, owner_reference},
    error::Error,
    ownership::{self, Claim},
    slim::{Slim, fingerprint},
};

mod outcome;

use outcome::Current;
pub use outcome::{Child, Outcome, Problem, Refusal};

/// A child name found writable: free, or held by the primary's own child (`current`).
#[derive(Debug)]
struct Slot<K: Resource<DynamicType = ()>> {
    name: String,
    /// The cached version, when the claim read the cache (to remember what it holds).
    cached: Option<Arc<Slim<K>>>,
    /// The primary's own child there; `None`: nothing was seen there (read free, or not
    /// read at all), and the write may only create ([`apply::CREATE_ONLY`]).
    current: Option<K>,
}

/// How a claim learns who holds a name the cache shows nothing under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    /// It does not: the write only creates, and is refused where the name is taken.
    Create,
    /// One GET.
    Read,
}

/// What a write did.
enum Written<K: Resource<DynamicType = ()>> {
    /// The child, as the write left it (or why it was not written).
    Child(Child<K>),
    /// A write that could only create found the name taken (409).
    Taken(kube::Error),
}

/// What a claim found at a child's name.
#[derive(Debug)]
enum Claimed<K: Resource<DynamicType = ()>> {
    /// The child may be written.
    Writable(Slot<K>),
    /// It may not: the outcome says why ([`Outcome::Leftover`], a
    /// [`Problem::NameConflict`], or [`Outcome::NamespaceTerminating`]).
    Blocked(Child<K>),
}

/// The bound list of a kind the kit writes.
pub trait ChildKind:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Serialize
    + DeserializeOwned
    + Clone
    + Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> ChildKind for K where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug
        + Send
        + Sync
        + 'static
{
}

/// The children of one primary, written in one reconcile.
pub struct Children<'a, P> {
    client: Client,
    namespace: String,
    manager: &'a str,
    primary: &'a P,
    owner: OwnerReference,
    /// The (kind, name) of every child desired this reconcile: what [`Children::prune`] keeps.
    desired: BTreeSet<(Cow<'static, str>, String)>,
    problems: Vec<Problem>,
    leftover: bool,
    terminating: bool,
}

impl<P: Resource> Debug for Children<'_, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Children")
            .field("namespace", &self.namespace)
            .field("owner", &self.owner.name)
            .field("problems", &self.problems)
            .field("leftover", &self.leftover)
            .field("terminating", &self.terminating)
            .finish_non_exhaustive()
    }
}

impl<'a, P: Resource<DynamicType = ()>> Children<'a, P> {
    /// The children of `primary` (in its namespace, with its controller owner reference),
    /// written through `client` under the field manager `manager`.
    ///
    /// # Errors
    /// [`Error::MissingMetadata`] when `primary` has no namespace, name or UID.
    pub fn new(client: &Client, manager: &'a str, primary: &'a P) -> Result<Self, Error> {
        let namespace = primary
            .meta()
            .namespace
            .clone()
            .ok_or_else(|| Error::MissingMetadata(primary.name_any()))?;
        Ok(Self {
            client: client.clone(),
            namespace,
            manager,
            owner: owner_reference(primary)?,
            primary,
            desired: BTreeSet::new(),
            problems: Vec::new(),
            leftover: false,
            terminating: false,
        })
    }

    /// The controller owner reference every child carries (for the builders).
    #[must_use]
    pub fn owner(&self) -> OwnerReference {
        self.owner.clone()
    }

    /// Every problem met so far, in the order of the writes.
    #[must_use]
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    /// Whether a write found the namespace being deleted (nothing more is sent there).
    #[must_use]
    pub fn namespace_terminating(&self) -> bool {
        self.terminating
    }

    /// When to look again at a leftover in the way: 5 s ([`ownership::LEFTOVER_RECHECK`]),
    /// doubling with each reconcile of the primary that still meets one, up to 5 min;
    /// `None` when no child met one, which starts the primary's schedule over.
    #[must_use]
    pub fn leftover_recheck(&self) -> Option<Duration> {
        if self.leftover {
            Some(ownership::leftover_recheck(self.primary))
        } else {
            ownership::leftover_gone(self.primary);
            None
        }
    }

    fn api<K: ChildKind>(&self) -> Api<K> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Records `outcome` and returns the child.
    fn record<K: Resource<DynamicType = ()>>(
        &mut self,
        outcome: Outcome,
        current: Option<Current<K>>,
    ) -> Child<K> {
        match &outcome {
            Outcome::Leftover => self.leftover = true,
            Outcome::Problem(p) => self.problems.push(p.clone()),
            Outcome::NamespaceTerminating => self.terminating = true,
            Outcome::Written | Outcome::InSync => {}
        }
        Child { outcome, current }
    }

    /// Writes `desired` unless `cached` (the cache's object of its name) already holds it.
    /// With `cached` `None` (the cache shows nothing under the name) the write may only
    /// create: refused where the name is taken, the name is read and decided then (the
    /// primary's own child not cached yet is written to; anyone else's is a
    /// [`Problem::NameConflict`]). For a kind without a cache, see
    /// [`Children::apply_uncached`].
    ///
    /// # Errors
    /// [`Error::Kube`] on a failure other than those [`Outcome::of_error`] turns into an
    /// outcome; [`Error::Serialize`]/[`Error::MissingMetadata`] for a malformed `desired`.
    pub async fn apply<K: ChildKind>(
        &mut self,
        desired: &K,
        cached: Option<Arc<Slim<K>>>,
    ) -> Result<Child<K>, Error> {
        self.apply_as(desired, cached, false, Look::Create).await
    }

    /// [`Children::apply`] of a kind the operator keeps no cache of (a scaffolded operator's
    /// ConfigMap, whose `data` a [`Slim`] cache would not keep): the name is read first (one
    /// GET), as the child is usually there, then written only if it lacks something of
    /// `desired`. ([`Children::apply`] with `None` means the cache shows nothing there, and
    /// creates without reading.)
    ///
    /// # Errors
    /// As [`Children::apply`].
    pub async fn apply_uncached<K: ChildKind>(&mut self, desired: &K) -> Result<Child<K>, Error> {
        self.apply_as(desired, None, false, Look::Read).await
    }

    /// [`Children::apply`] for a kind with a `scale` subresource over `spec.replicas` (a
    /// Deployment, a StatefulSet): when all the cached child lacks is the desired count (a
    /// `kubectl scale`, an autoscaler), the count alone is applied to that subresource,
    /// under the same field manager and UID precondition, in about half the API server's
    /// time of a whole apply. The field manager needs `patch` on `<resource>/scale`. The
    /// child then reads as the cached one, its count not updated yet.
    ///
    /// # Errors
    /// As [`Children::apply`].
    pub async fn apply_scalable<K: ChildKind>(
        &mut self,
        desired: &K,
        cached: Option<Arc<Slim<K>>>,
    ) -> Result<Child<K>, Error> {
        self.apply_as(desired, cached, true, Look::Create).await
    }

    async fn apply_as<K: ChildKind>(
        &mut self,
        desired: &K,
        cached: Option<Arc<Slim<K>>>,
        scalable: bool,
        look: Look,
    ) -> Result<Child<K>, Error> {
        let name = desired
            .meta()
            .name
            .clone()
            .ok_or_else(|| Error::MissingMetadata(format!("desired {}", K::kind(&()))))?;
        // A version found ours and holding this very object: nothing to look at.
        if !self.terminating
            && let Some(slim) = &cached
            && slim.holds(fingerprint(desired)?)
        {
            self.desired.insert((K::kind(&()), name));
            return Ok(self.record(Outcome::InSync, Some(Current::Cached(Arc::clone(slim)))));
        }
        // With `Look::Create`, where the cache shows nothing under the name: a create that
        // is refused wherever the name is taken, rather than a GET before every create.
        // Refused, the name is read (one GET) and decided: the primary's own child not
        // cached yet is written to, and anything else is what a claim finds (a stranger's,
        // a leftover).
        let written = match self
            .claim_and_write(&name, cached, look, desired, scalable)
            .await?
        {
            Written::Taken(_) if look == Look::Create => {
                self.claim_and_write(&name, None, Look::Read, desired, scalable)
                    .await?
            }
            written => written,
        };
        match written {
            Written::Child(child) => Ok(child),
            // Read free, then taken before the write: the next reconcile.
            Written::Taken(e) => Err(Error::Kube(e)),
        }
    }

    /// [`Children::claim`] of `name`, then the write of `desired` if the name may be
    /// written.
    async fn claim_and_write<K: ChildKind>(
        &mut self,
        name: &str,
        cached: Option<Arc<Slim<K>>>,
        look: Look,
        desired: &K,
        scalable: bool,
    ) -> Result<Written<K>, Error> {
        match self.claim(name, cached, look).await? {
            Claimed::Writable(slot) => self.write_as(slot, desired, scalable).await,
            Claimed::Blocked(child) => Ok(Written::Child(child)),
        }
    }

    /// [`Children::apply`] of a child whose desired state depends on the child holding its
    /// name (PulsarConsumer's count starts from its Deployment's): `build` gets the
    /// primary's own child named `name` (`None`: the name is free), and is called only when
    /// the name may be written. `cached` is the cache's object of that name.
    ///
    /// # Errors
    /// As [`Children::apply`].
    pub async fn apply_with<K: ChildKind>(
        &mut self,
        name: &str,
        cached: Option<Arc<Slim<K>>>,
        build: impl FnOnce(Option<&K>) -> K,
    ) -> Result<Child<K>, Error> {
        match self.claim(name, cached, Look::Read).await? {
            Claimed::Writable(slot) => {
                let desired = build(slot.current.as_ref());
                match self.write_as(slot, &desired, false).await? {
                    Written::Child(child) => Ok(child),
                    // Read free, then taken before the write: the next reconcile.
                    Written::Taken(e) => Err(Error::Kube(e)),
                }
            }
            Claimed::Blocked(child) => Ok(child),
        }
    }

    /// Who holds the child name `name`: `cached` is the cache's object of that name; only
    /// when it shows nothing is the API server asked (one GET), or with [`Look::Create`]
    /// not even then: the slot is unread, and its write may only create. The name counts
    /// as desired this reconcile ([`Children::prune`] keeps it).
    async fn claim<K: ChildKind>(
        &mut self,
        name: &str,
        cached: Option<Arc<Slim<K>>>,
        look: Look,
    ) -> Result<Claimed<K>, Error> {
        self.desired.insert((K::kind(&()), name.to_owned()));
        if self.terminating {
            return Ok(Claimed::Blocked(
                self.record(Outcome::NamespaceTerminating, None),
            ));
        }
        if cached.is_none() && look == Look::Create {
            return Ok(Claimed::Writable(Slot {
                name: name.to_owned(),
                cached: None,
                current: None,
            }));
        }
        let full = cached.as_ref().map(|c| c.full()).transpose()?.map(Arc::new);
        let outcome = match ownership::claim(&self.api::<K>(), name, full, &self.owner).await? {
            Claim::Free => {
                return Ok(Claimed::Writable(Slot {
                    name: name.to_owned(),
                    cached: None,
                    current: None,
                }));
            }
            Claim::Ours(current) => {
                return Ok(Claimed::Writable(Slot {
                    name: name.to_owned(),
                    cached,
                    current: Some(current),
                }));
            }
            Claim::Leftover => {
                tracing::info!(kind = %K::kind(&()), child = %name, "waiting for the child of an earlier namesake to go");
                Outcome::Leftover
            }
            Claim::Conflict(conflict) => {
                tracing::debug!(%conflict, "child name taken");
                Outcome::Problem(Problem::NameConflict(conflict))
            }
        };
        Ok(Claimed::Blocked(self.record(outcome, None)))
    }

    /// Server-side applies `desired` (or its count) to the name `slot` claimed, unless the
    /// child there already holds every field of it.
    async fn write_as<K: ChildKind>(
        &mut self,
        slot: Slot<K>,
        desired: &K,
        scalable: bool,
    ) -> Result<Written<K>, Error> {
        let Slot {
            name,
            cached,
            current,
        } = slot;
        let kind = K::kind(&());
        if self.terminating {
            return Ok(Written::Child(self.record(
                Outcome::NamespaceTerminating,
                current.map(Current::Object),
            )));
        }
        let api = self.api::<K>();
        let written = if scalable {
            apply::apply_scalable(&api, self.manager, desired, current.as_ref()).await
        } else {
            apply::apply(&api, self.manager, desired, current.as_ref()).await
        };
        let (outcome, now) = match written {
            Ok(Some(object)) => {
                let what = if current.is_none() {
                    "created"
                } else {
                    "updated"
                };
                tracing::info!(%kind, child = %name, "{what} the child");
                (Outcome::Written, Some(Current::Object(object)))
            }
            Ok(None) => {
                tracing::trace!(%kind, child = %name, "child in sync");
                // Remembered: the next reconcile wanting the same skips the comparison.
                if let Some(slim) = cached {
                    slim.found_holding(fingerprint(desired)?);
                }
                (Outcome::InSync, current.map(Current::Object))
            }
            // Only a create carries no UID, and only a create can find its name taken.
            Err(Error::Kube(kube::Error::Api(s))) if s.code == 409 && current.is_none() => {
                tracing::debug!(%kind, child = %name, "child name taken; reading it");
                return Ok(Written::Taken(kube::Error::Api(s)));
            }
            Err(Error::Kube(e)) => {
                let outcome = Outcome::of_error(e)?;
                if let Outcome::Problem(p) = &outcome {
                    tracing::info!(%kind, child = %name, reason = p.reason(), message = %p.message(), "the child was refused");
                }
                (outcome, current.map(Current::Object))
            }
            Err(e) => return Err(e),
        };
        Ok(Written::Child(self.record(outcome, now)))
    }

    /// Deletes each of `cached` (the cache's children of kind `K` that may be this
    /// primary's) that is controlled by this primary and was not desired this reconcile
    /// (applied or claimed): exactly the version cached ([`delete`] with its UID and
    /// resourceVersion). Nothing once the namespace is being deleted.
    ///
    /// # Errors
    /// [`Error::Kube`] when a delete fails otherwise.
    pub async fn prune<K: ChildKind>(
        &mut self,
        cached: impl IntoIterator<Item = Arc<Slim<K>>>,
    ) -> Result<(), Error> {
        for child in cached {
            let name = child.name_any();
            let key = (K::kind(&()), name);
            if self.terminating
                || !is_controlled_by(child.as_ref(), &self.owner.uid)
                || self.desired.contains(&key)
            {
                continue;
            }
            let (kind, name) = key;
            let exactly = Preconditions {
                uid: child.uid(),
                resource_version: child.resource_version(),
            };
            if delete(&self.api::<K>(), &name, exactly).await? {
                tracing::info!(%kind, child = %name, "deleted the child: no longer desired");
            }
        }
        Ok(())
    }

    /// Creates `count` objects from `desired` (a child named by `generateName`), handing
    /// each created one to `created`: in batches of 1, 2, 4, 8, 16, ... sent at once (the
    /// ReplicaSet controller's slow start: a refused create costs one request, not
    /// `count`, and a burst goes out in a few round trips); stops after the batch in which
    /// one failed. Returns [`Outcome::Written`] when all were created ([`Outcome::InSync`]
    /// for none), else the first failure's outcome.
    ///
    /// # Errors
    /// [`Error::Kube`] when the first failure in its batch is not one
    /// [`Outcome::of_error`] turns into an outcome.
    pub async fn create<K: ChildKind>(
        &mut self,
        desired: &K,
        count: usize,
        mut created: impl FnMut(K),
    ) -> Result<Outcome, Error> {
        if self.terminating {
            return Ok(Outcome::NamespaceTerminating);
        }
        let api = self.api::<K>();
        let params = PostParams {
            field_manager: Some(self.manager.to_owned()),
            ..PostParams::default()
        };
        let (mut left, mut batch) = (count, 1);
        while left > 0 {
            let size = batch.min(left);
            let answers =
                futures::future::join_all((0..size).map(|_| api.create(&params, desired))).await;
            let mut ended = None;
            for answer in answers {
                match answer {
                    Ok(object) => created(object),
                    Err(e) => {
                        ended.get_or_insert(Outcome::of_error(e));
                    }
                }
            }
            if let Some(ended) = ended {
                let outcome = ended?;
                return Ok(self.record::<K>(outcome, None).outcome);
            }
            left -= size;
            batch *= 2;
        }
        Ok(if count == 0 {
            Outcome::InSync
        } else {
            Outcome::Written
        })
    }
}

/// Deletes the child `name`, only the object `preconditions` name (its UID, and with a
/// resourceVersion only that version): someone else's object that took the name, or ours
/// changed since it was looked at, is left alone. Returns whether it was deleted: already
/// gone (`404`), no longer the object named (`409`: its watch event brings the reconcile
/// back) or in a namespace being deleted is `false`.
///
/// # Errors
/// [`kube::Error`] when the delete fails otherwise.
pub async fn delete<K: ChildKind>(
    api: &Api<K>,
    name: &str,
    preconditions: Preconditions,
) -> Result<bool, kube::Error> {
    let params = DeleteParams {
        preconditions: Some(preconditions),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => Ok(false),
        Err(e) if namespace_terminating(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    //! The pure parts without a server; the writes against a scripted one.
    #![allow(clippy::unwrap_used)]
    use std::{
        collections::VecDeque,
        sync::{Arc, Mutex},
    };

    use super::*;
    use k8s_openapi::api::{
        apps::v1::{Deployment, DeploymentSpec},
        core::v1::{ConfigMap, Pod, Service},
    };
    use serde_json::{Value, json};

    /// One answer: (code, body), or `None` to echo the request.
    type Reply = Option<(u16, Value)>;

    /// An API server answering from a script.
    #[derive(Clone, Default)]
    struct Script {
        replies: Arc<Mutex<VecDeque<Reply>>>,
        seen: Arc<Mutex<Vec<(String, Value)>>>,
    }

    impl Script {
        fn new(replies: impl IntoIterator<Item = Reply>) -> Self {
            let script = Script::default();
            script.replies.lock().unwrap().extend(replies);
            script
        }

        fn client(&self) -> Client {
            let script = self.clone();
            let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
                let script = script.clone();
                async move {
                    let (parts, body) = request.into_parts();
                    let bytes = body.collect_bytes().await.unwrap();
                    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                    let line = format!("{} {}", parts.method, parts.uri.path());
                    script.seen.lock().unwrap().push((line, body.clone()));
                    let reply = script.replies.lock().unwrap().pop_front();
                    let (code, json) = match reply {
                        Some(Some(answer)) => answer,
                        Some(None) => (200, body),
                        None => (500, failure(500, "unscripted")),
                    };
                    let mut response = http::Response::new(kube::client::Body::from(
                        serde_json::to_vec(&json).unwrap(),
                    ));
                    *response.status_mut() = http::StatusCode::from_u16(code).unwrap();
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            Client::new(service, "default")
        }

        fn lines(&self) -> Vec<String> {
            self.seen
                .lock()
                .unwrap()
                .iter()
                .map(|(l, _)| l.clone())
                .collect()
        }

        fn body(&self, i: usize) -> Value {
            self.seen.lock().unwrap()[i].1.clone()
        }
    }

    fn failure(code: u16, message: &str) -> Value {
        let reason = match code {
            403 => "Forbidden",
            404 => "NotFound",
            409 => "Conflict",
            422 => "Invalid",
            _ => "InternalError",
        };
        serde_json::to_value(kube::core::Status::failure(message, reason).with_code(code)).unwrap()
    }

    fn error(code: u16, message: &str) -> Reply {
        Some((code, failure(code, message)))
    }

    const ECHO: Reply = None;
    const TERMINATING: &str = "services \"moo\" is forbidden: unable to create new content in namespace ns because it is being terminated";
    const SERVICE: &str = "/api/v1/namespaces/ns/services/moo";
    const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/ns/deployments/moo";

    /// The primary: a ConfigMap `name` with UID `uid`.
    fn primary(name: &str, uid: &str) -> ConfigMap {
        let mut p = ConfigMap::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some(uid.into());
        p
    }

    fn service(owner: Option<OwnerReference>, port: i32) -> Service {
        let mut s: Service = serde_json::from_value(json!({
            "metadata": {"name": "moo", "namespace": "ns"},
            "spec": {"ports": [{"port": port}]}
        }))
        .unwrap();
        s.metadata.owner_references = owner.map(|o| vec![o]);
        s
    }

    /// `child` as the cache holds it, with a UID and resourceVersion.
    fn cached<K: ChildKind>(mut child: K) -> Option<Arc<Slim<K>>> {
        child.meta_mut().uid = Some("child-uid".into());
        child.meta_mut().resource_version = Some("7".into());
        Some(Arc::new(Slim::from_full(&child).unwrap()))
    }

    #[tokio::test]
    async fn a_new_child_costs_one_apply_that_may_only_create() {
        let script = Script::new([ECHO]);
        let p = primary("moo", "u1");
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let desired = service(Some(children.owner()), 80);
        let child = children.apply(&desired, None).await.unwrap();
        assert!(matches!(child.outcome, Outcome::Written), "{child:?}");
        assert_eq!(script.lines(), [format!("PATCH {SERVICE}")]);
        // A create carries no UID (the API server would refuse it), and a resourceVersion
        // no object has: refused wherever the name is taken.
        assert!(script.body(0)["metadata"].get("uid").is_none());
        assert_eq!(
            script.body(0)["metadata"]["resourceVersion"],
            apply::CREATE_ONLY
        );
        assert_eq!(child.into_object().unwrap().unwrap().name_any(), "moo");
        assert!(children.problems().is_empty());
        assert_eq!(children.leftover_recheck(), None);
    }

    #[tokio::test]
    async fn a_create_refused_where_the_name_is_taken_reads_it_and_decides() {
        let taken = || error(409, "the object has been modified");
        let p = primary("moo", "u1");
        // A stranger's: one read, a conflict, nothing written.
        let script = Script::new([
            taken(),
            Some((200, serde_json::to_value(service(None, 80)).unwrap())),
        ]);
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let desired = service(Some(children.owner()), 80);
        let child = children.apply(&desired, None).await.unwrap();
        assert!(child.is_held_by_another(), "{child:?}");
        assert_eq!(children.problems()[0].reason(), "NameConflict");
        assert_eq!(
            script.lines(),
            [format!("PATCH {SERVICE}"), format!("GET {SERVICE}")]
        );
        // The primary's own, not cached yet and in sync: nothing more.
        let mut ours = desired.clone();
        ours.metadata.uid = Some("child-uid".into());
        let script = Script::new([taken(), Some((200, serde_json::to_value(&ours).unwrap()))]);
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let child = children.apply(&desired, None).await.unwrap();
        assert!(matches!(child.outcome, Outcome::InSync), "{child:?}");
        assert_eq!(script.lines().len(), 2);
        // The primary's own, changed: applied to that very object.
        let script = Script::new([
            taken(),
            Some((200, serde_json::to_value(&ours).unwrap())),
            ECHO,
        ]);
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let changed = service(Some(children.owner()), 81);
        let child = children.apply(&changed, None).await.unwrap();
        assert!(matches!(child.outcome, Outcome::Written), "{child:?}");
        assert_eq!(script.lines().len(), 3);
        assert_eq!(script.body(2)["metadata"]["uid"], "child-uid");
        assert!(script.body(2)["metadata"].get("resourceVersion").is_none());
        // Gone between the refusal and the read, then taken again: an error, retried.
        let script = Script::new([taken(), error(404, "not found"), taken()]);
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        assert!(children.apply(&desired, None).await.is_err());
        assert_eq!(script.lines().len(), 3);
    }

    #[tokio::test]
    async fn a_kind_without_a_cache_is_read_first() {
        let p = primary("moo", "u1");
        // There and ours, in sync: the read alone.
        let script = Script::new([]);
        let children = Children::new(&script.client(), "op", &p).unwrap();
        let desired = service(Some(children.owner()), 80);
        let mut ours = desired.clone();
        ours.metadata.uid = Some("child-uid".into());
        let script = Script::new([Some((200, serde_json::to_value(&ours).unwrap()))]);
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let child = children.apply_uncached(&desired).await.unwrap();
        assert!(matches!(child.outcome, Outcome::InSync), "{child:?}");
        assert_eq!(script.lines(), [format!("GET {SERVICE}")]);
        // Absent: read, then created.
        let script = Script::new([error(404, "not found"), ECHO]);
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let child = children.apply_uncached(&desired).await.unwrap();
        assert!(matches!(child.outcome, Outcome::Written), "{child:?}");
        assert_eq!(
            script.lines(),
            [format!("GET {SERVICE}"), format!("PATCH {SERVICE}")]
        );
        assert_eq!(
            script.body(1)["metadata"]["resourceVersion"],
            apply::CREATE_ONLY
        );
    }

    #[tokio::test]
    async fn a_child_in_sync_costs_no_request_and_is_then_not_even_compared() {
        let script = Script::new([]);
        let p = primary("moo", "u1");
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let desired = service(Some(children.owner()), 80);
        let slim = cached(desired.clone());
        let child = children.apply(&desired, slim.clone()).await.unwrap();
        assert!(matches!(child.outcome, Outcome::InSync), "{child:?}");
        assert!(
            matches!(child.current, Some(Current::Object(_))),
            "as parsed"
        );
        assert!(slim.as_ref().unwrap().holds(fingerprint(&desired).unwrap()));
        // Again: found holding it, nothing parsed.
        let child = children.apply(&desired, slim).await.unwrap();
        assert!(matches!(child.outcome, Outcome::InSync));
        assert!(matches!(child.current, Some(Current::Cached(_))));
        assert!(script.lines().is_empty(), "{:?}", script.lines());
    }

    #[tokio::test]
    async fn a_changed_child_is_applied_to_that_very_object() {
        let script = Script::new([ECHO]);
        let p = primary("moo", "u1");
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let slim = cached(service(Some(children.owner()), 80));
        let desired = service(Some(children.owner()), 81);
        let child = children.apply(&desired, slim).await.unwrap();
        assert!(matches!(child.outcome, Outcome::Written));
        assert_eq!(script.lines(), [format!("PATCH {SERVICE}")]);
        assert_eq!(script.body(0)["metadata"]["uid"], "child-uid");
    }

    #[tokio::test]
    async fn a_count_alone_goes_to_the_scale_subresource() {
        let deployment = |owner: &OwnerReference, replicas: i32| {
            let mut d: Deployment = serde_json::from_value(json!({
                "metadata": {"name": "moo", "namespace": "ns"},
                "spec": {
                    "selector": {"matchLabels": {"app": "moo"}},
                    "template": {"spec": {"containers": [{"name": "m", "image": "i"}]}}
                }
            }))
            .unwrap();
            d.spec.get_or_insert_with(DeploymentSpec::default).replicas = Some(replicas);
            d.metadata.owner_references = Some(vec![owner.clone()]);
            d
        };
        let script = Script::new([ECHO]);
        let p = primary("moo", "u1");
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let owner = children.owner();
        let child = children
            .apply_scalable(&deployment(&owner, 3), cached(deployment(&owner, 2)))
            .await
            .unwrap();
        assert!(matches!(child.outcome, Outcome::Written));
        assert_eq!(script.lines(), [format!("PATCH {DEPLOYMENT}/scale")]);
        assert_eq!(script.body(0)["spec"]["replicas"], 3);
        assert_eq!(script.body(0)["metadata"]["uid"], "child-uid");
        // The child reads as cached: its count not updated yet.
        let current = child.into_object().unwrap().unwrap();
        assert_eq!(current.spec.unwrap().replicas, Some(2));
    }

    #[tokio::test]
    async fn a_strangers_object_is_a_name_conflict_never_written() {
        let script = Script::new([]);
        let p = primary("moo", "u1");
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let desired = service(Some(children.owner()), 80);
        let child = children
            .apply(&desired, cached(service(None, 80)))
            .await
            .unwrap();
        assert!(child.is_held_by_another() && child.current.is_none());
        assert_eq!(children.problems().len(), 1);
        assert_eq!(children.problems()[0].reason(), "NameConflict");
        assert!(script.lines().is_empty());
    }

    #[tokio::test]
    async fn a_leftover_of_an_earlier_namesake_is_waited_for() {
        let script = Script::new([]);
        // A name no other test uses: the rechecks are the process's.
        let p = primary("leftover-in-children", "u2");
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let mut earlier = children.owner();
        earlier.uid = "u1".into();
        let desired = service(Some(children.owner()), 80);
        let child = children
            .apply(&desired, cached(service(Some(earlier), 80)))
            .await
            .unwrap();
        assert!(matches!(child.outcome, Outcome::Leftover));
        assert!(children.problems().is_empty() && script.lines().is_empty());
        assert_eq!(
            children.leftover_recheck(),
            Some(ownership::LEFTOVER_RECHECK)
        );
        assert_eq!(
            children.leftover_recheck(),
            Some(2 * ownership::LEFTOVER_RECHECK)
        );
        // Gone: the schedule starts over.
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        assert_eq!(children.leftover_recheck(), None);
        children.leftover = true;
        assert_eq!(
            children.leftover_recheck(),
            Some(ownership::LEFTOVER_RECHECK)
        );
        ownership::leftover_gone(&p);
    }

    #[tokio::test]
    async fn refusals_are_problems_with_the_cached_child() {
        for code in [403, 422] {
            let script = Script::new([error(code, "refused")]);
            let p = primary("moo", "u1");
            let mut children = Children::new(&script.client(), "op", &p).unwrap();
            let slim = cached(service(Some(children.owner()), 80));
            let desired = service(Some(children.owner()), 81);
            let child = children.apply(&desired, slim).await.unwrap();
            let Outcome::Problem(Problem::Refused(refusal)) = &child.outcome else {
                panic!("{child:?}")
            };
            assert_eq!(refusal.code(), code);
            assert!(
                child.current.is_some(),
                "the child as it is, for the status"
            );
            assert_eq!(children.problems().len(), 1);
        }
        let script = Script::new([error(409, "conflict")]);
        let p = primary("moo", "u1");
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let desired = service(Some(children.owner()), 81);
        let slim = cached(service(Some(children.owner()), 80));
        assert!(children.apply(&desired, slim).await.is_err());
    }

    #[tokio::test]
    async fn nothing_more_is_sent_to_a_namespace_being_deleted() {
        let script = Script::new([error(403, TERMINATING)]);
        let p = primary("moo", "u1");
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let desired = service(Some(children.owner()), 80);
        let child = children.apply(&desired, None).await.unwrap();
        assert!(matches!(child.outcome, Outcome::NamespaceTerminating));
        assert!(children.namespace_terminating() && children.problems().is_empty());
        // The next child, a prune, a create: no request.
        let child = children.apply(&desired, None).await.unwrap();
        assert!(matches!(child.outcome, Outcome::NamespaceTerminating));
        let ours = cached(service(Some(children.owner()), 80));
        children.prune(ours).await.unwrap();
        let created = children.create(&Pod::default(), 3, |_| {}).await.unwrap();
        assert!(matches!(created, Outcome::NamespaceTerminating));
        assert_eq!(script.lines().len(), 1, "{:?}", script.lines());
    }

    #[tokio::test]
    async fn a_child_built_from_the_one_holding_its_name() {
        let script = Script::new([ECHO]);
        let p = primary("moo", "u1");
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let owner = children.owner();
        let slim = cached(service(Some(owner.clone()), 80));
        let port = |s: &Service| s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port;
        let child = children
            .apply_with("moo", slim, |current| {
                service(Some(owner.clone()), current.map_or(0, port) + 1)
            })
            .await
            .unwrap();
        assert!(matches!(child.outcome, Outcome::Written));
        assert_eq!(script.body(0)["spec"]["ports"][0]["port"], 81);
        // A stranger's: not built, not written.
        let child = children
            .apply_with("moo", cached(service(None, 80)), |_| unreachable!())
            .await
            .unwrap();
        assert!(child.is_problem() && child.is_held_by_another());
        assert_eq!(script.lines().len(), 1);
    }

    #[tokio::test]
    async fn prune_deletes_exactly_our_children_no_longer_desired() {
        let script = Script::new([
            Some((200, json!({"kind": "Status", "status": "Success"}))),
            error(409, "changed"),
        ]);
        let p = primary("moo", "u1");
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let ours = |name: &str| {
            let mut s = service(Some(children.owner()), 80);
            s.metadata.name = Some(name.into());
            cached(s).unwrap()
        };
        let (desired, gone, changed) = (ours("kept"), ours("gone"), ours("changed"));
        let mut strangers = service(None, 80);
        strangers.metadata.name = Some("theirs".into());
        let strangers = cached(strangers).unwrap();
        let wanted = desired.full().unwrap();
        children
            .apply(&wanted, Some(desired.clone()))
            .await
            .unwrap();
        children
            .prune([desired, gone, strangers, changed])
            .await
            .unwrap();
        assert_eq!(
            script.lines(),
            [
                "DELETE /api/v1/namespaces/ns/services/gone",
                "DELETE /api/v1/namespaces/ns/services/changed"
            ]
        );
        assert_eq!(
            script.body(0)["preconditions"],
            json!({"uid": "child-uid", "resourceVersion": "7"})
        );
    }

    #[tokio::test]
    async fn creates_go_in_slow_start_batches_until_one_is_refused() {
        // Batches of 1, 2 and 4: the second create of the third batch is refused.
        let mut replies = vec![ECHO; 4];
        replies.push(error(403, "exceeded quota"));
        replies.extend([ECHO, ECHO]);
        let script = Script::new(replies);
        let p = primary("moo", "u1");
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let mut created = 0;
        let outcome = children
            .create(&Pod::default(), 100, |_: Pod| created += 1)
            .await
            .unwrap();
        assert!(matches!(outcome, Outcome::Problem(Problem::Refused(_))));
        assert_eq!((script.lines().len(), created), (7, 6));
        assert_eq!(children.problems().len(), 1);
        // All created; none to create.
        let script = Script::new(vec![ECHO; 3]);
        let mut children = Children::new(&script.client(), "op", &p).unwrap();
        let all = children
            .create(&Pod::default(), 3, |_: Pod| {})
            .await
            .unwrap();
        assert!(matches!(all, Outcome::Written));
        let none = children
            .create(&Pod::default(), 0, |_: Pod| {})
            .await
            .unwrap();
        assert!(matches!(none, Outcome::InSync));
        assert_eq!(script.lines(), ["POST /api/v1/namespaces/ns/pods"; 3]);
    }

    #[tokio::test]
    async fn a_delete_of_what_is_gone_or_changed_is_no_failure() {
        let script = Script::new([
            error(404, "gone"),
            error(409, "changed"),
            error(500, "down"),
        ]);
        let api: Api<Service> = Api::namespaced(script.client(), "ns");
        let same = || Preconditions {
            uid: Some("u".into()),
            resource_version: None,
        };
        assert!(!delete(&api, "a", same()).await.unwrap());
        assert!(!delete(&api, "a", same()).await.unwrap());
        assert!(delete(&api, "a", same()).await.is_err());
    }
}
