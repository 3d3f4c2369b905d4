//! Which namespaces an operator watches (`WatchNamespaces`), and the [`Scope`] one
//! controller instance runs in.
//!
//! Several namespaces are served by one `Controller` per namespace (each with its own
//! watches of the primary kind and every child kind) rather than by merging watch
//! streams into one store: a watcher's re-list of one namespace would otherwise wipe the
//! other namespaces' objects from the shared store.

use std::{fmt, str::FromStr, sync::Arc};

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{
    Api, Client, Resource,
    runtime::{
        Controller, WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use serde::de::DeserializeOwned;

use crate::status::StatusWrites;

mod index;
mod stores;
mod streaming;
pub use index::ScopedIndex;
pub use stores::ScopedStores;
pub(crate) use streaming::StreamingLists;

/// The namespaces an operator watches, parsed from `WATCH_NAMESPACE`/`--watch-namespace`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum WatchNamespaces {
    /// Every namespace (unset or empty).
    #[default]
    All,
    /// Exactly one namespace.
    One(String),
    /// Several namespaces (sorted, without duplicates).
    Many(Vec<String>),
}

impl WatchNamespaces {
    /// The scopes to run one controller each in: `None` = cluster-wide, `Some(ns)` = one namespace.
    #[must_use]
    pub(crate) fn scopes(&self) -> Vec<Option<String>> {
        match self {
            WatchNamespaces::All => vec![None],
            WatchNamespaces::One(ns) => vec![Some(ns.clone())],
            WatchNamespaces::Many(nss) => nss.iter().cloned().map(Some).collect(),
        }
    }
}

impl fmt::Display for WatchNamespaces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchNamespaces::All => f.write_str("<all namespaces>"),
            WatchNamespaces::One(ns) => f.write_str(ns),
            WatchNamespaces::Many(nss) => f.write_str(&nss.join(",")),
        }
    }
}

/// A bad `WATCH_NAMESPACE` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid WATCH_NAMESPACE (--watch-namespace) entry `{entry}`: {reason}")]
pub(crate) struct ParseWatchNamespacesError {
    entry: String,
    reason: &'static str,
}

impl FromStr for WatchNamespaces {
    type Err = ParseWatchNamespacesError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut nss: Vec<String> = Vec::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if let Some(reason) = dns1123_label_problem(entry) {
                return Err(ParseWatchNamespacesError {
                    entry: entry.to_owned(),
                    reason,
                });
            }
            nss.push(entry.to_owned());
        }
        nss.sort();
        nss.dedup();
        Ok(match nss.len() {
            0 => WatchNamespaces::All,
            1 => WatchNamespaces::One(nss.remove(0)),
            _ => WatchNamespaces::Many(nss),
        })
    }
}

/// Why `s` is not a DNS-1123 label (a valid namespace name), if it isn't.
fn dns1123_label_problem(s: &str) -> Option<&'static str> {
    if s.len() > 63 {
        return Some("longer than 63 characters");
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Some("only lowercase letters, digits and '-' are allowed");
    }
    if s.starts_with('-') || s.ends_with('-') {
        return Some("must start and end with a letter or digit");
    }
    None
}

/// What one watch of a [`Scope`] has shown so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchStatus {
    /// The kind watched.
    pub kind: String,
    /// Whether its first full list reached the store (stays true: a later relist swaps
    /// the store's content only once it is complete).
    pub synced: bool,
    /// The last error, until the watch delivers again.
    pub error: Option<String>,
}

/// The watches of one [`Scope`]: what gates its reconciles and feeds `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScopeStatus {
    /// The namespace, or `None` for cluster-wide.
    pub namespace: Option<String>,
    /// Each watch created through the scope.
    pub watches: Vec<WatchStatus>,
}

impl ScopeStatus {
    /// Whether every watch of the scope has listed its objects once: only then may the
    /// scope's objects be reconciled (a reconcile that saw a child cache still empty would,
    /// after a restart, create children that already exist).
    #[must_use]
    pub fn synced(&self) -> bool {
        !self.watches.is_empty() && self.watches.iter().all(|w| w.synced)
    }

