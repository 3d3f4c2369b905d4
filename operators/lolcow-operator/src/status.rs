//! The status that describes what a Lolcow's observed children serve, why a child could
//! not be written, and which condition changes are announced with events. Pure;
//! unit-tested below.

use k8s_openapi::{
    api::{apps::v1::Deployment, core::v1::Service},
    apimachinery::pkg::apis::meta::v1::Condition,
};
use shared::{
    children::{Problem, Refusal},
    conditions::{Conditions, HasConditions},
    events::Announce,
};

use crate::{
    api::{Lolcow, LolcowStatus},
    desired::{PAGE_PATH, configured_greeting, node_port},
};

/// `Ready=False` reason: another Service holds the NodePort.
pub const REASON_PORT_CONFLICT: &str = "PortConflict";
/// `Ready=False` reason: the API server rejected the Service for another reason (e.g. the
/// port is outside the cluster's NodePort range).
pub const REASON_SERVICE_REJECTED: &str = "ServiceRejected";
/// `Ready=False` reason: the web app's Deployment is rolling out.
pub const REASON_ROLLING_OUT: &str = "RollingOut";
/// `Ready=False` reason: the Service does not serve `spec.port` yet.
pub const REASON_SERVICE_PENDING: &str = "ServicePending";
/// `Ready=True` reason.
pub const REASON_SERVING: &str = "Serving";
/// `Ready=False` reason: the Deployment's or Service's name is held by an object this
/// Lolcow does not control; that object is left untouched.
pub const REASON_NAME_CONFLICT: &str = shared::ownership::REASON_NAME_CONFLICT;
/// Reasons that are a problem for the user to fix: announced as Warning events.
pub const WARNING_REASONS: [&str; 3] = [
    REASON_PORT_CONFLICT,
    REASON_SERVICE_REJECTED,
    REASON_NAME_CONFLICT,
];

/// The conditions announced with events: `Ready`, whenever its status changes, and when it
/// turns to a problem for the user to fix (a Warning) even if it was already `False` for
/// another reason. Nothing when it stays as it was, so repeated reconciles of a stuck
/// object publish nothing.
pub const ANNOUNCED: [Announce; 1] = [Announce::normal_true("Ready")
    .warnings(&WARNING_REASONS)
    .on_entry(&WARNING_REASONS)];

impl HasConditions for LolcowStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
}

/// `None` when the Deployment's current spec is fully rolled out and available, else
/// what it waits for (as `kubectl rollout status` decides).
#[must_use]
pub fn rollout_pending(dep: &Deployment) -> Option<String> {
    let want = dep.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(status) = dep.status.as_ref() else {
        return Some("waiting for the Deployment to be observed".to_owned());
    };
    if status.observed_generation.unwrap_or(0) < dep.metadata.generation.unwrap_or(0) {
        return Some("waiting for the Deployment's new spec to be observed".to_owned());
    }
    let updated = status.updated_replicas.unwrap_or(0);
    let total = status.replicas.unwrap_or(0);
    let available = status.available_replicas.unwrap_or(0);
    if updated < want {
        return Some(format!("{updated} of {want} replicas updated"));
    }
    if total > updated {
        return Some(format!(
            "{} old replicas pending termination",
            total - updated
        ));
    }
    if available < want {
        return Some(format!("{available} of {want} replicas available"));
    }
    None
}

/// Why a child cannot be written: the API server refused the Service, or a child's name is
/// held by someone else's object (a problem for the user to fix, not retried as an error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildProblem {
    /// [`REASON_PORT_CONFLICT`], [`REASON_SERVICE_REJECTED`] or [`REASON_NAME_CONFLICT`].
    pub reason: &'static str,
    /// The API server's message, or which object holds the name.
    pub message: String,
}

impl ChildProblem {
    /// The children's names held by objects this Lolcow does not control (one or both).
    #[must_use]
    pub fn name_conflict(conflicts: &[shared::ownership::NameConflict]) -> Self {
        Self {
            reason: REASON_NAME_CONFLICT,
            message: conflicts
                .iter()
                .map(shared::ownership::NameConflict::message)
                .collect::<Vec<_>>()
                .join("; "),
        }
    }

