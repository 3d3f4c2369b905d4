//! The keeping loop's timing with paused time: a scripted lock answers each check after a
//! chosen delay; the test reads when the loss was reported, to the millisecond.

#![allow(clippy::unwrap_used)]
use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

use tokio::runtime::Handle;

use super::*;
use crate::runner::leader::{Leadership, TASK_ENDED};

const SECOND: Duration = Duration::from_secs(1);

/// The default lease timing: renew every 2 s, deadline 10 s, grace 2.5 s.
fn lease_pace() -> Pace {
    Pace {
        period: 2 * SECOND,
        deadline: Some(10 * SECOND),
        grace: Duration::from_millis(2500),
    }
}

/// What a scripted check does.
#[derive(Debug, Clone)]
enum Step {
    /// Answers after the delay.
    Answer(Duration, Check),
    /// Never answers.
    Hang,
    /// Panics.
    Panic,
}

/// What the scripted lock saw.
#[derive(Debug, Default)]
struct Seen {
    /// When each check was sent, and the `last_held` it was given.
    checks: Vec<(Instant, Instant)>,
    released: bool,
    fenced: Option<(String, Instant)>,
}

/// A lock that answers the checks as `script` says, then as `then` says forever.
struct Scripted {
    script: VecDeque<Step>,
    then: Step,
    seen: Arc<Mutex<Seen>>,
}

impl Keep for Scripted {
    async fn check(&mut self, last_held: Instant) -> Check {
        self.seen
            .lock()
            .unwrap()
            .checks
            .push((Instant::now(), last_held));
        match self.script.pop_front().unwrap_or_else(|| self.then.clone()) {
            Step::Answer(delay, check) => {
                tokio::time::sleep(delay).await;
                check
            }
            Step::Hang => std::future::pending().await,
            Step::Panic => panic!("the renewal panicked"),
        }
    }

    async fn release(&mut self) {
        self.seen.lock().unwrap().released = true;
    }
}

/// Starts keeping a scripted lock won at `t0` (now).
fn lead(script: Vec<Step>, then: Step, pace: Pace) -> (Leadership, Arc<Mutex<Seen>>, Instant) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let lock = Scripted {
        script: script.into(),
        then,
        seen: seen.clone(),
    };
    let fenced = seen.clone();
    let t0 = Instant::now();
    let leadership = Leadership::spawn(&Handle::current(), lock, pace, t0, move |reason| {
        fenced.lock().unwrap().fenced = Some((reason.to_owned(), Instant::now()));
    });
    (leadership, seen, t0)
}

fn held(delay: Duration) -> Step {
    Step::Answer(delay, Check::Held)
}

fn failed() -> Step {
    Step::Answer(Duration::ZERO, Check::Unknown("503".into()))
}

