//! The election's own OS thread and current-thread Tokio runtime.
//!
//! Why: an operator runs every reconcile on one current-thread runtime, and the lease is
//! renewed by a timer task. A timer that fires only queues its task behind every task
//! that is ready to run, and a reconcile may hold the thread for a while between two
//! awaits (serialising a large object, parsing a list, a tenant's flood of triggers).
//! Measured on this workspace's 2-core machine by `renewal_is_not_starved_by_a_busy_runtime`
//! below (50 ready tasks, each holding the thread 20 ms per poll): a 100 ms timer on the
//! busy runtime fired 939 ms late; on this thread it fired at most 6.7 ms late (15 rounds,
//! while the other runtime was busy). A lease that must be renewed within 10 s needs its
//! renewals to be independent of how much tenant work is queued, so the election, its
//! timers and its client (whose buffer task and connections are spawned on the runtime it
//! is built in) all live here. The cost: one thread and one small runtime; the election
//! already had a client of its own (own connections, own token bucket).

use std::io;

use tokio::{runtime::Handle, sync::oneshot};

/// The election's runtime, on a thread of its own; the thread ends when this is dropped.
#[derive(Debug)]
pub(super) struct ElectionRuntime {
    handle: Handle,
    /// Dropped with this value: the thread's `block_on` returns and its runtime (with
    /// every task still on it) is dropped.
    _stop: Option<oneshot::Sender<()>>,
}

impl ElectionRuntime {
    /// Starts the thread. If it cannot be started (the OS refuses a thread or an epoll
    /// instance), the election runs on the caller's runtime, as it did before it had a
    /// thread, and says so. Panics outside a Tokio runtime, like `tokio::spawn`.
    pub(super) fn start() -> Self {
        match Self::spawn() {
            Ok(runtime) => runtime,
            Err(error) => {
                tracing::warn!(%error, "cannot start the leader-election thread; the election shares the operator's runtime");
                Self {
                    handle: Handle::current(),
                    _stop: None,
                }
            }
        }
    }

    fn spawn() -> io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("leader-election".to_owned())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(Self {
            handle,
            _stop: Some(stop),
        })
    }

    /// Where the election's tasks are spawned.
    pub(super) fn handle(&self) -> &Handle {
        &self.handle
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::{
        sync::{
            Arc,
            atomic::{AtomicBool, Ordering},
        },
        time::Duration,
    };

    use tokio::time::Instant;

    use super::*;

    /// The latest a 100 ms timer fired, over `rounds` rounds, on the runtime of `handle`.
    async fn worst_timer_lateness(handle: &Handle, rounds: u32) -> Duration {
        handle
            .spawn(async move {
                let mut worst = Duration::ZERO;
                for _ in 0..rounds {
                    let due = Instant::now() + Duration::from_millis(100);
                    tokio::time::sleep_until(due).await;
                    worst = worst.max(Instant::now().saturating_duration_since(due));
                }
                worst
            })
            .await
            .unwrap()
    }

    /// Reconcile-like work on the current runtime: `tasks` tasks, each holding the thread
    /// `hold` per poll (a blocking sleep: the same for the scheduler as computing, without
    /// burning a shared CPU), until the returned flag is set.
    fn flood(tasks: usize, hold: Duration) -> Arc<AtomicBool> {
        let done = Arc::new(AtomicBool::new(false));
        for _ in 0..tasks {
            let done = done.clone();
            tokio::spawn(async move {
                while !done.load(Ordering::Relaxed) {
                    std::thread::sleep(hold);
                    tokio::task::yield_now().await;
                }
            });
        }
        done
    }

    #[tokio::test(flavor = "current_thread")]
    async fn renewal_is_not_starved_by_a_busy_runtime() {
        let election = ElectionRuntime::start();
        assert_ne!(
            election.handle().id(),
            Handle::current().id(),
            "the election has a runtime of its own"
        );
        let done = flood(50, Duration::from_millis(20));
        let own = worst_timer_lateness(election.handle(), 15).await;
        let shared = worst_timer_lateness(&Handle::current(), 1).await;
        done.store(true, Ordering::Relaxed);
        eprintln!(
            "worst lateness of a 100 ms timer: election thread {own:?}, busy runtime {shared:?}"
        );
        // 50 x 20 ms of work is queued ahead of a timer on the busy runtime.
        assert!(shared >= Duration::from_millis(500), "{shared:?}");
        // Generous for a loaded 2-core machine; still far below a renew deadline.
        assert!(own < Duration::from_millis(300), "{own:?}");
    }

    #[tokio::test]
    async fn the_thread_ends_with_its_runtime() {
        let election = ElectionRuntime::start();
        let task = election.handle().spawn(std::future::pending::<()>());
        drop(election);
        // The runtime was dropped with the thread: its task is cancelled.
        let ended = tokio::time::timeout(Duration::from_secs(10), task).await;
        assert!(ended.unwrap().unwrap_err().is_cancelled());
    }
}
