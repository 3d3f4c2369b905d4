//! Tests of the pure lease decision: no cluster, no mocks, only `Instant`s.

#![allow(clippy::unwrap_used)]
use super::*;

const ME: &str = "me";
const SECOND: Duration = Duration::from_secs(1);

fn config() -> LeaderConfig {
    LeaderConfig {
        lease_name: "operator-lock".into(),
        namespace: "default".into(),
        identity: ME.into(),
        lease_duration: 15 * SECOND,
        renew_deadline: 10 * SECOND,
        retry_period: 2 * SECOND,
    }
}

fn at(t: &str) -> MicroTime {
    micro_time(t.parse().unwrap())
}

/// A record as a holder writes it, renewed at `renewed` (its own wall clock).
fn held_by(holder: &str, renewed: &str) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(15),
        acquire_time: Some(at("2026-01-01T00:00:00Z")),
        renew_time: Some(at(renewed)),
        lease_transitions: Some(3),
        ..LeaseSpec::default()
    }
}

/// A candidate's view: it reads `specs` one after the other at the given offsets from
/// `t0`, keeping its observation as the election loop does; the decisions it makes.
fn candidate(t0: Instant, reads: &[(Duration, &LeaseSpec)]) -> Vec<Decision> {
    let mut observed = None;
    let config = config();
    reads
        .iter()
        .map(|(offset, spec)| {
            let now = t0 + *offset;
            let decision = decide(now, ME, Some(spec), observed.as_ref(), &config, None);
            observe(&mut observed, spec, now);
            decision
        })
        .collect()
}

fn wait(holder: &str, expires_in: Duration) -> Decision {
    Decision::Wait {
        holder: holder.into(),
        expires_in,
    }
}

#[test]
fn missing_lease_is_created() {
    let now = Instant::now();
    assert_eq!(
        decide(now, ME, None, None, &config(), None),
        Decision::Create
    );
    // Deleted under a leader that is still within its deadline: created again.
    assert_eq!(
        decide(now, ME, None, None, &config(), Some(now)),
        Decision::Create
    );
    let created = record(None, ME, &at("2026-01-01T00:00:01Z"), 15);
    assert_eq!(created.holder_identity.as_deref(), Some(ME));
    assert_eq!(created.lease_transitions, Some(0));
    assert_eq!(created.acquire_time, created.renew_time);
    assert_eq!(created.lease_duration_seconds, Some(15));
}

#[test]
fn released_lease_is_taken_at_once() {
    let t0 = Instant::now();
    let mut free = held_by("old", "2026-01-01T00:00:10Z");
    free.holder_identity = None;
    let mut empty = free.clone();
    empty.holder_identity = Some(String::new());
    for spec in [&free, &empty] {
        // Seen for the first time, and no time has passed: taken all the same.
        assert_eq!(
            candidate(t0, &[(Duration::ZERO, spec)]),
            [Decision::Acquire {
                expired_holder: None
            }]
        );
    }
}

#[test]
fn lease_of_another_is_not_taken_while_its_record_changes() {
    let t0 = Instant::now();
    let renewals = [
        held_by("other", "2026-01-01T00:00:00Z"),
        held_by("other", "2026-01-01T00:00:10Z"),
        held_by("other", "2026-01-01T00:00:20Z"),
    ];
    let decisions = candidate(
        t0,
        &[
            (Duration::ZERO, &renewals[0]),
            (10 * SECOND, &renewals[1]),
            (20 * SECOND, &renewals[2]),
            (30 * SECOND, &renewals[2]),
        ],
    );
    // 30 s after the first look, but only 10 s after the last change.
    assert_eq!(
        decisions,
        [
            wait("other", 15 * SECOND),
            wait("other", 15 * SECOND),
            wait("other", 15 * SECOND),
            wait("other", 5 * SECOND),
        ]
    );
}

#[test]
fn lease_unchanged_for_its_duration_is_taken() {
    let t0 = Instant::now();
    let spec = held_by("other", "2026-01-01T00:00:00Z");
    let decisions = candidate(
        t0,
        &[
            (Duration::ZERO, &spec),
            (Duration::from_millis(14_900), &spec),
            (15 * SECOND, &spec),
        ],
    );
    assert_eq!(
        decisions,
        [
            wait("other", 15 * SECOND),
            wait("other", Duration::from_millis(100)),
            Decision::Acquire {
                expired_holder: Some("other".into())
            },
        ]
    );
    // Taking it over: new holder and acquire time, one more transition.
    let now = at("2026-01-01T00:01:00Z");
    let taken = record(Some(&spec), ME, &now, 15);
    assert_eq!(taken.holder_identity.as_deref(), Some(ME));
    assert_eq!(taken.acquire_time.as_ref(), Some(&now));
    assert_eq!(taken.renew_time.as_ref(), Some(&now));
    assert_eq!(taken.lease_transitions, Some(4));
}