    /// What the status reports of the problems writing the children met: the names held
    /// by objects this Lolcow does not control (all of them), else a refused Service.
    ///
    /// # Errors
    /// The refusal that is not a problem for the user ([`ChildProblem::from_rejection`]),
    /// to retry as an error.
    pub fn of(problems: &[Problem]) -> Result<Option<Self>, Refusal> {
        let mut refused = None;
        for problem in problems {
            if let Problem::Refused(r) = problem {
                match Self::from_rejection(r.code(), r.message()) {
                    Some(p) => refused = refused.or(Some(p)),
                    None => return Err(r.clone()),
                }
            }
        }
        let conflicts: Vec<_> = problems
            .iter()
            .filter_map(Problem::name_conflict)
            .cloned()
            .collect();
        if conflicts.is_empty() {
            Ok(refused)
        } else {
            Ok(Some(Self::name_conflict(&conflicts)))
        }
    }

    /// Classifies a rejected Service write; `None` when it is not a permanent problem
    /// (then the write is retried as an error).
    #[must_use]
    pub fn from_rejection(code: u16, message: &str) -> Option<Self> {
        if code != 422 {
            return None;
        }
        let reason = if message.contains("already allocated") {
            REASON_PORT_CONFLICT
        } else {
            REASON_SERVICE_REJECTED
        };
        Some(Self {
            reason,
            message: message.to_owned(),
        })
    }
}

/// Whether the children serve `lc` as its spec says: the Deployment rolled out and the
/// Service on `spec.port` ([`status`] says `Ready` when this holds and nothing refused a
/// write).
#[must_use]
pub fn is_serving(lc: &Lolcow, dep: &Deployment, svc: &Service) -> bool {
    rollout_pending(dep).is_none() && node_port(svc) == Some(lc.spec.port)
}