    /// The failing watches, as `<kind>: <error>`, joined by `; ` (`None` when none fails).
    #[must_use]
    pub fn failure(&self) -> Option<String> {
        let failing: Vec<String> = self
            .watches
            .iter()
            .filter_map(|w| w.error.as_ref().map(|e| format!("{}: {e}", w.kind)))
            .collect();
        (!failing.is_empty()).then(|| failing.join("; "))
    }

    fn name(&self) -> &str {
        self.namespace.as_deref().unwrap_or("<all namespaces>")
    }
}

/// Readiness of the whole process from its scopes: ready once every scope whose watches
/// work has synced and at least one has (a namespace whose watches fail, e.g. its
/// RoleBinding is gone, does not hold the others back); the detail names each scope
/// that fails or has not synced yet, for the runner's log (`/readyz` says only ready or not).
#[must_use]
pub fn readiness(scopes: &[ScopeStatus]) -> (bool, String) {
    let ready = scopes.iter().any(ScopeStatus::synced)
        && scopes.iter().all(|s| s.synced() || s.failure().is_some());
    let detail = scopes
        .iter()
        .filter_map(|s| match (s.failure(), s.synced()) {
            (Some(error), true) => Some(format!(
                "namespace {}: synced, watch failing now: {error}",
                s.name()
            )),
            (Some(error), false) => Some(format!(
                "namespace {}: not synced, watch failing: {error}",
                s.name()
            )),
            (None, false) => Some(format!("namespace {}: not synced yet", s.name())),
            (None, true) => None,
        })
        .collect::<Vec<_>>()
        .join("\n");
    (ready, detail)
}

