//! Keeping a won leadership: one loop for both modes. A lease is renewed and lost when no
//! renewal succeeded within the renew deadline; a for-life lock is checked and lost only
//! when it is seen gone or taken. Both report a loss once, then wait for the replica to
//! acknowledge that it stopped leading, and end the process when it does not in time.
//!
//! All instants are Tokio's, so the timing is tested with paused time.

use std::{future::Future, time::Duration};

use tokio::{sync::oneshot, time::Instant};

use super::LeaderConfig;
use super::LeaderElectionMode;

/// The leadership-lost reason of a leader that could not renew in time.
pub(super) const NOT_RENEWED: &str = "not renewed within the renew deadline";

/// What one renewal or check tells the leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Check {
    /// Still held (a lease renewed, a for-life lock still owned by this Pod).
    Held,
    /// Not held any more: stop leading, for this reason.
    Lost(String),
    /// Could not tell (an API error, a conflicting write): try again next period.
    Unknown(String),
}

/// A lock its leader keeps.
pub(super) trait Keep: Send + 'static {
    /// One renewal or check. `last_held` is when the last successful one was sent.
    fn check(&mut self, last_held: Instant) -> impl Future<Output = Check> + Send;

    /// Hands the lock back on shutdown (a Lease's release; nothing for a for-life lock).
    fn release(&mut self) -> impl Future<Output = ()> + Send;
}

/// How the loop paces itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pace {
    /// Between two checks.
    pub period: Duration,
    /// Leadership ends when no check succeeded for this long, counted from when the last
    /// successful one was sent; `None`: never (leader-for-life has no expiry).
    pub deadline: Option<Duration>,
    /// How long the loop waits, after reporting a loss, for the replica to drop or release
    /// its [`Leadership`](super::Leadership) before the fence ends the process.
    pub grace: Duration,
}

impl Pace {
    /// The pace of `mode`. The grace is half the margin between the renew deadline and
    /// the lease duration (2.5 s by default): a candidate can take the lease over only a
    /// lease duration after the last renewal was sent, and the leader reported the loss a
    /// renew deadline after it; the other half absorbs clock-rate differences and the exit.
    /// Leader-for-life checks its lock every retry period and uses the same grace.
    pub(super) fn of(mode: LeaderElectionMode, config: &LeaderConfig) -> Self {
        let margin = config.lease_duration.saturating_sub(config.renew_deadline);
        Pace {
            period: config.retry_period,
            deadline: match mode {
                LeaderElectionMode::Lease => Some(config.renew_deadline),
                LeaderElectionMode::ForLife => None,
            },
            grace: margin / 2,
        }
    }
}

/// Keeps `lock`, won by a request sent at `since`, until `stop` resolves (sent: release;
/// dropped: the replica stopped leading; either way the lock is released) or the
/// leadership is lost. A loss is sent on `lost` once; if `stop` does not resolve within
/// the grace after that, `fence` runs (in production it ends the process: a replica whose
/// runtime is too busy to stop its controllers must not outlive its lease).
///
/// A check runs every period; while a deadline applies, the wait for the next check and
/// the check itself end at `last sent + deadline`, so the loss is reported at the deadline,
/// never a period later and never later for a slow answer.
pub(super) async fn keep<K: Keep>(
    mut lock: K,
    pace: Pace,
    since: Instant,
    mut stop: oneshot::Receiver<()>,
    lost: oneshot::Sender<String>,
    fence: impl FnOnce(&str) + Send,
) {
    let mut last_held = since;
    let reason = loop {
        let deadline = pace.deadline.map(|d| last_held + d);
        tokio::select! {
            biased;
            _ = &mut stop => {
                lock.release().await;
                return;
            }
            () = until(deadline) => break NOT_RENEWED.to_owned(),
            () = tokio::time::sleep(pace.period) => {}
        }
        let sent = Instant::now();
        let checked = tokio::select! {
            biased;
            _ = &mut stop => None,
            check = bounded(deadline, lock.check(last_held)) => Some(check),
        };
        let Some(check) = checked else {
            lock.release().await;
            return;
        };
        match check {
            Check::Held => last_held = sent,
            Check::Lost(reason) => break reason,
            Check::Unknown(error) => {
                tracing::warn!(%error, "cannot renew or check the leadership; retrying");
            }
        }
    };
    if lost.send(reason.clone()).is_err() {
        // Nobody holds the leadership any more: nothing leads on it.
        return;
    }
    if tokio::time::timeout(pace.grace, &mut stop).await.is_err() {
        fence(&reason);
    }
}

/// Sleeps until `deadline`; forever without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// `check`, cut off at `deadline` (a loss) when there is one.
async fn bounded(deadline: Option<Instant>, check: impl Future<Output = Check>) -> Check {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, check)
            .await
            .unwrap_or_else(|_| Check::Lost(NOT_RENEWED.to_owned())),
        None => check.await,
    }
}

/// The production fence: the replica did not stop leading within the grace after a loss
/// (its runtime is starved or stuck), so the process ends before another replica may
/// take over. The exit status is 1, as for a loss the replica reported itself.
pub(super) fn exit_process(reason: &str) {
    tracing::error!(
        %reason,
        "leader election lost and the controllers did not stop in time; exiting"
    );
    std::process::exit(1);
}

#[cfg(test)]
mod tests;
