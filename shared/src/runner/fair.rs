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
    waiting: HashMap<Arc<str>, VecDeque<Waiter>>,
    /// The namespaces with waiters, in the order they are served.
    turn: VecDeque<Arc<str>>,
}

/// Someone waiting for a slot.
enum Waiter {
    /// A task parked in [`FairSlots::acquire`].
    Task(oneshot::Sender<()>),
    /// A call queued by [`FairSlots::try_acquire_or_queue`], made with the slot (outside
    /// the lock: dropping the slot there hands it on).
    Call(Box<dyn FnOnce(Slot) + Send>),
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Waiter::Task(_) => "Task",
            Waiter::Call(_) => "Call",
        })
    }
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

impl State {
    /// Queues `waiter` in `namespace`, last (or `first`), which takes its turn if it had
    /// no waiter.
    fn push(&mut self, namespace: &str, first: bool, waiter: Waiter) {
        let key: Arc<str> = namespace.into();
        let queue = self.waiting.entry(Arc::clone(&key)).or_default();
        if queue.is_empty() {
            self.turn.push_back(key);
        }
        if first {
            queue.push_front(waiter);
        } else {
            queue.push_back(waiter);
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
            if let Some(slot) = self.take_free(&mut state) {
                return slot;
            }
            let (tx, rx) = oneshot::channel();
            state.push(namespace, false, Waiter::Task(tx));
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

    /// A slot for work in `namespace` now, if one is free and nobody waits; else `granted`
    /// is queued in the namespace's turn (before the namespace's other waiters when
    /// `first` says so, asked only then, under the lock: keep it cheap) and called with
    /// the slot when its turn comes (by whoever frees it). Nothing waits meanwhile: a
    /// queued call is all the memory a waiting reconcile takes.
    pub(crate) fn try_acquire_or_queue(
        self: &Arc<Self>,
        namespace: &str,
        first: impl FnOnce() -> bool,
        granted: impl FnOnce(Slot) + Send + 'static,
    ) -> Option<Slot> {
        let mut state = self.state();
        let slot = self.take_free(&mut state);
        if slot.is_none() {
            state.push(namespace, first(), Waiter::Call(Box::new(granted)));
        }
        slot
    }

    /// A free slot when nobody waits for one.
    fn take_free(self: &Arc<Self>, state: &mut State) -> Option<Slot> {
        (state.free > 0 && state.turn.is_empty()).then(|| {
            state.free -= 1;
            Slot {
                slots: Arc::clone(self),
            }
        })
    }

    /// Hands a freed slot to the first waiter of the namespace whose turn it is, or keeps it.
    fn release(self: &Arc<Self>) {
        let call = {
            let mut state = self.state();
            let State {
                free,
                waiting,
                turn,
            } = &mut *state;
            loop {
                let Some(namespace) = turn.pop_front() else {
                    *free += 1;
                    return;
                };
                let Some(queue) = waiting.get_mut(&namespace) else {
                    continue;
                };
                let next = queue.pop_front();
                if queue.is_empty() {
                    waiting.remove(&namespace);
                } else {
                    turn.push_back(namespace);
                }
                match next {
                    // A waiter that gave up is skipped.
                    Some(Waiter::Task(tx)) => {
                        let taken = tx.send(()).is_ok();
                        if taken {
                            return;
                        }
                    }
                    Some(Waiter::Call(call)) => break call,
                    None => {}
                }
            }
        };
        call(Slot {
            slots: Arc::clone(self),
        });
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

    #[test]
    fn a_queued_call_gets_its_slot_in_turn_and_a_slot_dropped_there_goes_on() {
        let slots = FairSlots::new(1);
        let held = slots.try_acquire_or_queue("a", || false, |_| panic!("a slot was free"));
        assert!(held.is_some());
        let kept = Arc::new(StdMutex::new(Vec::new()));
        let served = Arc::new(StdMutex::new(Vec::new()));
        // a3 is queued first in a's turn.
        for (who, keep) in [("a1", false), ("a2", true), ("b1", true), ("a3", false)] {
            let (kept, served) = (Arc::clone(&kept), Arc::clone(&served));
            let first = who == "a3";
            let queued = slots.try_acquire_or_queue(
                &who[..1],
                || first,
                move |slot| {
                    served.lock().unwrap().push(who);
                    if keep {
                        kept.lock().unwrap().push(slot);
                    }
                },
            );
            assert!(queued.is_none(), "no slot free for {who}");
        }
        drop(held);
        // a3 let its slot go at once: b's turn came before a's second.
        assert_eq!(*served.lock().unwrap(), ["a3", "b1"]);
        let slot = kept.lock().unwrap().pop();
        drop(slot);
        assert_eq!(*served.lock().unwrap(), ["a3", "b1", "a1", "a2"]);
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
