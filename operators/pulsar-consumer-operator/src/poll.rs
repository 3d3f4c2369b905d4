//! Reading backlogs in the background: one task per autoscaled PulsarConsumer.
//!
//! Why a task and not a request inside the reconcile: a reconcile must never wait on a
//! broker (a dead admin API would hold one of the `--max-concurrent-reconciles` slots for
//! the whole request timeout, and every other object would wait). Here the reconcile only
//! reads the latest observation from memory; the task asks the admin API once per
//! `pollIntervalSeconds` (5-second timeout, backoff doubling up to 2 minutes while it
//! fails), keeps what it got, and asks the controller to reconcile the object (the
//! `reconcile_on` trigger stream). No task runs for an object without autoscaling.
//!
//! A task ends when its object is gone or no longer autoscaled (it checks the cache of
//! PulsarConsumers before each read), when its settings change (the reconcile replaces it),
//! or when no controller listens any more (shutdown, lost leadership).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::Stream;
use kube::{ResourceExt, runtime::reflector::ObjectRef};
use shared::namespaces::ScopedStores;
use tokio::sync::broadcast;

use crate::{
    PulsarConsumer,
    admin::{AdminClient, AdminError, Target},
    autoscale::History,
};

/// How long one read of the admin API may take, connection included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest wait between two reads while they fail.
pub const MAX_BACKOFF: Duration = Duration::from_secs(120);

/// What one read of the backlog gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// When it was read (whole seconds since the epoch).
    pub at: i64,
    /// The backlog, or why it could not be read.
    pub result: Result<u64, AdminError>,
}

/// What a task polls: where, and how often. A change restarts the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Where to read.
    pub target: Target,
    /// How often.
    pub interval: Duration,
}

/// The wait before the next read: the interval after a success; after `failures`
/// consecutive failures the interval doubled for each but the first, at most
/// [`MAX_BACKOFF`] (or the interval, if longer).
#[must_use]
pub fn next_wait(interval: Duration, failures: u32) -> Duration {
    if failures == 0 {
        return interval;
    }
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(16));
    interval
        .saturating_mul(factor)
        .min(MAX_BACKOFF.max(interval))
}

struct Task {
    id: u64,
    uid: String,
    settings: Settings,
    latest: Arc<Mutex<Option<Observation>>>,
    handle: tokio::task::JoinHandle<()>,
}

struct Inner {
    admin: AdminClient,
    trigger: broadcast::Sender<ObjectRef<PulsarConsumer>>,
    tasks: Mutex<HashMap<ObjectRef<PulsarConsumer>, Task>>,
    consumers: ScopedStores<PulsarConsumer>,
    /// What the autoscaler remembers, by UID (a PulsarConsumer deleted and created again
    /// under the same name starts afresh). Forgotten with the poller.
    histories: Mutex<HashMap<String, History>>,
    next_id: AtomicU64,
}

/// The backlog pollers of the operator.
#[derive(Clone)]
pub struct Pollers {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Pollers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let running = self.inner.tasks.lock().map(|t| t.len()).unwrap_or(0);
        f.debug_struct("Pollers")
            .field("running", &running)
            .finish_non_exhaustive()
    }
}

impl Default for Pollers {
    fn default() -> Self {
        Self::new()
    }
}

impl Pollers {
    /// No task yet.
    #[must_use]
    pub fn new() -> Self {
        let (trigger, _) = broadcast::channel(1024);
        Self {
            inner: Arc::new(Inner {
                admin: AdminClient::default(),
                trigger,
                tasks: Mutex::new(HashMap::new()),
                consumers: ScopedStores::default(),
                histories: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(0),
            }),
        }
    }

    /// The PulsarConsumer caches the tasks check their object in (filled by the controller).
    #[must_use]
    pub fn consumers(&self) -> &ScopedStores<PulsarConsumer> {
        &self.inner.consumers
    }

