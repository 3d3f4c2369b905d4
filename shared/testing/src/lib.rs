//! Test support for the operators' reconcile tests (a dev-dependency only, never in a
//! binary): a scripted API server to run a reconcile against, for the answers a real cluster rarely
//! gives (403, 404 on a status write, 409, 422).
//!
//! [`Scripted`] answers the requests in the order they come, records each, and answers
//! `500` to a request beyond its script. An operator's test gets a `kube::Client` it answers
//! from [`client`] and builds its context from [`toolkit`].

use std::{
    collections::VecDeque,
    future::Future,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

pub use axum::http;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};
use kube::{Client, client::Body, core::Status};
use serde_json::Value;

use shared::{
    Operator, Toolkit,
    namespaces::{Scope, ScopedStores},
    slim::Slim,
};

/// What the scripted API server answers to one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// `200` with this object.
    Object(Value),
    /// `200` with the request's own body (an event created, an object applied).
    Echo,
    /// A failure: this code, reason and message, as a `metav1.Status`.
    Status(u16, &'static str, String),
}

impl Reply {
    /// A failure with code `code`, the reason the API server gives it, and `message`.
    #[must_use]
    pub fn error(code: u16, message: &str) -> Self {
        let reason = match code {
            403 => "Forbidden",
            404 => "NotFound",
            409 => "Conflict",
            422 => "Invalid",
            _ => "InternalError",
        };
        Reply::Status(code, reason, message.to_owned())
    }
}

/// One request the reconcile made.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// `GET`, `POST`, `PATCH`, ...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The body, parsed as JSON (`Null` when empty).
    pub body: Value,
}

impl Seen {
    /// `<method> <path>`.
    #[must_use]
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// An API server that answers from a script.
#[derive(Debug, Clone, Default)]
pub struct Scripted {
    inner: Arc<Mutex<(VecDeque<Reply>, Vec<Seen>)>>,
}

impl Scripted {
    /// Answers the requests with `replies`, in order.
    #[must_use]
    pub fn new(replies: impl IntoIterator<Item = Reply>) -> Self {
        Self {
            inner: Arc::new(Mutex::new((replies.into_iter().collect(), Vec::new()))),
        }
    }

    /// A client whose every request this script answers.
    #[must_use]
    pub fn client(&self) -> Client {
        client(self)
    }

    /// Records `request` and answers it with the next reply of the script.
    pub async fn answer(&self, request: http::Request<Body>) -> http::Response<Body> {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let reply = {
            let mut inner = self.lock();
            inner.1.push(Seen {
                method: parts.method.to_string(),
                path: parts.uri.path().to_owned(),
                body: body.clone(),
            });
            inner.0.pop_front()
        };
        let (code, json) = match reply {
            Some(Reply::Object(object)) => (200, object),
            Some(Reply::Echo) => (200, body),
            Some(Reply::Status(code, reason, message)) => (code, status(code, reason, &message)),
            None => (
                500,
                status(
                    500,
                    "InternalError",
                    "the script has no answer to this request",
                ),
            ),
        };
        let mut response =
            http::Response::new(Body::from(serde_json::to_vec(&json).unwrap_or_default()));
        *response.status_mut() =
            http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        response
    }

    /// The requests made so far.
    #[must_use]
    pub fn seen(&self) -> Vec<Seen> {
        self.lock().1.clone()
    }

    fn lock(&self) -> MutexGuard<'_, (VecDeque<Reply>, Vec<Seen>)> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The requests made so far, as `<method> <path>`.
    #[must_use]
    pub fn lines(&self) -> Vec<String> {
        self.seen().iter().map(Seen::line).collect()
    }
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    serde_json::to_value(Status::failure(message, reason).with_code(code)).unwrap_or_default()
}

/// A `kube::Client` answered by `api`: each request goes to [`Scripted::answer`].
#[must_use]
pub fn client(api: &Scripted) -> Client {
    let api = api.clone();
    let service = tower::service_fn(move |request: http::Request<Body>| {
        let api = api.clone();
        async move { Ok::<_, std::convert::Infallible>(api.answer(request).await) }
    });
    Client::new(service, "default")
}

/// `obj` as the API server hands it out: in namespace `ns`, with UID `uid-1` and
/// `generation`.
#[must_use]
pub fn stored<K: kube::Resource>(mut obj: K, generation: i64) -> K {
    let meta = obj.meta_mut();
    meta.namespace = Some("ns".into());
    meta.uid = Some("uid-1".into());
    meta.generation = Some(generation);
    obj
}

/// The toolkit a reconcile gets, around `client`, for `operator`, watching everything.
#[must_use]
pub fn toolkit(client: Client, operator: Operator) -> Toolkit {
    Toolkit::new(client, operator)
}

/// Fills `stores` with `objects` as a watch of all namespaces would have cached them
/// (compacted to [`Slim`]): the children a reconcile finds in its cache.
///
/// # Panics
/// When an object does not serialize.
pub fn cache<K>(
    stores: &ScopedStores<Slim<K>>,
    client: &Client,
    objects: impl IntoIterator<Item = K>,
) where
    K: shared::children::ChildKind,
{
    let (store, mut writer) = kube::runtime::reflector::store::<Slim<K>>();
    for object in objects {
        let slim = Slim::from_full(&object).unwrap_or_else(|e| panic!("{e}"));
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(slim));
    }
    stores.insert(&Scope::new(client.clone(), None), store);
}