#[tokio::test(start_paused = true)]
async fn renewals_that_succeed_keep_the_leadership() {
    let (mut leadership, seen, t0) = lead(vec![], held(Duration::from_millis(50)), lease_pace());
    let lost = tokio::time::timeout(60 * SECOND, leadership.lost()).await;
    assert!(lost.is_err(), "lost while renewing: {lost:?}");
    let checks = seen.lock().unwrap().checks.clone();
    // Every 2 s after the previous answer; each given the previous send as last_held.
    assert_eq!(checks[0], (t0 + 2 * SECOND, t0));
    assert_eq!(
        checks[1],
        (t0 + Duration::from_millis(4050), t0 + 2 * SECOND)
    );
    assert!(checks.len() >= 28, "{}", checks.len());
    leadership.release().await;
    assert!(seen.lock().unwrap().released);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_counts_from_when_the_renewal_was_sent() {
    // Renewed by a request sent at 2 s that the API server answered only at 9 s; then
    // no answer at all. Others saw the record change at some time after 2 s, so the
    // leader must stop 10 s after 2 s, not 10 s after 9 s.
    let (mut leadership, seen, t0) = lead(vec![held(7 * SECOND)], Step::Hang, lease_pace());
    let reason = leadership.lost().await;
    assert_eq!(reason, NOT_RENEWED);
    assert_eq!(Instant::now() - t0, 12 * SECOND);
    let checks = seen.lock().unwrap().checks.clone();
    assert_eq!(checks[1], (t0 + 11 * SECOND, t0 + 2 * SECOND));
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_end_at_the_deadline_not_a_period_later() {
    // Every renewal fails at once; with a 3 s period the attempts are at 3, 6 and 9 s,
    // and the next would be at 12 s: the loss is reported at 10 s all the same.
    let pace = Pace {
        period: 3 * SECOND,
        ..lease_pace()
    };
    let (mut leadership, seen, t0) = lead(vec![], failed(), pace);
    assert_eq!(leadership.lost().await, NOT_RENEWED);
    assert_eq!(Instant::now() - t0, 10 * SECOND);
    assert_eq!(seen.lock().unwrap().checks.len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_hangs_is_cut_off_at_the_deadline() {
    let (mut leadership, _, t0) = lead(vec![held(SECOND)], Step::Hang, lease_pace());
    assert_eq!(leadership.lost().await, NOT_RENEWED);
    // Last renewal sent at 2 s.
    assert_eq!(Instant::now() - t0, 12 * SECOND);
}

#[tokio::test(start_paused = true)]
async fn a_lost_check_is_reported_at_once() {
    let taken = Step::Answer(
        Duration::from_millis(30),
        Check::Lost("lease taken over by other".into()),
    );
    let (mut leadership, _, t0) = lead(vec![held(Duration::ZERO)], taken, lease_pace());
    assert_eq!(leadership.lost().await, "lease taken over by other");
    assert_eq!(Instant::now() - t0, Duration::from_millis(4030));
}

#[tokio::test(start_paused = true)]
async fn a_dead_renewal_task_reads_as_lost() {
    let (mut leadership, seen, t0) = lead(vec![held(Duration::ZERO)], Step::Panic, lease_pace());
    assert_eq!(leadership.lost().await, TASK_ENDED);
    assert_eq!(Instant::now() - t0, 4 * SECOND);
    // Resolves once; afterwards pending, and release after a dead task returns.
    assert!(
        tokio::time::timeout(SECOND, leadership.lost())
            .await
            .is_err()
    );
    leadership.release().await;
    assert!(!seen.lock().unwrap().released);
}

#[tokio::test(start_paused = true)]
async fn a_loss_the_replica_does_not_act_on_ends_the_process() {
    // The replica learns of the loss but keeps its Leadership (its runtime is stuck):
    // the fence runs once the grace is over.
    let (mut leadership, seen, t0) = lead(vec![], failed(), lease_pace());
    assert_eq!(leadership.lost().await, NOT_RENEWED);
    tokio::time::sleep(10 * SECOND).await;
    let fenced = seen.lock().unwrap().fenced.clone();
    assert_eq!(
        fenced,
        Some((
            NOT_RENEWED.to_owned(),
            t0 + 10 * SECOND + Duration::from_millis(2500)
        ))
    );
    drop(leadership);
}

#[tokio::test(start_paused = true)]
async fn a_loss_acted_on_in_time_does_not_end_the_process() {
    let (mut leadership, seen, _) = lead(vec![], failed(), lease_pace());
    leadership.lost().await;
    // What the runner does: stop the controllers, drop the leadership.
    tokio::time::sleep(2 * SECOND).await;
    drop(leadership);
    tokio::time::sleep(10 * SECOND).await;
    let seen = seen.lock().unwrap();
    assert_eq!(seen.fenced, None);
    // A lost lease is not released (it may be another's by now).
    assert!(!seen.released);
}

#[tokio::test(start_paused = true)]
async fn release_does_not_wait_for_a_renewal_in_flight() {
    let (leadership, seen, t0) = lead(vec![], Step::Hang, lease_pace());
    tokio::time::sleep(3 * SECOND).await;
    leadership.release().await;
    assert_eq!(Instant::now() - t0, 3 * SECOND);
    assert!(seen.lock().unwrap().released);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_leadership_releases_the_lock() {
    let (leadership, seen, _) = lead(vec![], held(Duration::ZERO), lease_pace());
    tokio::time::sleep(3 * SECOND).await;
    drop(leadership);
    tokio::time::sleep(SECOND).await;
    assert!(seen.lock().unwrap().released);
}

#[tokio::test(start_paused = true)]
async fn leadership_for_life_outlasts_errors_and_ends_when_taken() {
    let pace = Pace::of(
        LeaderElectionMode::ForLife,
        &LeaderConfig {
            lease_name: "lock".into(),
            namespace: "default".into(),
            identity: "me".into(),
            lease_duration: 15 * SECOND,
            renew_deadline: 10 * SECOND,
            retry_period: 2 * SECOND,
        },
    );
    // A minute of API errors (a cut-off leader) does not end it; the lock owned by
    // another Pod does.
    let mut script = vec![failed(); 30];
    script.push(Step::Answer(
        Duration::ZERO,
        Check::Lost("the leader-for-life lock is now held by pod b".into()),
    ));
    let (mut leadership, _, t0) = lead(script, held(Duration::ZERO), pace);
    assert_eq!(
        leadership.lost().await,
        "the leader-for-life lock is now held by pod b"
    );
    assert_eq!(Instant::now() - t0, 62 * SECOND);
}

#[test]
fn pace_of_each_mode() {
    let config = LeaderConfig {
        lease_name: "lock".into(),
        namespace: "default".into(),
        identity: "me".into(),
        lease_duration: 15 * SECOND,
        renew_deadline: 10 * SECOND,
        retry_period: 2 * SECOND,
    };
    assert_eq!(Pace::of(LeaderElectionMode::Lease, &config), lease_pace());
    assert_eq!(
        Pace::of(LeaderElectionMode::ForLife, &config),
        Pace {
            deadline: None,
            ..lease_pace()
        }
    );
}