/// The status describing the observed children, keeping `lastTransitionTime` of an
/// unchanged `Ready`. `problem` is why a child could not be written, if any.
#[must_use]
pub fn status(
    lc: &Lolcow,
    dep: Option<&Deployment>,
    svc: Option<&Service>,
    problem: Option<&ChildProblem>,
    now: jiff::Timestamp,
) -> LolcowStatus {
    let generation = lc.metadata.generation;
    let old = lc.status.as_ref();
    let rollout = dep.map_or_else(
        || Some("waiting for the Deployment to be created".to_owned()),
        rollout_pending,
    );
    let port = svc.and_then(node_port);
    // The greeting being served is the Deployment's once it has rolled out; until then
    // the previous one still is.
    let served_greeting = match (dep, &rollout) {
        (Some(d), None) => configured_greeting(d),
        _ => old.and_then(|o| o.greeting.clone()),
    };
    let (ready, reason, message) = if let Some(p) = problem {
        (false, p.reason, p.message.clone())
    } else if let Some(waiting) = rollout {
        (
            false,
            REASON_ROLLING_OUT,
            format!("the web app is rolling out: {waiting}"),
        )
    } else if port != Some(lc.spec.port) {
        (
            false,
            REASON_SERVICE_PENDING,
            format!("waiting for the Service to serve NodePort {}", lc.spec.port),
        )
    } else {
        (
            true,
            REASON_SERVING,
            format!("serving on NodePort {} at {PAGE_PATH}", lc.spec.port),
        )
    };
    let old_conditions = old.map(HasConditions::conditions).unwrap_or_default();
    LolcowStatus {
        greeting: served_greeting,
        port,
        path: Some(PAGE_PATH.to_owned()),
        observed_generation: generation,
        conditions: Conditions::new(old_conditions, generation, now)
            .set("Ready", ready, reason, message)
            .into_vec(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{
        desired::{desired_deployment, desired_service},
        fixtures::{lolcow, rolled_out, t},
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use shared::{
        conditions::{find, is_true},
        events::{Announcement, announcements},
    };

    /// The one event (at most) a change of a Lolcow's conditions deserves.
    fn announcement(old: &[Condition], new: &[Condition]) -> Option<Announcement> {
        let mut all = announcements(old, new, &ANNOUNCED);
        assert!(all.len() <= 1, "{all:?}");
        all.pop()
    }

    #[test]
    fn rollout_progress() {
        let lc = lolcow(30080, None);
        let owner = shared::apply::owner_reference(&lc).unwrap();
        let d = desired_deployment(&lc, owner, "");
        assert!(rollout_pending(&d).is_some());
        let mut done = rolled_out(d);
        assert_eq!(rollout_pending(&done), None);
        done.metadata.generation = Some(5);
        assert!(rollout_pending(&done).unwrap().contains("observed"));
        done.metadata.generation = Some(4);
        if let Some(s) = done.status.as_mut() {
            s.replicas = Some(2);
        }
        assert!(rollout_pending(&done).unwrap().contains("old replicas"));
    }

    #[test]
    fn is_serving_is_what_the_status_says() {
        let lc = lolcow(30080, Some("Hello"));
        let owner = shared::apply::owner_reference(&lc).unwrap();
        let dep = desired_deployment(&lc, owner.clone(), "");
        let svc = desired_service(&lc, owner);
        let mut moved = lc.clone();
        moved.spec.port = 30081;
        for (lc, dep) in [
            (&lc, &dep),
            (&lc, &rolled_out(dep.clone())),
            (&moved, &rolled_out(dep.clone())),
        ] {
            let s = status(lc, Some(dep), Some(&svc), None, t(1));
            assert_eq!(is_serving(lc, dep, &svc), is_true(&s.conditions, "Ready"));
        }
    }

    #[test]
    fn status_and_conditions() {
        let mut lc = lolcow(30080, Some("Hello"));
        let owner = shared::apply::owner_reference(&lc).unwrap();
        let dep = desired_deployment(&lc, owner.clone(), "");
        let svc = desired_service(&lc, owner);

        // Rolling out: not ready, no greeting served yet.
        let s = status(&lc, Some(&dep), Some(&svc), None, t(10));
        assert!(!is_true(&s.conditions, "Ready"));
        assert_eq!(
            find(&s.conditions, "Ready").unwrap().reason,
            REASON_ROLLING_OUT
        );
        assert_eq!(s.greeting, None);
        assert_eq!(s.port, Some(30080));
        assert_eq!(s.path.as_deref(), Some("/"));
        assert_eq!(s.observed_generation, Some(2));

        lc.status = Some(s);
        let dep = rolled_out(dep);
        let s = status(&lc, Some(&dep), Some(&svc), None, t(20));
        assert!(is_true(&s.conditions, "Ready"));
        assert_eq!(s.greeting.as_deref(), Some("Hello"));
        let ready = find(&s.conditions, "Ready").unwrap();
        assert_eq!(ready.last_transition_time, Time(t(20)));

        // Same observation later: identical status (no write).
        lc.status = Some(s.clone());
        assert_eq!(status(&lc, Some(&dep), Some(&svc), None, t(30)), s);

        // The port conflicts: Ready=False with the API server's message.
        lc.spec.port = 30081;
        let problem = ChildProblem::from_rejection(
            422,
            "Service \"moo\" is invalid: spec.ports[0].nodePort: Invalid value: 30081: provided port is already allocated",
        )
        .unwrap();
        assert_eq!(problem.reason, REASON_PORT_CONFLICT);
        let c = status(&lc, Some(&dep), Some(&svc), Some(&problem), t(40));
        let ready = find(&c.conditions, "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", REASON_PORT_CONFLICT)
        );
        assert!(ready.message.contains("already allocated"));
        // The old port is still what is served.
        assert_eq!(c.port, Some(30080));

        // Without a problem but the Service not yet updated: pending.
        let p = status(&lc, Some(&dep), Some(&svc), None, t(50));
        assert_eq!(
            find(&p.conditions, "Ready").unwrap().reason,
            REASON_SERVICE_PENDING
        );
    }

    #[test]
    fn rejections() {
        assert_eq!(ChildProblem::from_rejection(409, "conflict"), None);
        assert_eq!(
            ChildProblem::from_rejection(422, "provided port is not in the valid range")
                .unwrap()
                .reason,
            REASON_SERVICE_REJECTED
        );
    }

    #[test]
    fn the_problem_of_the_children() {
        let refused = |code: u16, message: &str| {
            let error = kube::Error::Api(
                kube::core::Status::failure(message, "Invalid")
                    .with_code(code)
                    .boxed(),
            );
            match shared::children::Outcome::of_error(error) {
                Ok(shared::children::Outcome::Problem(p)) => p,
                other => panic!("{other:?}"),
            }
        };
        let conflict = Problem::NameConflict(shared::ownership::NameConflict {
            kind: "Deployment".into(),
            name: "moo".into(),
            owner_kind: "Lolcow".into(),
        });
        assert_eq!(ChildProblem::of(&[]).unwrap(), None);
        let taken = refused(422, "port 30080 is already allocated");
        assert_eq!(
            ChildProblem::of(std::slice::from_ref(&taken))
                .unwrap()
                .unwrap()
                .reason,
            REASON_PORT_CONFLICT
        );
        // A name held by a stranger comes first.
        assert_eq!(
            ChildProblem::of(&[conflict.clone(), taken])
                .unwrap()
                .unwrap()
                .reason,
            REASON_NAME_CONFLICT
        );
        // A 403 is retried as an error, whatever else.
        let forbidden = ChildProblem::of(&[conflict, refused(403, "forbidden")]).unwrap_err();
        assert_eq!(forbidden.code(), 403);
    }

    #[test]
    fn name_conflicts_name_every_object_and_warn() {
        let conflict = |kind: &str| shared::ownership::NameConflict {
            kind: kind.into(),
            name: "moo".into(),
            owner_kind: "Lolcow".into(),
        };
        let p = ChildProblem::name_conflict(&[conflict("Deployment"), conflict("Service")]);
        assert_eq!(p.reason, REASON_NAME_CONFLICT);
        assert!(
            p.message.starts_with("Deployment moo exists"),
            "{}",
            p.message
        );
        assert!(p.message.contains("; Service moo exists"), "{}", p.message);

        // Ready=False/NameConflict whatever the children look like; one Warning on entry.
        let lc = lolcow(30080, Some("Hello"));
        let s = status(&lc, None, None, Some(&p), t(1));
        let ready = find(&s.conditions, "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", REASON_NAME_CONFLICT)
        );
        let rolling = Conditions::new(&[], Some(1), t(1))
            .set("Ready", false, REASON_ROLLING_OUT, "1")
            .into_vec();
        let a = announcement(&rolling, &s.conditions).unwrap();
        assert!(a.warning);
        assert_eq!(a.reason, REASON_NAME_CONFLICT);
        assert!(announcement(&s.conditions, &s.conditions).is_none());
    }

    #[test]
    fn announcements_only_on_transitions() {
        let c = |status: bool, reason: &str, msg: &str| {
            Conditions::new(&[], Some(1), t(1))
                .set("Ready", status, reason, msg)
                .into_vec()
        };
        let rolling = c(false, REASON_ROLLING_OUT, "1");
        let conflict = c(false, REASON_PORT_CONFLICT, "taken");
        let ready = c(true, REASON_SERVING, "ok");

        let first = announcement(&[], &rolling).unwrap();
        assert!(!first.warning);
        assert!(announcement(&rolling, &c(false, REASON_ROLLING_OUT, "2")).is_none());

        // Into a conflict: one Warning, also from another False reason.
        let w = announcement(&rolling, &conflict).unwrap();
        assert!(w.warning);
        assert_eq!(w.reason, REASON_PORT_CONFLICT);
        assert!(announcement(&[], &conflict).unwrap().warning);
        assert!(announcement(&ready, &conflict).unwrap().warning);
        // Staying in it: nothing.
        assert!(announcement(&conflict, &conflict).is_none());
        // Leaving it for another False reason: nothing; to True: Normal.
        assert!(announcement(&conflict, &rolling).is_none());
        let n = announcement(&rolling, &ready).unwrap();
        assert!(!n.warning);
        assert_eq!(n.note, "Ready is True: ok");
    }
}