#[test]
fn transitions_never_overflow() {
    assert_eq!(next_transition(None), 1);
    assert_eq!(next_transition(Some(0)), 1);
    assert_eq!(next_transition(Some(41)), 42);
    // At the top the count stays there: a wrapped (negative) count would be rejected by
    // the API server, and no replica could ever take the lease over again.
    assert_eq!(next_transition(Some(i32::MAX - 1)), i32::MAX);
    assert_eq!(next_transition(Some(i32::MAX)), i32::MAX);
    assert_eq!(next_transition(Some(-5)), 1);
    let mut spec = held_by("other", "2026-01-01T00:00:00Z");
    spec.lease_transitions = Some(i32::MAX);
    let taken = record(Some(&spec), ME, &at("2026-01-01T00:01:00Z"), 15);
    assert_eq!(taken.lease_transitions, Some(i32::MAX));
    // Renewing does not count a transition at all.
    let renewed = record(Some(&taken), ME, &at("2026-01-01T00:01:02Z"), 15);
    assert_eq!(renewed.lease_transitions, Some(i32::MAX));
}

#[test]
fn holder_duration_is_the_one_in_the_lease() {
    let t0 = Instant::now();
    let mut long = held_by("other", "2026-01-01T00:00:00Z");
    long.lease_duration_seconds = Some(60);
    let mut unset = long.clone();
    unset.lease_duration_seconds = None;
    assert_eq!(
        candidate(t0, &[(Duration::ZERO, &long), (59 * SECOND, &long)]),
        [wait("other", 60 * SECOND), wait("other", SECOND)]
    );
    // Without one, ours (15 s) applies.
    assert_eq!(
        candidate(t0, &[(Duration::ZERO, &unset), (15 * SECOND, &unset)])[1],
        Decision::Acquire {
            expired_holder: Some("other".into())
        }
    );
}

#[test]
fn clock_skew_does_not_change_the_decision() {
    let t0 = Instant::now();
    // The holder's clock is a year ahead, a year behind, or right: renewTime is never
    // compared with our clock, only whether the record changes.
    let skewed = [
        "2027-01-01T00:00:00Z",
        "2025-01-01T00:00:00Z",
        "2026-01-01T00:00:00Z",
        "1970-01-01T00:00:01Z",
    ];
    for renewed in skewed {
        let spec = held_by("other", renewed);
        assert_eq!(
            candidate(
                t0,
                &[
                    (Duration::ZERO, &spec),
                    (14 * SECOND, &spec),
                    (15 * SECOND, &spec)
                ]
            ),
            [
                wait("other", 15 * SECOND),
                wait("other", SECOND),
                Decision::Acquire {
                    expired_holder: Some("other".into())
                },
            ],
            "renewTime {renewed}"
        );
    }
    // A holder renewing with a clock stuck in the past still counts as renewing.
    let stuck = [
        held_by("other", "2020-01-01T00:00:00Z"),
        held_by("other", "2020-01-01T00:00:01Z"),
    ];
    let decisions = candidate(
        t0,
        &[
            (Duration::ZERO, &stuck[0]),
            (14 * SECOND, &stuck[1]),
            (28 * SECOND, &stuck[1]),
        ],
    );
    assert_eq!(decisions[2], wait("other", SECOND));
}

#[test]
fn lease_edited_by_a_third_party() {
    let config = config();
    let t0 = Instant::now();
    let mine = held_by(ME, "2026-01-01T00:00:00Z");
    let mut observed = Some((mine.clone(), t0));
    // Another holder written over ours while we lead: step down at once (client-go's
    // observed record no longer names us, so it is not the leader any more).
    let intruder = held_by("intruder", "2026-01-01T00:00:02Z");
    assert_eq!(
        decide(
            t0 + 2 * SECOND,
            ME,
            Some(&intruder),
            observed.as_ref(),
            &config,
            Some(t0)
        ),
        Decision::StepDown {
            reason: "lease taken over by intruder".into()
        }
    );
    // Our lease's duration edited while we lead: renewed, and our duration written back.
    let mut shortened = mine.clone();
    shortened.lease_duration_seconds = Some(1);
    assert_eq!(
        decide(
            t0 + 2 * SECOND,
            ME,
            Some(&shortened),
            observed.as_ref(),
            &config,
            Some(t0)
        ),
        Decision::Renew
    );
    let renewed = record(Some(&shortened), ME, &at("2026-01-01T00:00:02Z"), 15);
    assert_eq!(renewed.lease_duration_seconds, Some(15));
    // Our holder emptied by someone else while we lead: the lease is free, taken again.
    let mut emptied = mine.clone();
    emptied.holder_identity = None;
    observe(&mut observed, &emptied, t0 + 2 * SECOND);
    assert_eq!(
        decide(
            t0 + 2 * SECOND,
            ME,
            Some(&emptied),
            observed.as_ref(),
            &config,
            Some(t0)
        ),
        Decision::Acquire {
            expired_holder: None
        }
    );
    // A candidate watching another's lease whose duration is edited: a changed record,
    // so the expiry clock restarts, with the new duration.
    let theirs = held_by("other", "2026-01-01T00:00:00Z");
    let mut lengthened = theirs.clone();
    lengthened.lease_duration_seconds = Some(60);
    assert_eq!(
        candidate(
            t0,
            &[
                (Duration::ZERO, &theirs),
                (10 * SECOND, &lengthened),
                (25 * SECOND, &lengthened)
            ]
        ),
        [
            wait("other", 15 * SECOND),
            wait("other", 60 * SECOND),
            wait("other", 45 * SECOND)
        ]
    );
}

