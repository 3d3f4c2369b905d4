//! The status that describes what a reconcile observed of a Memcached's Deployment and
//! pods, and which of its conditions are announced with events. Pure; unit-tested below.

use k8s_openapi::{api::apps::v1::Deployment, apimachinery::pkg::apis::meta::v1::Condition};
use kube::{Resource, ResourceExt};
use shared::{
    conditions::{Conditions, HasConditions},
    events::Announce,
    slim::SlimPod,
};

use crate::{
    api::{Memcached, MemcachedStatus},
    desired::{INSTANCE_LABEL, is_pod_of, selector},
};

/// `Degraded=True` reason: the Memcached is being deleted (a Normal event: the user asked
/// for it).
pub const REASON_FINALIZING: &str = "Finalizing";
/// `Degraded=True` reason: the API server refused the Deployment, Service or NetworkPolicy.
pub const REASON_APPLY_FAILED: &str = "ApplyFailed";
/// `Degraded=True` reason: a child's name is held by someone else's object.
pub const REASON_NAME_CONFLICT: &str = shared::ownership::REASON_NAME_CONFLICT;
/// `Degraded=True` reason: the Deployment cannot create pods.
pub const REASON_REPLICA_FAILURE: &str = "ReplicaFailure";
/// `Available=False` (and `Ready=False`) reason: no Service of the Memcached's name exists.
pub const REASON_SERVICE_MISSING: &str = "ServiceMissing";
/// `Available=False` (and `Ready=False`) reason: an object holds the Service's name but is
/// not controlled by this Memcached (someone else's, or an earlier Memcached's).
pub const REASON_SERVICE_NOT_OWNED: &str = "ServiceNotOwned";

/// The conditions announced with events: `Available` whenever it changes, `Degraded` when
/// it changes (a Warning for a problem, a Normal event when it turns to `Finalizing`) but
/// not its initial `False`.
pub const ANNOUNCED: [Announce; 2] = [Announce::normal_true("Available"), DEGRADED];

/// What is announced while the finalizer runs: `Degraded` turning to `Finalizing`, one
/// Normal event (a deletion the user asked for is not a problem).
pub const ANNOUNCED_FINALIZING: [Announce; 1] = [DEGRADED];

const DEGRADED: Announce = Announce::abnormal_true("Degraded")
    .warnings(&[
        REASON_APPLY_FAILED,
        REASON_NAME_CONFLICT,
        REASON_REPLICA_FAILURE,
    ])
    .on_entry(&[REASON_FINALIZING]);

impl HasConditions for MemcachedStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
}

/// Why a Memcached is `Degraded`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The Memcached is being deleted; the finalizer runs.
    Finalizing,
    /// The API server refused the Deployment, Service or NetworkPolicy (admission, quota,
    /// invalid).
    ApplyFailed(String),
    /// A Deployment, Service or NetworkPolicy of the same name exists and belongs to
    /// someone else.
    NameConflict(String),
}

impl From<&shared::children::Problem> for Problem {
    /// A child's name held by someone else's object, or a write the API server refused.
    fn from(problem: &shared::children::Problem) -> Self {
        match problem {
            shared::children::Problem::NameConflict(c) => Problem::NameConflict(c.message()),
            shared::children::Problem::Refused(r) => Problem::ApplyFailed(r.message().to_owned()),
        }
    }
}

/// The Memcached's Service (named after it) as a reconcile found it. Only a Service this
/// Memcached controls is the one clients reach it through, so only then can it be `Ready`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceState {
    /// It exists and is controlled by this Memcached: a controller owner reference with
    /// the Memcached's UID.
    Owned,
    /// An object holds the name but is not controlled by this Memcached: someone else's
    /// Service, or an earlier Memcached's of the same name still being removed.
    NotOwned,
    /// No Service has the name (not created yet, or its creation was refused).
    Missing,
}

/// What `service`, the object found at the Service's name (`None`: nothing), is to `mc`:
/// [`ServiceState::Owned`] only with a controller owner reference carrying `mc`'s UID.
#[must_use]
pub fn service_state<S: Resource>(mc: &Memcached, service: Option<&S>) -> ServiceState {
    match (service, mc.uid()) {
        (None, _) => ServiceState::Missing,
        (Some(s), Some(uid)) if shared::apply::is_controlled_by(s, &uid) => ServiceState::Owned,
        (Some(_), _) => ServiceState::NotOwned,
    }
}