/// Runs `reconcile` on `object` with the context `context` builds around a client that
/// the scripted server answers with `replies`, and returns the result and the server
/// (what was asked). Panics when the reconcile does not end within 10 s (a test whose
/// script is one answer short would otherwise hang).
pub async fn reconcile_scripted<K, C, T, Fut>(
    object: K,
    replies: Vec<Reply>,
    context: impl FnOnce(Client) -> C,
    reconcile: impl FnOnce(Arc<K>, Arc<C>) -> Fut,
) -> (T, Scripted)
where
    Fut: Future<Output = T>,
{
    let api = Scripted::new(replies);
    let ctx = Arc::new(context(api.client()));
    let run = tokio::time::timeout(Duration::from_secs(10), reconcile(Arc::new(object), ctx));
    match run.await {
        Ok(result) => (result, api),
        Err(_) => panic!("the reconcile did not end within 10 s: {:?}", api.lines()),
    }
}

/// The (type, reason) of the events created through `api`, in order.
#[must_use]
pub fn events(api: &Scripted) -> Vec<(String, String)> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    api.seen()
        .iter()
        .filter(|s| {
            s.line().starts_with("POST /apis/events.k8s.io/v1/") && s.line().ends_with("/events")
        })
        .map(|s| (text(&s.body["type"]), text(&s.body["reason"])))
        .collect()
}

/// Asserts that the events created through `api` were `expected`, as (type, reason) in
/// order ([`events`]).
///
/// # Panics
/// When they were not.
pub fn assert_events(api: &Scripted, expected: &[(&str, &str)]) {
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(type_, reason)| ((*type_).to_owned(), (*reason).to_owned()))
        .collect();
    assert_eq!(events(api), expected);
}

/// The status of a pod in `phase` whose `Ready` condition is `ready`.
#[must_use]
pub fn pod_status(phase: &str, ready: bool) -> PodStatus {
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            ..PodCondition::default()
        }]),
        ..PodStatus::default()
    }
}

/// Asserts that Deployment `d` selects its own pods (every label of its selector is on its
/// pod template); returns the template's pod spec.
///
/// # Panics
/// When it does not, or has no selector labels, template labels or pod spec.
#[must_use]
pub fn selected_pod_spec(d: &Deployment) -> &PodSpec {
    let spec = d.spec.as_ref();
    let selector = spec.and_then(|s| s.selector.match_labels.as_ref());
    let template = spec.map(|s| &s.template);
    let labels = template
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.as_ref());
    let pod = template.and_then(|t| t.spec.as_ref());
    let (Some(selector), Some(labels), Some(pod)) = (selector, labels, pod) else {
        panic!("a Deployment without selector labels, template labels or pod spec: {d:?}");
    };
    assert!(
        selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
        "{selector:?} does not select {labels:?}"
    );
    pod
}

/// Asserts that `pod` runs as the `restricted` Pod Security Standard asks at the pod level:
/// no service account token, non-root, seccomp `RuntimeDefault`.
///
/// # Panics
/// When it does not.
pub fn assert_restricted_pod(pod: &PodSpec) {
    assert_eq!(pod.automount_service_account_token, Some(false));
    let psc = pod.security_context.as_ref();
    assert_eq!(psc.and_then(|c| c.run_as_non_root), Some(true));
    let seccomp = psc.and_then(|c| c.seccomp_profile.as_ref());
    assert_eq!(seccomp.map(|p| p.type_.as_str()), Some("RuntimeDefault"));
}