#[test]
fn own_lease_is_renewed() {
    let config = config();
    let t0 = Instant::now();
    let mine = held_by(ME, "2026-01-01T00:00:00Z");
    let observed = Some((mine.clone(), t0));
    // Unchanged since our last write (it is our own record): renewed, never "expired".
    for later in [2 * SECOND, 9 * SECOND] {
        assert_eq!(
            decide(
                t0 + later,
                ME,
                Some(&mine),
                observed.as_ref(),
                &config,
                Some(t0 + later - 2 * SECOND)
            ),
            Decision::Renew
        );
    }
    // A candidate that finds its own identity (it created the lease, then the answer
    // was lost) renews rather than waits.
    assert_eq!(
        decide(t0 + 60 * SECOND, ME, Some(&mine), None, &config, None),
        Decision::Renew
    );
    let now = at("2026-01-01T00:00:02Z");
    let renewed = record(Some(&mine), ME, &now, 15);
    assert_eq!(renewed.acquire_time, mine.acquire_time);
    assert_eq!(renewed.lease_transitions, mine.lease_transitions);
    assert_eq!(renewed.renew_time, Some(now));
}

#[test]
fn renew_deadline_makes_the_leader_step_down() {
    let config = config();
    let t0 = Instant::now();
    let mine = held_by(ME, "2026-01-01T00:00:00Z");
    let step_down = Decision::StepDown {
        reason: "not renewed within the renew deadline".into(),
    };
    let just_in_time = t0 + Duration::from_millis(9_999);
    assert_eq!(
        decide(just_in_time, ME, Some(&mine), None, &config, Some(t0)),
        Decision::Renew
    );
    for late in [10 * SECOND, 11 * SECOND] {
        // Whatever the Lease says, even when it is missing.
        assert_eq!(
            decide(t0 + late, ME, Some(&mine), None, &config, Some(t0)),
            step_down
        );
        assert_eq!(
            decide(t0 + late, ME, None, None, &config, Some(t0)),
            step_down
        );
    }
    assert!(!renew_deadline_passed(just_in_time, t0, &config));
    assert!(renew_deadline_passed(t0 + 10 * SECOND, t0, &config));
}

#[test]
fn observation_restarts_when_the_record_changes() {
    let t0 = Instant::now();
    let first = held_by("other", "2026-01-01T00:00:00Z");
    let second = held_by("other", "2026-01-01T00:00:02Z");
    let mut observed = None;
    observe(&mut observed, &first, t0);
    observe(&mut observed, &first, t0 + 5 * SECOND);
    assert_eq!(observed.as_ref().map(|(_, at)| *at), Some(t0));
    observe(&mut observed, &second, t0 + 6 * SECOND);
    assert_eq!(observed, Some((second, t0 + 6 * SECOND)));
}

#[test]
fn release_empties_only_our_lease() {
    let now = at("2026-01-01T00:00:30Z");
    let mine = held_by(ME, "2026-01-01T00:00:28Z");
    let released_spec = released(&mine, ME, now.clone()).unwrap();
    assert_eq!(released_spec.holder_identity, None);
    assert_eq!(released_spec.lease_duration_seconds, Some(1));
    assert_eq!(released_spec.renew_time, Some(now.clone()));
    assert_eq!(released_spec.acquire_time, mine.acquire_time);
    assert_eq!(released_spec.lease_transitions, mine.lease_transitions);
    assert_eq!(
        released(&held_by("other", "2026-01-01T00:00:28Z"), ME, now),
        None
    );
    // Which a candidate then takes at once.
    assert_eq!(
        candidate(Instant::now(), &[(Duration::ZERO, &released_spec)]),
        [Decision::Acquire {
            expired_holder: None
        }]
    );
}
