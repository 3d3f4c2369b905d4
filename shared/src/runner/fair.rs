//! Turns taken fairly across namespaces: a fixed number of slots, and when every slot is
//! taken, the next free one goes to the namespace next in turn among those with someone
//! waiting (round robin), and within a namespace to its earliest waiter. One namespace's
//! burst then waits behind itself, and another namespace's work waits for at most one
//! slot to free up per namespace ahead of it.
//!
//! Two users: the reconcile slots (`--max-concurrent-reconciles`; kube's own queue hands
//! ready objects to its slots first come, first served, so it runs with no limit of its
//! own and every reconcile takes its slot here), and the client's token bucket
//! (`shared::runner::rate_limit`), whose tokens go to namespaces in turn.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, PoisonError},
};

use tokio::sync::oneshot;

/// Slots shared by every scope of the process, taken in turn by namespace.
#[derive(Debug)]
pub(crate) struct FairSlots {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Slots nobody holds.
    free: usize,
    /// The waiters of each namespace, earliest first.
    waiting: HashMap<Arc<str>, VecDeque<oneshot::Sender<()>>>,
    /// The namespaces with waiters, in the order they are served.
    turn: VecDeque<Arc<str>>,
}

/// A slot, held until dropped (then handed to the next waiter in turn).
#[derive(Debug)]
pub(crate) struct Slot {
    slots: Arc<FairSlots>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.release();
    }
}

/// A wait for a slot; a wait given up after its slot was handed over gives it back.
struct Waiting {
    slot: oneshot::Receiver<()>,
    slots: Arc<FairSlots>,
    done: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if !self.done {
            self.slot.close();
            if self.slot.try_recv().is_ok() {
                self.slots.release();
            }
        }
    }
}

impl FairSlots {
    /// `slots` slots (at least one).
    pub(crate) fn new(slots: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                free: slots.max(1),
                ..State::default()
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is consistent between statements: a panic elsewhere cannot break it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a slot for work in `namespace`, waiting for its turn.
    pub(crate) async fn acquire(self: &Arc<Self>, namespace: &str) -> Slot {
        let slot = {
            let mut state = self.state();
            if state.free > 0 && state.turn.is_empty() {
                state.free -= 1;
                return Slot {
                    slots: Arc::clone(self),
                };
            }
            let (tx, rx) = oneshot::channel();
            let key: Arc<str> = namespace.into();
            let State { waiting, turn, .. } = &mut *state;
            let queue = waiting.entry(Arc::clone(&key)).or_default();
            if queue.is_empty() {
                turn.push_back(key);
            }
            queue.push_back(tx);
            rx
        };
        let mut waiting = Waiting {
            slot,
            slots: Arc::clone(self),
            done: false,
        };
        // An error means the slots are gone (the runner is stopping): go on without one.
        let _ = (&mut waiting.slot).await;
        waiting.done = true;
        Slot {
            slots: Arc::clone(self),
        }
    }

    /// Hands a freed slot to the first waiter of the namespace whose turn it is, or keeps it.
    fn release(&self) {
        let mut state = self.state();
        let State {
            free,
            waiting,
            turn,
        } = &mut *state;
        while let Some(namespace) = turn.pop_front() {
            let Some(queue) = waiting.get_mut(&namespace) else {
                continue;
            };
            let next = queue.pop_front();
            if queue.is_empty() {
                waiting.remove(&namespace);
            } else {
                turn.push_back(namespace);
            }
            // A waiter that gave up is skipped.
            if let Some(tx) = next
                && tx.send(()).is_ok()
            {
                return;
            }
        }
        *free += 1;
    }

    /// How many namespaces have reconciles waiting (for tests).
    #[cfg(test)]
    fn namespaces_waiting(&self) -> usize {
        self.state().turn.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::Mutex as StdMutex;

    /// Starts a task per `(namespace, id)` that takes a slot, records `id` and holds the
    /// slot until `hold` is closed; returns the record.
    fn start(
        slots: &Arc<FairSlots>,
        order: &Arc<StdMutex<Vec<String>>>,
        who: &[(&str, usize)],
        hold: &tokio::sync::watch::Receiver<u32>,
    ) {
        for (ns, id) in who {
            let (slots, order, ns, id, mut hold) = (
                Arc::clone(slots),
                Arc::clone(order),
                (*ns).to_owned(),
                *id,
                hold.clone(),
            );
            tokio::spawn(async move {
                let _slot = slots.acquire(&ns).await;
                let place = {
                    let mut order = order.lock().unwrap();
                    order.push(format!("{ns}{id}"));
                    order.len()
                };
                // Held until the test has let go of as many reconciles as started so far.
                let _ = hold.wait_for(|n| *n as usize >= place).await;
            });
        }
    }

    #[tokio::test(start_paused = true)]
    async fn another_namespace_is_served_next_not_after_a_burst() {
        let slots = FairSlots::new(2);
        let order = Arc::new(StdMutex::new(Vec::new()));
        let (release, hold) = tokio::sync::watch::channel(0u32);
        let burst: Vec<(&str, usize)> = (0..20).map(|i| ("a", i)).collect();
        start(&slots, &order, &burst, &hold);
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        start(&slots, &order, &[("b", 0), ("c", 0)], &hold);
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        assert_eq!(
            *order.lock().unwrap(),
            ["a0", "a1"],
            "two slots, both taken by a"
        );
        assert_eq!(slots.namespaces_waiting(), 3);
        // Let the reconciles finish one at a time.
        for n in 1..=22 {
            release.send(n).unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(order.len(), 22);
        let at = |who: &str| order.iter().position(|o| o == who).unwrap();
        assert!(
            at("b0") <= 3,
            "b waited for one slot of a, not for its burst: {order:?}"
        );
        assert!(at("c0") <= 4, "c after b, before the rest of a: {order:?}");
        assert_eq!(slots.namespaces_waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_given_up_takes_no_slot_with_it() {
        let slots = FairSlots::new(1);
        let held = slots.acquire("a").await;
        let gave_up = tokio::spawn({
            let slots = Arc::clone(&slots);
            async move { slots.acquire("b").await }
        });
        tokio::task::yield_now().await;
        gave_up.abort();
        let _ = gave_up.await;
        drop(held);
        // The one slot is free again: taken at once.
        let again =
            tokio::time::timeout(std::time::Duration::from_secs(1), slots.acquire("c")).await;
        assert!(again.is_ok(), "the slot came back");
    }
}
