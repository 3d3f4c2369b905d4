//! The status that describes what a reconcile observed of a PodSet's pods, and which of
//! its conditions are announced with events. Pure; unit-tested below.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use shared::{
    conditions::{Conditions, HasConditions},
    events::Announce,
};

use crate::{
    api::{PodSet, PodSetStatus},
    desired::selector,
    pods::OurPod,
};

/// `Degraded=True` reason: pods cannot be created.
pub const REASON_FAILED_CREATE: &str = "FailedCreate";

/// The conditions announced with events: `Ready` whenever it changes, `Degraded` when it
/// changes (a Warning when pods cannot be created) but not its initial `False`.
pub const ANNOUNCED: [Announce; 2] = [
    Announce::normal_true("Ready"),
    Announce::abnormal_true("Degraded").warnings(&[REASON_FAILED_CREATE]),
];

impl HasConditions for PodSetStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
}

/// The status describing `active` pods of `ps`, keeping `lastTransitionTime` of unchanged
/// conditions. `create_error` is the message of a failed create (makes `Degraded` True);
/// `writes_pending` says creates/deletes are in flight.
#[must_use]
pub fn status(
    ps: &PodSet,
    active: &[&OurPod],
    writes_pending: bool,
    create_error: Option<&str>,
    now: jiff::Timestamp,
) -> PodSetStatus {
    let generation = ps.metadata.generation;
    let want = ps.spec.replicas.max(0);
    let replicas = i32::try_from(active.len()).unwrap_or(i32::MAX);
    let ready = i32::try_from(active.iter().filter(|p| p.facts.ready).count()).unwrap_or(i32::MAX);
    let mut pod_names: Vec<String> = active.iter().map(|p| p.name.clone()).collect();
    pod_names.sort();

    let old = ps.status.as_ref().map(HasConditions::conditions);
    let counts = format!("{ready}/{want} pods ready");
    let all_ready = is_ready(ps, active, writes_pending);
    let (progressing, reason, message) = if replicas < want {
        (
            true,
            "ScalingUp",
            format!("{replicas} of {want} pods exist"),
        )
    } else if replicas > want {
        (
            true,
            "ScalingDown",
            format!("{replicas} pods exist, {want} wanted"),
        )
    } else if ready < want || writes_pending {
        (true, "WaitingForPods", counts.clone())
    } else {
        (
            false,
            "ScalingComplete",
            format!("{want} pods running and ready"),
        )
    };
    let ready_reason = if all_ready {
        "AllPodsReady"
    } else {
        "PodsNotReady"
    };
    let conditions = Conditions::new(old.unwrap_or_default(), generation, now)
        .set("Ready", all_ready, ready_reason, counts)
        .set("Progressing", progressing, reason, message);
    let conditions = match create_error {
        Some(msg) => conditions.set(
            "Degraded",
            true,
            REASON_FAILED_CREATE,
            format!("cannot create pods: {msg}"),
        ),
        None => conditions.set("Degraded", false, "AsExpected", "pods can be created"),
    };

    PodSetStatus {
        replicas,
        ready_replicas: ready,
        pod_names,
        selector: selector(ps),
        observed_generation: generation,
        conditions: conditions.into_vec(),
    }
}