/// Whether a pod counts: not terminating, and not finished (phase Succeeded or Failed).
#[must_use]
pub fn is_current(pod: &SlimPod) -> bool {
    pod.deletion_timestamp().is_none() && !matches!(pod.phase(), Some("Succeeded" | "Failed"))
}

/// What the status reads of a memcached pod, all the pod cache keeps of it beside its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodState {
    /// The pod counts ([`is_current`]).
    pub current: bool,
    /// Its `Ready` condition is `True`.
    pub ready: bool,
}

/// A memcached pod as the status reads it: its name and [`PodState`].
pub type NamedPod = (String, PodState);

/// What the pod cache keeps of `pod`: the Memcached it belongs to (its
/// `app.kubernetes.io/instance` label, the cache's key) and its [`PodState`]; nothing for a
/// pod that is not of that Memcached's Deployment ([`is_pod_of`]), so a reconcile finds
/// exactly the pods its status counts.
#[must_use]
pub fn cached_pod(pod: &SlimPod) -> Option<(String, PodState)> {
    let name = pod.labels().get(INSTANCE_LABEL)?;
    is_pod_of(pod, name).then(|| {
        (
            name.to_owned(),
            PodState {
                current: is_current(pod),
                ready: pod.ready(),
            },
        )
    })
}

/// The message of the Deployment's `ReplicaFailure=True` condition (pods cannot be created:
/// quota, admission), if any.
#[must_use]
pub fn replica_failure(deployment: &Deployment) -> Option<String> {
    deployment
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "ReplicaFailure" && c.status == "True")
        .map(|c| {
            c.message
                .clone()
                .unwrap_or_else(|| c.reason.clone().unwrap_or_default())
        })
}

/// Whether the Deployment controller has seen `deployment`'s latest spec, at `size` replicas.
fn observed(deployment: &Deployment, size: i32) -> bool {
    let seen = deployment
        .status
        .as_ref()
        .and_then(|s| s.observed_generation);
    deployment.metadata.generation.is_some()
        && seen >= deployment.metadata.generation
        && deployment.spec.as_ref().and_then(|s| s.replicas) == Some(size)
}

/// Whether at least `spec.size` of `pods` are current and ready: the cheap half of
/// [`is_available`], from the pod cache alone.
#[must_use]
pub fn pods_ready(mc: &Memcached, pods: &[NamedPod]) -> bool {
    let ready = pods.iter().filter(|(_, p)| p.current && p.ready).count();
    ready >= usize::try_from(mc.spec.size.max(0)).unwrap_or(0)
}

/// Whether [`status`] says `Available` (and `Ready`) for `deployment` and `pods`: the
/// Deployment controller has seen its latest spec, and at least `spec.size` pods are
/// available and ready.
#[must_use]
pub fn is_available(mc: &Memcached, deployment: &Deployment, pods: &[NamedPod]) -> bool {
    let size = mc.spec.size.max(0);
    let available = deployment
        .status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0);
    observed(deployment, size) && available >= size && pods_ready(mc, pods)
}