    /// The objects to reconcile after a read, those in `namespace` (`None`: all), for
    /// `Controller::reconcile_on`. A receiver that falls behind skips what it missed (the
    /// next read triggers again).
    pub fn triggers(
        &self,
        namespace: Option<String>,
    ) -> impl Stream<Item = ObjectRef<PulsarConsumer>> + Send + 'static {
        let rx = self.inner.trigger.subscribe();
        futures::stream::unfold(rx, move |mut rx| {
            let namespace = namespace.clone();
            async move {
                loop {
                    match rx.recv().await {
                        Ok(obj)
                            if namespace
                                .as_deref()
                                .is_none_or(|ns| obj.namespace.as_deref() == Some(ns)) =>
                        {
                            return Some((obj, rx));
                        }
                        Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            }
        })
    }

    /// Makes sure one task polls `settings` for `pc` (starting or replacing it) and returns
    /// the latest observation (`None` before the first read of these settings).
    pub fn ensure(&self, pc: &PulsarConsumer, settings: Settings) -> Option<Observation> {
        let key = ObjectRef::from_obj(pc);
        let uid = pc.uid().unwrap_or_default();
        let Ok(mut tasks) = self.inner.tasks.lock() else {
            return None;
        };
        if let Some(task) = tasks.get(&key)
            && task.uid == uid
            && task.settings == settings
            && !task.handle.is_finished()
        {
            return task.latest.lock().ok().and_then(|l| l.clone());
        }
        if let Some(old) = tasks.remove(&key) {
            old.handle.abort();
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let latest = Arc::new(Mutex::new(None));
        let handle = tokio::spawn(run(
            Arc::clone(&self.inner),
            key.clone(),
            uid.clone(),
            settings.clone(),
            Arc::clone(&latest),
            id,
        ));
        tasks.insert(
            key,
            Task {
                id,
                uid,
                settings,
                latest,
                handle,
            },
        );
        None
    }

    /// Stops the task of `pc`, if any, and forgets its autoscaler history.
    pub fn stop(&self, pc: &PulsarConsumer) {
        let key = ObjectRef::from_obj(pc);
        if let Ok(mut tasks) = self.inner.tasks.lock()
            && let Some(task) = tasks.remove(&key)
        {
            task.handle.abort();
        }
        if let Ok(mut h) = self.inner.histories.lock() {
            h.remove(&pc.uid().unwrap_or_default());
        }
    }

    /// Runs `f` on the autoscaler history of `pc` (created empty); `None` if the lock is
    /// poisoned.
    pub fn with_history<T>(
        &self,
        pc: &PulsarConsumer,
        f: impl FnOnce(&mut History) -> T,
    ) -> Option<T> {
        let mut histories = self.inner.histories.lock().ok()?;
        Some(f(histories
            .entry(pc.uid().unwrap_or_default())
            .or_default()))
    }

    /// How many tasks run (for tests and logs).
    #[must_use]
    pub fn running(&self) -> usize {
        self.inner
            .tasks
            .lock()
            .map(|t| t.values().filter(|t| !t.handle.is_finished()).count())
            .unwrap_or(0)
    }
}

/// Whether the object with `uid` is still in the cache with autoscaling.
fn still_wanted(inner: &Inner, key: &ObjectRef<PulsarConsumer>, uid: &str) -> bool {
    let Some(ns) = key.namespace.as_deref() else {
        return false;
    };
    inner.consumers.find(ns, &key.name).is_some_and(|pc| {
        pc.uid().as_deref() == Some(uid)
            && pc.spec.autoscaling.is_some()
            && pc.metadata.deletion_timestamp.is_none()
    })
}

/// The task: read, keep, trigger, wait; until the object is gone or no one listens.
async fn run(
    inner: Arc<Inner>,
    key: ObjectRef<PulsarConsumer>,
    uid: String,
    settings: Settings,
    latest: Arc<Mutex<Option<Observation>>>,
    id: u64,
) {
    let mut partitioned = false;
    let mut failures = 0u32;
    let object = key.to_string();
    loop {
        if !still_wanted(&inner, &key, &uid) {
            tracing::debug!(%object, "autoscaling ended; backlog poller stops");
            if let Ok(mut h) = inner.histories.lock() {
                h.remove(&uid);
            }
            break;
        }
        let result = match tokio::time::timeout(
            REQUEST_TIMEOUT,
            inner.admin.backlog(&settings.target, &mut partitioned),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(AdminError::Unavailable {
                url: settings.target.admin_url.clone(),
                message: format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()),
            }),
        };
        match &result {
            Ok(backlog) => {
                if failures > 0 {
                    tracing::info!(%object, backlog, "the admin API answers again");
                }
                failures = 0;
                tracing::debug!(%object, backlog, "backlog read");
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(%object, %error, "cannot read the backlog");
                } else {
                    tracing::debug!(%object, %error, failures, "cannot read the backlog");
                }
            }
        }
        let at = jiff::Timestamp::now().as_second();
        if let Ok(mut l) = latest.lock() {
            *l = Some(Observation { at, result });
        }
        if inner.trigger.send(key.clone()).is_err() {
            tracing::debug!(%object, "no controller listens; backlog poller stops");
            break;
        }
        tokio::time::sleep(next_wait(settings.interval, failures)).await;
    }
    if let Ok(mut tasks) = inner.tasks.lock()
        && tasks.get(&key).is_some_and(|t| t.id == id)
    {
        tasks.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_interval_and_is_capped() {
        let s = Duration::from_secs;
        let waits: Vec<u64> = (0..9).map(|f| next_wait(s(15), f).as_secs()).collect();
        assert_eq!(waits, [15, 15, 30, 60, 120, 120, 120, 120, 120]);
        assert_eq!(next_wait(s(2), 3), s(8));
        assert_eq!(next_wait(s(2), 40), MAX_BACKOFF);
        // An interval longer than the cap is never shortened.
        assert_eq!(next_wait(s(600), 5), s(600));
    }

    fn autoscaled(ns: &str, name: &str) -> PulsarConsumer {
        let spec: crate::PulsarConsumerSpec = serde_json::from_value(serde_json::json!({
            "serverAddress": "pulsar://127.0.0.1:6650",
            "topic": "t",
            "subscriptionName": "s",
            "replicas": 1,
            "autoscaling": {"maxReplicas": 3, "targetBacklogPerReplica": 10}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let mut pc = PulsarConsumer::new(name, spec);
        pc.metadata.namespace = Some(ns.into());
        pc.metadata.uid = Some(format!("uid-{name}"));
        pc
    }

    #[tokio::test]
    async fn triggers_only_for_the_scopes_namespace() {
        use futures::StreamExt;
        let pollers = Pollers::new();
        let mut in_a = Box::pin(pollers.triggers(Some("a".into())));
        let mut all = Box::pin(pollers.triggers(None));
        for ns in ["b", "a"] {
            let sent = pollers.inner.trigger.send(ObjectRef::new("x").within(ns));
            assert!(sent.is_ok());
        }
        let first = in_a.next().await.unwrap_or_else(|| panic!("closed"));
        assert_eq!(first.namespace.as_deref(), Some("a"));
        let first = all.next().await.unwrap_or_else(|| panic!("closed"));
        assert_eq!(first.namespace.as_deref(), Some("b"));
    }

    #[tokio::test]
    async fn a_poller_without_its_object_stops_and_forgets() {
        let pollers = Pollers::new();
        let pc = autoscaled("ns", "gone");
        assert_eq!(
            pollers.with_history(&pc, |h| h.replicas = Some(3)),
            Some(())
        );
        let settings = Settings {
            // Nothing is read: the object is not in any cache, so the task ends first.
            target: Target {
                admin_url: "http://127.0.0.1:9".into(),
                topic: crate::admin::parse_topic("t").unwrap_or_else(|| panic!()),
                subscription: "s".into(),
            },
            interval: Duration::from_secs(1),
        };
        assert_eq!(pollers.ensure(&pc, settings), None, "no reading yet");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while pollers.running() > 0 || pollers.inner.tasks.lock().map(|t| t.len()).unwrap_or(1) > 0
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the poller still runs"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(pollers.with_history(&pc, |h| h.replicas), Some(None));

        // stop() forgets too.
        let other = autoscaled("ns", "other");
        let _ = pollers.with_history(&other, |h| h.replicas = Some(2));
        pollers.stop(&other);
        assert_eq!(pollers.with_history(&other, |h| h.replicas), Some(None));
    }
}