/// One place a controller runs: cluster-wide or one namespace, with the client to reach it.
///
/// Builders of an operator's `Controller` get a `Scope` and create every watch through it,
/// so the watches stay inside the scope, and the scope's [`ScopeStatus`] knows when they
/// have synced (which gates the scope's reconciles) or fail (reported by `/readyz`).
#[derive(Clone)]
pub struct Scope {
    client: Client,
    namespace: Option<String>,
    status: Arc<tokio::sync::watch::Sender<ScopeStatus>>,
    /// Bumped when one of the scope's watches has finished a full list (its first, or a
    /// re-list after the watch was lost): see [`Scope::lists`].
    lists: Arc<tokio::sync::watch::Sender<u64>>,
    streaming_lists: StreamingLists,
    /// With [`StreamingLists::Auto`]: whether the API server serves streaming lists, once
    /// it said so (asked before the scope's first watch; shared by its clones).
    streaming_served: Arc<tokio::sync::OnceCell<bool>>,
    /// The operator's own status writes, whose echoes do not trigger its controllers
    /// ([`Scope::with_status_writes`]).
    status_writes: Option<Arc<StatusWrites>>,
    /// The `apiVersion` and kind of the operator's primary kind ([`Scope::with_owner`]).
    owner: Option<(String, String)>,
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Scope {
    /// A scope over `namespace` (`None` = all namespaces).
    #[must_use]
    pub fn new(client: Client, namespace: Option<String>) -> Self {
        let status = ScopeStatus {
            namespace: namespace.clone(),
            watches: Vec::new(),
        };
        Self {
            client,
            namespace,
            status: Arc::new(tokio::sync::watch::Sender::new(status)),
            lists: Arc::new(tokio::sync::watch::Sender::new(0)),
            streaming_lists: StreamingLists::Never,
            streaming_served: Arc::new(tokio::sync::OnceCell::new()),
            status_writes: None,
            owner: None,
        }
    }

    /// The operator's primary kind `P`: the scope's caches of any other kind
    /// ([`Scope::reflect`]) keep only objects whose controller owner reference is of kind
    /// `P` (the operator's children): an object anyone labelled as the operator's, but
    /// that it does not control, is dropped as it is read, and one that loses its
    /// controller leaves the cache. The cache of `P` itself keeps no labels, annotations or
    /// owner references (no reconcile reads them).
    #[must_use]
    pub(crate) fn with_owner<P: Resource<DynamicType = ()>>(mut self) -> Self {
        self.owner = Some((P::api_version(&()).into_owned(), P::kind(&()).into_owned()));
        self
    }

    /// The operator's own status writes (its [`crate::Toolkit`]'s): a primary object's
    /// watch event at exactly the version one of them left it at is the echo of that
    /// write, and does not trigger [`Scope::controller`]'s reconcile (it still updates the
    /// cache). The reconcile that wrote it knew all it holds; without this, each status
    /// write cost one more reconcile that found nothing to do.
    #[must_use]
    pub fn with_status_writes(mut self, writes: Arc<StatusWrites>) -> Self {
        self.status_writes = Some(writes);
        self
    }

    /// How this scope's caches fill (`--streaming-lists`); paginated lists unless set.
    #[must_use]
    pub(crate) fn with_streaming_lists(mut self, streaming: StreamingLists) -> Self {
        self.streaming_lists = streaming;
        self
    }

    /// Whether a watch of `K` in this scope fills its cache with a streaming list: as
    /// `--streaming-lists` says, or, with `auto`, as the API server answered the scope's
    /// one question (see [`streaming`]). Resolved when the watch starts, not when it is
    /// built: building a controller makes no request.
    fn streams_lists<K>(&self) -> impl Future<Output = bool> + Send + 'static
    where
        K: Watched,
    {
        let mode = self.streaming_lists;
        let served = Arc::clone(&self.streaming_served);
        let api = self.api::<K>();
        let namespace = self.namespace.clone();
        async move {
            if mode != StreamingLists::Auto {
                return mode == StreamingLists::Always;
            }
            let namespace = namespace.as_deref().unwrap_or("<all namespaces>");
            let answer = served
                .get_or_try_init(|| async {
                    match streaming::probe(&api).await {
                        streaming::Support::Served => {
                            tracing::info!(
                                %namespace,
                                "the API server serves streaming lists (WatchList): the caches fill from watches"
                            );
                            Ok(true)
                        }
                        streaming::Support::Refused(reason) => {
                            tracing::info!(
                                %namespace, %reason,
                                "the API server does not serve streaming lists (WatchList): the caches fill from paged lists"
                            );
                            Ok(false)
                        }
                        streaming::Support::Unknown(reason) => Err(reason),
                    }
                })
                .await;
            match answer {
                Ok(served) => *served,
                Err(reason) => {
                    // Paged lists work on every server; the next watch asks again.
                    tracing::warn!(
                        %namespace, kind = %K::kind(&()), %reason,
                        "could not tell whether the API server serves streaming lists; this watch fills its cache from paged lists"
                    );
                    false
                }
            }
        }
    }

    /// The namespace, or `None` for cluster-wide.
    #[must_use]
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The client.
    #[must_use]
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// An `Api` for a namespaced kind, limited to this scope.
    #[must_use]
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    /// Watches `K` in this scope into a store; returns the store and the stream of changed
    /// objects (deletions included) to hand to `Controller::owns_stream`/`for_stream`.
    /// `managedFields` are dropped before caching: nothing reads them and they are large.
    ///
    /// The objects of a full list (the first, or a re-list after the watch was lost) fill
    /// the store but are not passed on: they would queue one trigger per object at once
    /// (all of them, since kube's runner waits for the primary store before it reconciles
    /// anything), and kube's scheduler keeps the room they took. The list's end bumps
    /// [`Scope::lists`] instead, and the runner then reconciles every primary object of
    /// the scope a bounded number at a time (`shared::runner`).
    pub fn reflect<K>(
        &self,
        wc: watcher::Config,
    ) -> (
        Store<K>,
        impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    )
    where
        K: Watched,
    {
        let (store, writer) = reflector::store::<K>();
        (store, self.reflect_with(wc, Some(writer), true, |_| {}))
    }

    /// Watches `K` in this scope into `index` alone, with no store: the index keeps what it
    /// keeps of each object ([`ScopedIndex::new`]) and the objects themselves are only
    /// handed on, as by [`Scope::reflect`]. For a kind of which a reconcile reads a few
    /// facts of many objects (the pods of its Deployment).
    pub fn reflect_index<K, V>(
        &self,
        wc: watcher::Config,
        index: &Arc<ScopedIndex<K, V>>,
    ) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
    where
        K: Watched,
        V: Clone + Send + Sync + 'static,
    {
        let (index, scope) = (Arc::clone(index), self.namespace.clone());
        self.reflect_with(wc, None, false, move |event| {
            index.apply(&scope, event);
        })
    }

    /// The watch of `K` in this scope: its events applied to `writer`'s store (if any),
    /// then passed to `on_event`, and the changed objects handed on. With `children_only`
    /// and a kind other than the scope's owner ([`Scope::with_owner`]), objects the owner
    /// kind does not control are dropped before they reach the store.
    fn reflect_with<K>(
        &self,
        wc: watcher::Config,
        writer: Option<reflector::store::Writer<K>>,
        children_only: bool,
        on_event: impl Fn(&watcher::Event<K>) + Send + 'static,
    ) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
    where
        K: Watched,
    {
        let streams_lists = self.streams_lists::<K>();
        let api = self.api::<K>();
        let events = futures::stream::once(async move {
            let wc = if streams_lists.await {
                wc.streaming_lists()
            } else {
                // A page's objects are all in memory at once while it is read: bounded so
                // that a page of the largest objects etcd stores fits the operator's limit.
                wc.page_size(LIST_PAGE_SIZE)
            };
            watcher(api, wc)
        })
        .flatten();
        let is_primary = self.owner.as_ref().is_some_and(|(api_version, kind)| {
            *api_version == K::api_version(&()) && *kind == K::kind(&())
        });
        let controller_kind = self.owner.clone().filter(|_| children_only && !is_primary);
        // Synced = the watcher's first full list is in the store. It is read off the event
        // stream rather than from `Store::wait_until_ready`: that future supports one waiter
        // at a time, and the `Controller` already waits on the primary store's readiness.
        let kind = K::kind(&()).into_owned();
        let mut index = 0;
        self.status.send_modify(|s| {
            index = s.watches.len();
            s.watches.push(WatchStatus {
                kind: kind.clone(),
                synced: false,
                error: None,
            });
        });
        let status = self.status.clone();
        let lists = self.lists.clone();
        let namespace = self.namespace.clone();
        let events = events
            .default_backoff()
            .modify(move |obj: &mut K| trim(obj.meta_mut(), is_primary))
            .filter_map(move |event| {
                std::future::ready(match (&controller_kind, event) {
                    (Some(owner), Ok(event)) => controlled_only(owner, event).map(Ok),
                    (_, event) => Some(event),
                })
            });
        let events = match writer {
            Some(writer) => reflector::reflector(writer, events).left_stream(),
            None => events.right_stream(),
        };
        // After the reflector: by then the store holds the whole first list.
        events.inspect(move |event| {
            if let Ok(event) = event {
                on_event(event);
            }
            let namespace = namespace.as_deref().unwrap_or("<all namespaces>");
            status.send_if_modified(|s| {
                let Some(w) = s.watches.get_mut(index) else {
                    return false;
                };
                match event {
                    Err(error) => {
                        // Retried by the watcher's backoff; the other scopes go on.
                        tracing::warn!(%namespace, %kind, %error, "watch failing; retrying with backoff");
                        let error = error.to_string();
                        let changed = w.error.as_ref() != Some(&error);
                        w.error = Some(error);
                        changed
                    }
                    Ok(event) => {
                        let recovered = w.error.take().is_some();
                        if recovered {
                            tracing::info!(%namespace, %kind, "watch recovered");
                        }
                        let first_sync = !w.synced && matches!(event, watcher::Event::InitDone);
                        if first_sync {
                            w.synced = true;
                            tracing::debug!(%namespace, %kind, "watch synced");
                        }
                        recovered || first_sync
                    }
                }
            });
        })
        .filter_map(move |event| {
            std::future::ready(match event {
                Ok(watcher::Event::Apply(obj) | watcher::Event::Delete(obj)) => Some(Ok(obj)),
                Ok(watcher::Event::InitDone) => {
                    lists.send_modify(|n| *n += 1);
                    None
                }
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => None,
                Err(error) => Some(Err(error)),
            })
        })
        .boxed()
    }

    /// A `Controller` for the primary kind `K` in this scope, with managedFields dropped
    /// from its cache, and the echoes of the operator's own status writes not passed on as
    /// triggers ([`Scope::with_status_writes`]). Add child watches with [`Scope::reflect`]
    /// + `owns_stream`.
    #[must_use]
    pub fn controller<K>(&self, wc: watcher::Config) -> Controller<K>
    where
        K: Watched,
    {
        let (reader, stream) = self.reflect::<K>(wc);
        let writes = self.status_writes.clone();
        let stream = stream.filter(move |event| {
            let echo = match (event, &writes) {
                (Ok(obj), Some(writes)) => is_echo(writes, obj.meta()),
                _ => false,
            };
            std::future::ready(!echo)
        });
        Controller::for_stream(stream, reader)
    }

    /// How many full lists the scope's watches have finished, updated as they finish: a
    /// change means objects may have changed unseen (at start, or while a watch was lost),
    /// so every primary object needs a reconcile.
    #[must_use]
    pub fn lists(&self) -> tokio::sync::watch::Receiver<u64> {
        self.lists.subscribe()
    }

    /// The status of the watches created through this scope so far, updated as they
    /// sync and fail.
    #[must_use]
    pub fn status(&self) -> tokio::sync::watch::Receiver<ScopeStatus> {
        self.status.subscribe()
    }
}

/// At most this many objects per page of a list, when the API server does not serve
/// streaming lists: etcd stores objects of up to 1.5 MiB, and a page is held and parsed
/// whole, so a page of the largest objects stays within about 15 MiB of text.
const LIST_PAGE_SIZE: u32 = 10;

/// What every cache drops of every object: `managedFields`; of a primary object its
/// labels, annotations and owner references (no reconcile reads them, and a tenant sets
/// them at will); of any object all but its first finalizers.
fn trim(meta: &mut ObjectMeta, is_primary: bool) {
    meta.managed_fields = None;
    if is_primary {
        meta.labels = None;
        meta.annotations = None;
        meta.owner_references = None;
    }
    if let Some(finalizers) = &mut meta.finalizers {
        finalizers.truncate(crate::slim::projection::MAX_KEPT_FINALIZERS);
        finalizers.shrink_to_fit();
    }
}

/// `event` as a cache of children keeps it: an object that `owner` (`apiVersion`, kind)
/// does not control is dropped from a list, and a watch event about one becomes its
/// deletion (it may have been cached while it was ours).
fn controlled_only<K: Resource>(
    owner: &(String, String),
    event: watcher::Event<K>,
) -> Option<watcher::Event<K>> {
    let controlled =
        |obj: &K| {
            obj.meta().owner_references.iter().flatten().any(|r| {
                r.controller == Some(true) && r.api_version == owner.0 && r.kind == owner.1
            })
        };
    match event {
        watcher::Event::Apply(obj) if !controlled(&obj) => Some(watcher::Event::Delete(obj)),
        watcher::Event::InitApply(obj) if !controlled(&obj) => None,
        event => Some(event),
    }
}

/// Whether the object `meta` describes is, version for version, what one of `writes` left
/// (which is then forgotten: [`StatusWrites::take_echo`]).
fn is_echo(writes: &StatusWrites, meta: &ObjectMeta) -> bool {
    meta.uid
        .as_deref()
        .zip(meta.resource_version.as_deref())
        .is_some_and(|(uid, version)| writes.take_echo(uid, version))
}

/// What a [`Scope`] can watch and cache: a namespaced kind that deserialises, clones and
/// crosses threads.
pub trait Watched:
    Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
    + Clone
    + DeserializeOwned
    + fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + fmt::Debug
        + Send
        + Sync
        + 'static
{
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parse_watch_namespaces() {
        assert_eq!("".parse::<WatchNamespaces>().unwrap(), WatchNamespaces::All);
        assert_eq!(
            " , ".parse::<WatchNamespaces>().unwrap(),
            WatchNamespaces::All
        );
        assert_eq!(
            "a".parse::<WatchNamespaces>().unwrap(),
            WatchNamespaces::One("a".into())
        );
        assert_eq!(
            "b, a ,b".parse::<WatchNamespaces>().unwrap(),
            WatchNamespaces::Many(vec!["a".into(), "b".into()])
        );
        assert_eq!(
            "a,a".parse::<WatchNamespaces>().unwrap(),
            WatchNamespaces::One("a".into())
        );
        for bad in ["A", "a_b", "-a", "a-", &"x".repeat(64), "a,b/c"] {
            let err = bad.parse::<WatchNamespaces>().unwrap_err();
            assert!(err.to_string().contains("WATCH_NAMESPACE"), "{err}");
        }
    }

    fn watch(kind: &str, synced: bool, error: Option<&str>) -> WatchStatus {
        WatchStatus {
            kind: kind.into(),
            synced,
            error: error.map(Into::into),
        }
    }

    fn scope(ns: &str, watches: Vec<WatchStatus>) -> ScopeStatus {
        ScopeStatus {
            namespace: Some(ns.into()),
            watches,
        }
    }

    #[test]
    fn a_scope_reconciles_once_all_its_watches_synced() {
        assert!(!scope("a", vec![]).synced());
        assert!(
            !scope(
                "a",
                vec![watch("PodSet", true, None), watch("Pod", false, None)]
            )
            .synced()
        );
        assert!(
            scope(
                "a",
                vec![watch("PodSet", true, None), watch("Pod", true, None)]
            )
            .synced()
        );
        // A watch that fails after its first list keeps its (complete) cache: still synced.
        assert!(
            scope(
                "a",
                vec![watch("PodSet", true, None), watch("Pod", true, Some("x"))]
            )
            .synced()
        );
        // Failing before its first list: not synced, whatever the others did.
        assert!(
            !scope(
                "a",
                vec![
                    watch("PodSet", true, None),
                    watch("Pod", false, Some("403"))
                ]
            )
            .synced()
        );
    }

    #[test]
    fn a_failing_namespace_does_not_hold_the_others_back() {
        let a = scope(
            "a",
            vec![watch("PodSet", true, None), watch("Pod", true, None)],
        );
        let b_failing = scope(
            "b",
            vec![
                watch("PodSet", false, Some("pods is forbidden")),
                watch("Pod", false, None),
            ],
        );
        let b_pending = scope("b", vec![watch("PodSet", false, None)]);

        let (ready, detail) = readiness(&[a.clone(), b_failing.clone()]);
        assert!(ready, "{detail}");
        assert_eq!(
            detail,
            "namespace b: not synced, watch failing: PodSet: pods is forbidden"
        );
        // Each scope's own gate: a reconciles, b does not.
        assert!(a.synced() && !b_failing.synced());

        // A namespace still listing (no error yet) is waited for.
        let (ready, detail) = readiness(&[a.clone(), b_pending]);
        assert!(!ready);
        assert_eq!(detail, "namespace b: not synced yet");

        // Nothing works at all: not ready.
        let (ready, _) = readiness(std::slice::from_ref(&b_failing));
        assert!(!ready);

        // All synced: ready, nothing to add.
        assert_eq!(readiness(std::slice::from_ref(&a)), (true, String::new()));
        // Cluster-wide scope named as such.
        let all = ScopeStatus {
            namespace: None,
            watches: vec![watch("Pod", false, None)],
        };
        assert_eq!(
            readiness(&[all]).1,
            "namespace <all namespaces>: not synced yet"
        );
    }

    /// A client for a namespace with no ConfigMaps, on a server that serves streaming lists
    /// (`served`) or refuses them as kube-apiserver 1.33 does; every request's query is kept.
    fn configmap_server(served: bool) -> (Client, Arc<std::sync::Mutex<Vec<String>>>) {
        use axum::http::{Request, Response};
        let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = Arc::clone(&asked);
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let query = request.uri().query().unwrap_or_default().to_owned();
            seen.lock().unwrap().push(query.clone());
            async move {
                let end = r#"{"type":"BOOKMARK","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"resourceVersion":"7","annotations":{"k8s.io/initial-events-end":"true"}}}}"#;
                let (code, body) = if !query.contains("watch=true") {
                    (200, r#"{"apiVersion":"v1","kind":"ConfigMapList","metadata":{"resourceVersion":"7"},"items":[]}"#.to_owned())
                } else if query.contains("sendInitialEvents=true") && !served {
                    (422, r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Invalid","code":422,"message":"sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"}"#.to_owned())
                } else if query.contains("sendInitialEvents=true") {
                    (200, format!("{end}\n"))
                } else {
                    // A resumed watch with nothing to say: it stays open.
                    tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
                    (200, String::new())
                };
                let mut response = Response::new(kube::client::Body::from(body.into_bytes()));
                *response.status_mut() = code.try_into().unwrap();
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        (Client::new(service, "default"), asked)
    }

    /// With `auto`, the scope asks once (whatever number of watches it runs) and each watch
    /// fills its cache the way the server serves: a streaming list, or a paged list after
    /// a refusal, never a streaming watch retried forever.
    #[tokio::test]
    async fn auto_streams_where_the_server_serves_streaming_lists_and_pages_elsewhere() {
        use k8s_openapi::api::core::v1::ConfigMap;
        for served in [true, false] {
            let (client, asked) = configmap_server(served);
            let scope =
                Scope::new(client, Some("a".into())).with_streaming_lists(StreamingLists::Auto);
            let lists = scope.lists();
            let (_store_a, stream_a) = scope.reflect::<ConfigMap>(watcher::Config::default());
            let (_store_b, stream_b) = scope.reflect::<ConfigMap>(watcher::Config::default());
            let drive =
                tokio::spawn(futures::stream::select(stream_a, stream_b).for_each(|_| async {}));
            // Both watches finish their first full list.
            let mut lists_done = lists.clone();
            tokio::time::timeout(
                std::time::Duration::from_secs(10),
                lists_done.wait_for(|n| *n >= 2),
            )
            .await
            .expect("both caches filled")
            .unwrap();
            drive.abort();
            let asked = asked.lock().unwrap().clone();
            let probes = asked
                .iter()
                .filter(|q| q.contains("streaming-list-probe"))
                .count();
            assert_eq!(
                probes, 1,
                "served={served}: one question per scope: {asked:#?}"
            );
            let others: Vec<&String> = asked
                .iter()
                .filter(|q| !q.contains("streaming-list-probe"))
                .collect();
            let streamed = others
                .iter()
                .filter(|q| q.contains("sendInitialEvents=true"))
                .count();
            let paged = others.iter().filter(|q| !q.contains("watch=true")).count();
            if served {
                assert_eq!((streamed, paged), (2, 0), "{asked:#?}");
            } else {
                assert_eq!((streamed, paged), (0, 2), "{asked:#?}");
            }
        }
    }

    #[test]
    fn scopes() {
        assert_eq!(WatchNamespaces::All.scopes(), vec![None]);
        let many: WatchNamespaces = "x,y".parse().unwrap();
        assert_eq!(many.scopes(), vec![Some("x".into()), Some("y".into())]);
    }
}