/// Whether [`status`] says `Ready` for `active` pods of `ps`: `spec.replicas` of them, all
/// ready, and no create or delete in flight (`writes_pending`).
#[must_use]
pub fn is_ready(ps: &PodSet, active: &[&OurPod], writes_pending: bool) -> bool {
    let want = usize::try_from(ps.spec.replicas.max(0)).unwrap_or(0);
    !writes_pending && active.len() == want && active.iter().all(|p| p.facts.ready)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixtures::{pod, podset, t};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use shared::conditions::{find, is_true};
    use shared::events::announcements;

    #[test]
    fn is_ready_is_what_the_status_says() {
        let (a, b, c) = (
            pod("a", "Running", true),
            pod("b", "Pending", false),
            pod("c", "Running", true),
        );
        let cases: [(i32, Vec<&OurPod>, bool); 6] = [
            (2, vec![&a, &c], false),
            (2, vec![&a, &b], false),
            (2, vec![&a, &c], true),
            (3, vec![&a, &c], false),
            (1, vec![&a, &c], false),
            (0, vec![], false),
        ];
        for (replicas, active, pending) in cases {
            let ps = podset(replicas);
            let s = status(&ps, &active, pending, None, t(1));
            assert_eq!(
                is_ready(&ps, &active, pending),
                is_true(&s.conditions, "Ready"),
                "{replicas} wanted, {} active, pending {pending}",
                active.len()
            );
        }
    }

    #[test]
    fn status_and_conditions() {
        let a = pod("a", "Running", true);
        let b = pod("b", "Pending", false);
        let mut ps = podset(2);
        let s = status(&ps, &[&b, &a], false, None, t(100));
        assert_eq!((s.replicas, s.ready_replicas), (2, 1));
        assert_eq!(s.pod_names, ["a", "b"]);
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(
            s.selector,
            "app=demo,app.kubernetes.io/instance=demo,app.kubernetes.io/managed-by=podset-operator"
        );
        assert!(!is_true(&s.conditions, "Ready"));
        assert!(is_true(&s.conditions, "Progressing"));
        assert!(!is_true(&s.conditions, "Degraded"));

        ps.status = Some(s);
        let b_ready = pod("b", "Running", true);
        let s2 = status(&ps, &[&a, &b_ready], false, None, t(200));
        assert!(is_true(&s2.conditions, "Ready"));
        assert_eq!(
            find(&s2.conditions, "Ready").unwrap().last_transition_time,
            Time(t(200))
        );
        assert_eq!(
            find(&s2.conditions, "Degraded")
                .unwrap()
                .last_transition_time,
            Time(t(100))
        );
        assert!(!is_true(&s2.conditions, "Progressing"));

        // Same observation again: identical status, so no write.
        ps.status = Some(s2.clone());
        assert_eq!(status(&ps, &[&a, &b_ready], false, None, t(300)), s2);

        let s3 = status(&ps, &[&a], false, Some("forbidden: exceeded quota"), t(400));
        assert!(is_true(&s3.conditions, "Degraded"));
        assert_eq!(
            find(&s3.conditions, "Degraded").unwrap().reason,
            "FailedCreate"
        );
    }

    #[test]
    fn announced_transitions() {
        let a = pod("a", "Running", true);
        let mut ps = podset(1);
        // The first status: Ready (True) is announced, Degraded=False is not.
        let first = status(&ps, &[&a], false, None, t(1));
        let events = announcements(&[], &first.conditions, &ANNOUNCED);
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(
            (events[0].action.as_str(), events[0].reason.as_str()),
            ("ReadyChanged", "AllPodsReady")
        );
        assert!(!events[0].warning);

        // Pods cannot be created: Ready goes False (Normal), Degraded True (Warning).
        ps.status = Some(first.clone());
        ps.spec.replicas = 2;
        let failing = status(&ps, &[&a], false, Some("exceeded quota"), t(2));
        let events = announcements(&first.conditions, &failing.conditions, &ANNOUNCED);
        let summary: Vec<_> = events
            .iter()
            .map(|e| (e.action.as_str(), e.reason.as_str(), e.warning))
            .collect();
        assert_eq!(
            summary,
            [
                ("ReadyChanged", "PodsNotReady", false),
                ("DegradedChanged", "FailedCreate", true)
            ]
        );
        assert_eq!(
            events[1].note,
            "Degraded is True: cannot create pods: exceeded quota"
        );
        // Progressing is never announced; a steady status announces nothing.
        assert!(announcements(&failing.conditions, &failing.conditions, &ANNOUNCED).is_empty());
    }
}