/// The status describing `deployment`, `service` and the current `pods` of `mc`, keeping
/// `lastTransitionTime` of unchanged conditions.
///
/// - `Available` (and `Ready`, the same): the Service is this Memcached's own
///   ([`ServiceState::Owned`]), the Deployment has observed its latest spec and at least
///   `size` pods are available and ready (reason `AllPodsAvailable`). Else `False`:
///   `ServiceNotOwned` or `ServiceMissing` (naming the Service) when the Service is not
///   its own, `Reconciling` otherwise.
/// - `Progressing`: the pod count differs from `size` (reason `Resizing`) or pods are
///   still being updated or started (`Reconciling`); else `False` (`Reconciled`).
/// - `Degraded`: `problem` (`Finalizing`, `ApplyFailed`, `NameConflict`), or the
///   Deployment reports that it cannot create pods (`ReplicaFailure`); else `AsExpected`.
#[must_use]
pub fn status(
    mc: &Memcached,
    deployment: Option<&Deployment>,
    service: ServiceState,
    pods: &[NamedPod],
    problem: Option<&Problem>,
    now: jiff::Timestamp,
) -> MemcachedStatus {
    let generation = mc.metadata.generation;
    let size = mc.spec.size.max(0);
    let name = mc.name_any();
    let current: Vec<&NamedPod> = pods.iter().filter(|(_, p)| p.current).collect();
    let replicas = i32::try_from(current.len()).unwrap_or(i32::MAX);
    let ready = i32::try_from(current.iter().filter(|(_, p)| p.ready).count()).unwrap_or(i32::MAX);
    let mut nodes: Vec<String> = current.iter().map(|(name, _)| name.clone()).collect();
    nodes.sort();

    let dep_status = deployment
        .and_then(|d| d.status.clone())
        .unwrap_or_default();
    let dep_observed = deployment.is_some_and(|d| observed(d, size));
    let available = dep_status.available_replicas.unwrap_or(0);
    let updated = dep_status.updated_replicas.unwrap_or(0);
    let dep_replicas = dep_status.replicas.unwrap_or(0);

    let counts = format!("{ready}/{size} pods ready");
    let is_available =
        service == ServiceState::Owned && deployment.is_some_and(|d| is_available(mc, d, pods));
    let (available_reason, available_message) = match deployment {
        _ if service == ServiceState::NotOwned => (
            REASON_SERVICE_NOT_OWNED,
            format!(
                "Service {name} is not controlled by this Memcached: clients would not reach its pods through it; delete or rename that Service"
            ),
        ),
        _ if service == ServiceState::Missing => (
            REASON_SERVICE_MISSING,
            format!("Service {name} does not exist"),
        ),
        _ if is_available => (
            "AllPodsAvailable",
            format!("Deployment {name} has {size} available pods"),
        ),
        None => ("Reconciling", format!("Deployment {name} not created yet")),
        Some(_) if !dep_observed => (
            "Reconciling",
            format!("Deployment {name} not yet updated by the Deployment controller"),
        ),
        Some(_) => (
            "Reconciling",
            format!("{available}/{size} pods available, {ready} ready"),
        ),
    };
    let (progressing, reason, message) = if replicas != size || dep_replicas != size {
        (
            true,
            "Resizing",
            format!("{replicas} pods exist, {size} wanted"),
        )
    } else if !dep_observed || updated != size || available != size || ready != size {
        (true, "Reconciling", counts)
    } else {
        (
            false,
            "Reconciled",
            format!("{size} pods up to date and available"),
        )
    };
    let children = if mc.spec.network_policy().is_some() {
        "Deployment, Service and NetworkPolicy"
    } else {
        "Deployment and Service"
    };
    let (degraded, degraded_reason, degraded_message) =
        match (problem, deployment.and_then(replica_failure)) {
            (Some(Problem::Finalizing), _) => (
                true,
                REASON_FINALIZING,
                format!("Memcached {name} is being deleted; its {children} go with it"),
            ),
            (Some(Problem::ApplyFailed(msg)), _) => (
                true,
                REASON_APPLY_FAILED,
                format!("cannot write the Deployment, Service or NetworkPolicy: {msg}"),
            ),
            (Some(Problem::NameConflict(msg)), _) => (true, REASON_NAME_CONFLICT, msg.clone()),
            (None, Some(msg)) => (
                true,
                REASON_REPLICA_FAILURE,
                format!("cannot create pods: {msg}"),
            ),
            (None, None) => (false, "AsExpected", format!("the {children} are in place")),
        };
    let old = mc.status.as_ref().map(HasConditions::conditions);
    let conditions = Conditions::new(old.unwrap_or_default(), generation, now)
        .set(
            "Available",
            is_available,
            available_reason,
            available_message.clone(),
        )
        // The contract's `Ready`, for tools and people that look for it: the same as
        // `Available` (the tutorial's own condition). Events announce `Available` only.
        .set("Ready", is_available, available_reason, available_message)
        .set("Progressing", progressing, reason, message)
        .set("Degraded", degraded, degraded_reason, degraded_message)
        .into_vec();

    MemcachedStatus {
        nodes,
        replicas,
        ready_replicas: ready,
        selector: selector(mc),
        observed_generation: generation,
        conditions,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixtures::{deployment, memcached, owner, pod};
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use shared::{
        conditions::{find, is_true},
        events::announcements,
    };

    const OWNED: ServiceState = ServiceState::Owned;

    fn now() -> jiff::Timestamp {
        jiff::Timestamp::from_second(100).unwrap()
    }

    #[test]
    fn is_available_is_what_the_status_says() {
        let mc = memcached(2, None);
        let (a, b, gone) = (
            pod("a", true, false),
            pod("b", false, false),
            pod("c", true, true),
        );
        let ready_b = pod("b", true, false);
        let mut unseen = deployment(&mc, 2, 2);
        unseen.metadata.generation = Some(5);
        let cases: [(Deployment, Vec<NamedPod>); 6] = [
            (deployment(&mc, 2, 2), vec![a.clone(), ready_b.clone()]),
            (deployment(&mc, 2, 2), vec![a.clone(), b.clone()]),
            (deployment(&mc, 2, 1), vec![a.clone(), ready_b.clone()]),
            (deployment(&mc, 2, 2), vec![a.clone(), gone.clone()]),
            (unseen, vec![a.clone(), ready_b.clone()]),
            (
                deployment(&memcached(3, None), 3, 3),
                vec![a.clone(), ready_b.clone()],
            ),
        ];
        for (i, (d, pods)) in cases.iter().enumerate() {
            let s = status(&mc, Some(d), OWNED, pods, None, jiff::Timestamp::UNIX_EPOCH);
            let says = is_true(&s.conditions, "Ready");
            assert_eq!(is_available(&mc, d, pods), says, "case {i}");
            // The cheap half never rules out what the status calls available.
            assert!(pods_ready(&mc, pods) || !says, "case {i}");
        }
    }

    #[test]
    fn status_available_when_all_pods_ready() {
        let mc = memcached(2, None);
        let d = deployment(&mc, 2, 2);
        let (b, a, gone) = (
            pod("cache-abc-b", true, false),
            pod("cache-abc-a", true, false),
            pod("cache-abc-c", true, true),
        );
        let now = jiff::Timestamp::from_second(100).unwrap();
        let s = status(
            &mc,
            Some(&d),
            OWNED,
            &[b.clone(), a.clone(), gone.clone()],
            None,
            now,
        );
        assert_eq!(s.nodes, ["cache-abc-a", "cache-abc-b"]);
        assert_eq!((s.replicas, s.ready_replicas), (2, 2));
        assert_eq!(s.observed_generation, Some(2));
        assert!(is_true(&s.conditions, "Available"));
        assert!(!is_true(&s.conditions, "Progressing"));
        assert!(!is_true(&s.conditions, "Degraded"));
        assert_eq!(s.selector, selector(&mc));
    }

    #[test]
    fn status_resizing_and_transition_times() {
        let mut mc = memcached(3, None);
        let d = deployment(&mc, 2, 2);
        let (a, b) = (
            pod("cache-abc-a", true, false),
            pod("cache-abc-b", false, false),
        );
        let t1 = jiff::Timestamp::from_second(100).unwrap();
        let s = status(&mc, Some(&d), OWNED, &[a.clone(), b.clone()], None, t1);
        assert!(!is_true(&s.conditions, "Available"));
        let p = find(&s.conditions, "Progressing").unwrap();
        assert_eq!((p.status.as_str(), p.reason.as_str()), ("True", "Resizing"));
        mc.status = Some(s);
        let t2 = jiff::Timestamp::from_second(200).unwrap();
        let s2 = status(&mc, Some(&d), OWNED, &[a.clone(), b.clone()], None, t2);
        assert_eq!(
            find(&s2.conditions, "Available")
                .unwrap()
                .last_transition_time,
            Time(t1)
        );
        assert_eq!(mc.status.as_ref(), Some(&s2), "same input, same status");
    }

    #[test]
    fn status_degraded_reasons() {
        let mc = memcached(1, None);
        let now = jiff::Timestamp::from_second(100).unwrap();
        let s = status(&mc, None, OWNED, &[], Some(&Problem::Finalizing), now);
        let d = find(&s.conditions, "Degraded").unwrap();
        assert_eq!(
            (d.status.as_str(), d.reason.as_str()),
            ("True", "Finalizing")
        );
        let s = status(
            &mc,
            None,
            OWNED,
            &[],
            Some(&Problem::ApplyFailed("forbidden".into())),
            now,
        );
        let d = find(&s.conditions, "Degraded").unwrap();
        assert_eq!(d.reason, "ApplyFailed");
        assert!(d.message.contains("forbidden"));
        let a = find(&s.conditions, "Available").unwrap();
        assert_eq!(a.status, "False");
    }

    #[test]
    fn running_pods_that_fail_readiness_are_not_available() {
        // memcached not listening on the Service's port: the readiness probe fails, so
        // the pod runs but is not Ready and the Deployment counts it unavailable.
        let mc = memcached(1, Some(11311));
        let d = deployment(&mc, 1, 0);
        let running = pod("cache-abc-a", false, false);
        let now = jiff::Timestamp::from_second(100).unwrap();
        let s = status(
            &mc,
            Some(&d),
            OWNED,
            std::slice::from_ref(&running),
            None,
            now,
        );
        assert_eq!((s.replicas, s.ready_replicas), (1, 0));
        for type_ in ["Available", "Ready"] {
            let c = find(&s.conditions, type_).unwrap();
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                ("False", "Reconciling")
            );
            assert_eq!(c.message, "0/1 pods available, 0 ready");
        }
        assert!(is_true(&s.conditions, "Progressing"));
        // Ready pods but a Deployment that does not count them available yet (its own
        // view lags): still not Available.
        let ready = pod("cache-abc-a", true, false);
        let s = status(
            &mc,
            Some(&d),
            OWNED,
            std::slice::from_ref(&ready),
            None,
            now,
        );
        assert!(!is_true(&s.conditions, "Available"));
        // Both agree: Available.
        let s = status(
            &mc,
            Some(&deployment(&mc, 1, 1)),
            OWNED,
            std::slice::from_ref(&ready),
            None,
            now,
        );
        assert!(is_true(&s.conditions, "Available") && is_true(&s.conditions, "Ready"));
    }

    /// The conditions `Available` and `Ready` of `s`, as (status, reason, message).
    fn ready(s: &MemcachedStatus) -> (String, String, String) {
        let a = find(&s.conditions, "Available").unwrap();
        let r = find(&s.conditions, "Ready").unwrap();
        assert_eq!(
            (&a.status, &a.reason, &a.message),
            (&r.status, &r.reason, &r.message)
        );
        (r.status.clone(), r.reason.clone(), r.message.clone())
    }

    #[test]
    fn ready_with_its_own_service() {
        let mc = memcached(1, None);
        let d = deployment(&mc, 1, 1);
        let a = pod("cache-abc-a", true, false);
        let own = crate::desired::desired_service(&mc, owner());
        let state = service_state(&mc, Some(&own));
        assert_eq!(state, ServiceState::Owned);
        let s = status(&mc, Some(&d), state, std::slice::from_ref(&a), None, now());
        assert_eq!(ready(&s).0, "True");
        assert_eq!(ready(&s).1, "AllPodsAvailable");
        // Owned but the pods are not there yet: not Ready, for the pods' reason.
        let s = status(&mc, Some(&d), state, &[], None, now());
        assert_eq!(ready(&s).1, "Reconciling");
    }

    #[test]
    fn a_strangers_service_is_not_ready_and_named() {
        let mc = memcached(1, None);
        let d = deployment(&mc, 1, 1);
        let a = pod("cache-abc-a", true, false);
        let ours = owner();
        let not_controller = OwnerReference {
            controller: None,
            ..ours.clone()
        };
        let other_uid = OwnerReference {
            uid: "uid-of-an-earlier-cache".into(),
            ..ours.clone()
        };
        let someone_else = OwnerReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "web".into(),
            uid: "uid-9".into(),
            ..ours
        };
        for refs in [
            None,
            Some(vec![not_controller]),
            Some(vec![other_uid]),
            Some(vec![someone_else]),
        ] {
            let mut stranger = crate::desired::desired_service(&mc, owner());
            stranger.metadata.owner_references.clone_from(&refs);
            let state = service_state(&mc, Some(&stranger));
            assert_eq!(state, ServiceState::NotOwned, "{refs:?}");
            // Everything else in place: still not Ready, and the reason names the Service.
            let s = status(&mc, Some(&d), state, std::slice::from_ref(&a), None, now());
            let (status_, reason, message) = ready(&s);
            assert_eq!(
                (status_.as_str(), reason.as_str()),
                ("False", "ServiceNotOwned")
            );
            assert!(
                message.starts_with("Service cache is not controlled by this Memcached"),
                "{message}"
            );
            // The pods are described as they are.
            assert_eq!((s.replicas, s.ready_replicas), (1, 1));
        }
        // A Memcached that has no UID (never stored) owns nothing.
        let mut unstored = mc.clone();
        unstored.metadata.uid = None;
        let own = crate::desired::desired_service(&mc, owner());
        assert_eq!(service_state(&unstored, Some(&own)), ServiceState::NotOwned);
    }

    #[test]
    fn a_missing_service_is_not_ready() {
        let mc = memcached(1, None);
        let d = deployment(&mc, 1, 1);
        let a = pod("cache-abc-a", true, false);
        let state = service_state::<Service>(&mc, None);
        assert_eq!(state, ServiceState::Missing);
        let s = status(&mc, Some(&d), state, std::slice::from_ref(&a), None, now());
        assert_eq!(
            ready(&s),
            (
                "False".to_owned(),
                "ServiceMissing".to_owned(),
                "Service cache does not exist".to_owned()
            )
        );
    }

    #[test]
    fn size_zero_is_available() {
        let mc = memcached(0, None);
        let d = deployment(&mc, 0, 0);
        let now = jiff::Timestamp::from_second(100).unwrap();
        let s = status(&mc, Some(&d), OWNED, &[], None, now);
        assert!(is_true(&s.conditions, "Available"));
        assert!(s.nodes.is_empty());
    }

    #[test]
    fn announced_transitions() {
        let mut mc = memcached(1, None);
        let d = deployment(&mc, 1, 1);
        let a = pod("cache-abc-a", true, false);
        let now = jiff::Timestamp::from_second(100).unwrap();
        let summary = |old: &MemcachedStatus, new: &MemcachedStatus, rules: &[Announce]| {
            announcements(&old.conditions, &new.conditions, rules)
                .into_iter()
                .map(|e| (e.action, e.reason, e.warning))
                .collect::<Vec<_>>()
        };
        let none = MemcachedStatus::default();

        // The first status: Available only (not Ready, not the initial Degraded=False).
        let up = status(&mc, Some(&d), OWNED, std::slice::from_ref(&a), None, now);
        assert_eq!(
            summary(&none, &up, &ANNOUNCED),
            [("AvailableChanged".into(), "AllPodsAvailable".into(), false)]
        );

        // Refused: a Warning, which a second problem while Degraded does not repeat.
        mc.status = Some(up.clone());
        let refused = status(
            &mc,
            Some(&d),
            OWNED,
            std::slice::from_ref(&a),
            Some(&Problem::ApplyFailed("denied".into())),
            now,
        );
        assert_eq!(
            summary(&up, &refused, &ANNOUNCED),
            [("DegradedChanged".into(), "ApplyFailed".into(), true)]
        );
        let conflict = status(
            &mc,
            Some(&d),
            OWNED,
            std::slice::from_ref(&a),
            Some(&Problem::NameConflict("taken".into())),
            now,
        );
        assert!(summary(&refused, &conflict, &ANNOUNCED).is_empty());

        // Deleted: one Normal Finalizing event, whether Degraded was True or False.
        for before in [&up, &refused] {
            let finalizing = status(
                &mc,
                Some(&d),
                OWNED,
                std::slice::from_ref(&a),
                Some(&Problem::Finalizing),
                now,
            );
            assert_eq!(
                summary(before, &finalizing, &ANNOUNCED_FINALIZING),
                [("DegradedChanged".into(), "Finalizing".into(), false)]
            );
            assert!(summary(&finalizing, &finalizing, &ANNOUNCED_FINALIZING).is_empty());
        }
    }

    #[test]
    fn the_pod_cache_keeps_a_pod_of_the_deployment_by_its_memcached() {
        // A memcached pod as the API server sends it (managed fields left out).
        let json = |deleting: bool, phase: &str, ready: &str, rs: &str| {
            let mut meta = serde_json::json!({
                "name": "cache-abc-x1", "namespace": "ns", "uid": "u1",
                "labels": {
                    "app.kubernetes.io/instance": "cache",
                    "app.kubernetes.io/managed-by": "memcached-operator",
                    "pod-template-hash": "abc"
                },
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "cm-1"},
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
                     "uid": "rs-1", "controller": true, "blockOwnerDeletion": true}
                ]
            });
            if deleting {
                meta["deletionTimestamp"] = "2026-11-28T05:50:00Z".into();
            }
            let pod = serde_json::json!({
                "metadata": meta,
                "spec": {"containers": [{"name": "memcached", "image": "memcached"}]},
                "status": {"phase": phase, "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": ready}
                ]}
            });
            cached_pod(&serde_json::from_value::<SlimPod>(pod).unwrap())
        };
        let state = |current, ready| Some(("cache".to_owned(), PodState { current, ready }));
        assert_eq!(
            json(false, "Running", "True", "cache-abc"),
            state(true, true)
        );
        assert_eq!(
            json(false, "Running", "False", "cache-abc"),
            state(true, false)
        );
        assert_eq!(
            json(true, "Running", "True", "cache-abc"),
            state(false, true)
        );
        assert_eq!(
            json(false, "Failed", "False", "cache-abc"),
            state(false, false)
        );
        // Labelled as the Memcached's, but not of its Deployment's ReplicaSet: not kept.
        assert_eq!(json(false, "Running", "True", "other-abc"), None);
    }
}
