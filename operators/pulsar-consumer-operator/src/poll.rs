//! Reading backlogs in the background: one task per autoscaled PulsarConsumer.
//!
//! Why a task and not a request inside the reconcile: a reconcile must never wait on a
//! broker (a dead admin API would hold one of the `--max-concurrent-reconciles` slots for
//! the whole request timeout, and every other object would wait). Here the reconcile only
//! reads the latest observation from memory; the task asks the admin API once per
//! `pollIntervalSeconds` (at least the operator's floor, [`Options::min_poll_interval`];
//! 5-second timeout; backoff doubling up to 2 minutes while it fails) and keeps what it got.
//! No task runs for an object without autoscaling.
//!
//! What one tenant's objects can cost the operator is bounded:
//! - reads in flight: at most [`Options::max_concurrent_polls`] for all objects together
//!   and a quarter of that for one namespace (semaphores; a read waits for a slot before
//!   its timeout starts), so a namespace whose endpoints hang holds a few slots, not all;
//! - memory: one read holds at most [`crate::admin::MAX_BODY_BYTES`] of answer, so all
//!   reads together hold at most that times the cap (about 13 MiB with the defaults);
//! - reconciles and status writes: a read asks the controller for a reconcile only when it
//!   matters ([`worth_a_reconcile`]): the first read, a change of the replicas the
//!   autoscaler would now decide or of `ScalingLimited`, a backlog that drains (reaches 0)
//!   or fills again, a read that fails for another reason or works again; a backlog that
//!   only moves is written to `status.backlog` at most every [`BACKLOG_REFRESH`]
//!   (whatever else reconciles the object writes the latest one too). Before, every read
//!   cost a reconcile and usually a status write, on the one thread that also renews the
//!   leader lease.
//!
//! What a tenant can observe of a failed read does not tell one target from another: every
//! failure has the same reason and message ([`crate::admin::REASON_UNAVAILABLE`]), and
//! every failure is reported when the read's timeout ([`REQUEST_TIMEOUT`]) has passed since
//! it started, not sooner (see `Inner::read`): a refused connection (microseconds), an HTTP
//! error (milliseconds) and a target that never answers (the timeout) all reach the status
//! at the same moment, and the next read follows the same backoff. Which failure it was
//! goes to the operator's log only.
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
use tokio::sync::{Semaphore, broadcast};

use crate::{
    PulsarConsumer,
    admin::{AdminClient, AdminError, Target},
    autoscale::{self, History, Limit, Policy, Reading},
    options::Options,
};

/// How long one read of the admin API may take, connection and answer included; also how
/// long every failed read takes before its failure is kept and told (whatever the failure).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest wait between two reads while they fail.
pub const MAX_BACKOFF: Duration = Duration::from_secs(120);
/// How often, at most, a backlog that only moves (same replicas, same conditions) is
/// written to `status.backlog`: a status write costs the API server and the operator's
/// one thread; the number is for people, and 30 s is what they see of a HorizontalPodAutoscaler's
/// metrics too (15 s sync, 30 s scrape).
pub const BACKLOG_REFRESH: Duration = Duration::from_secs(30);

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

/// What a read told the controller (by asking for a reconcile), to tell what is new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Told {
    /// When (seconds).
    pub at: i64,
    /// `None`: the backlog was read; else why not (the `ScalingActive` reason).
    pub failure: Option<&'static str>,
    /// The backlog read, if it was.
    pub backlog: Option<u64>,
    /// `ScalingLimited` as the autoscaler would now decide it (after a read).
    pub limit: Option<Limit>,
}

/// Whether a read (`now`) is worth a reconcile, given what the last one that asked for a
/// reconcile told (`last`) and whether the autoscaler would now change the replicas: the
/// first read; another replica count; another `ScalingLimited`; a failure for another
/// reason, or a read working again; a backlog that drained (reached 0) or stopped being
/// drained; a backlog that moved otherwise, once [`BACKLOG_REFRESH`] has passed since.
///
/// Whatever this answers, an object costs at most one reconcile per read, and reads come
/// no more often than the operator's floor.
#[must_use]
pub fn worth_a_reconcile(last: Option<&Told>, now: &Told, replicas_change: bool) -> bool {
    let Some(last) = last else {
        return true;
    };
    let refresh = i64::try_from(BACKLOG_REFRESH.as_secs()).unwrap_or(i64::MAX);
    let drained = |t: &Told| t.backlog == Some(0);
    replicas_change
        || last.failure != now.failure
        || last.limit != now.limit
        || drained(last) != drained(now)
        || (last.backlog != now.backlog && now.at.saturating_sub(last.at) >= refresh)
}

/// Records a successful reading in `history` (the window must see every reading, also
/// those that cause no reconcile) and returns `ScalingLimited` and whether the replicas
/// would change if the autoscaler decided now (a dry run on a copy of the history; the
/// reconcile decides for real). With no decision made yet in this process, a change.
fn dry_run(history: &mut History, policy: &Policy, reading: Reading) -> (Limit, bool) {
    history.record_reading(policy, reading);
    let Some(current) = history.replicas else {
        return (autoscale::recommend(policy, reading.backlog).1, true);
    };
    let decision = autoscale::decide(
        policy,
        &mut history.clone(),
        current,
        Some(reading),
        reading.at,
    );
    (decision.limit, decision.replicas != current)
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
    /// Reads in flight, all objects together.
    reads: Semaphore,
    /// Reads in flight per namespace; an entry lives while a read of its namespace waits
    /// or runs (removed by the last one).
    namespace_reads: Mutex<HashMap<String, Arc<Semaphore>>>,
    /// Slots of [`Self::namespace_reads`] per namespace.
    per_namespace: usize,
    /// [`REQUEST_TIMEOUT`] (shorter in tests).
    timeout: Duration,
}

impl Inner {
    /// One read of `target` for an object of `namespace`, within the caps on reads in
    /// flight and the timeout (which starts once a slot is held).
    ///
    /// A failure, whatever it is, returns when the timeout has passed since the read
    /// started, holding its slots until then: a refused connection, an error status and
    /// a target that never answers take the same time, so neither the moment the status
    /// is written nor when the object's (or its namespace's) next read starts tells them
    /// apart. A success returns at once. A refused connection thus costs its namespace a
    /// slot for as long as a hanging one did already.
    async fn read(
        &self,
        namespace: &str,
        target: &Target,
        partitioned: &mut bool,
    ) -> Result<u64, AdminError> {
        let slots = self.namespace_slots(namespace);
        let result = {
            let _in_namespace = slots.acquire().await;
            let _in_all = self.reads.acquire().await;
            let started = tokio::time::Instant::now();
            let result = tokio::time::timeout(
                self.timeout,
                self.admin.backlog(target, namespace, partitioned),
            )
            .await
            .unwrap_or(Err(AdminError::Timeout(self.timeout.as_secs())));
            if result.is_err() {
                tokio::time::sleep_until(started + self.timeout).await;
            }
            result
        };
        self.release_namespace_slots(namespace, slots);
        result
    }

    fn namespace_slots(&self, namespace: &str) -> Arc<Semaphore> {
        let Ok(mut all) = self.namespace_reads.lock() else {
            return Arc::new(Semaphore::new(self.per_namespace));
        };
        Arc::clone(
            all.entry(namespace.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_namespace))),
        )
    }

    /// Drops the namespace's entry when no other read of it holds one.
    fn release_namespace_slots(&self, namespace: &str, slots: Arc<Semaphore>) {
        if let Ok(mut all) = self.namespace_reads.lock()
            && all
                .get(namespace)
                .is_some_and(|s| Arc::ptr_eq(s, &slots) && Arc::strong_count(s) == 2)
        {
            all.remove(namespace);
        }
    }
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
        Self::new(&Options::default())
    }
}

impl Pollers {
    /// No task yet; reads as `options` allow.
    #[must_use]
    pub fn new(options: &Options) -> Self {
        let (trigger, _) = broadcast::channel(1024);
        Self {
            inner: Arc::new(Inner {
                admin: AdminClient::new(options.targets.clone()),
                trigger,
                tasks: Mutex::new(HashMap::new()),
                consumers: ScopedStores::default(),
                histories: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(0),
                reads: Semaphore::new(options.max_concurrent_polls.max(1)),
                namespace_reads: Mutex::new(HashMap::new()),
                per_namespace: options.max_concurrent_polls_per_namespace(),
                timeout: REQUEST_TIMEOUT,
            }),
        }
    }

    /// Pollers whose reads time out (and whose failures are told) after `timeout`.
    #[cfg(test)]
    fn with_timeout(options: &Options, timeout: Duration) -> Self {
        let mut pollers = Self::new(options);
        if let Some(inner) = Arc::get_mut(&mut pollers.inner) {
            inner.timeout = timeout;
        }
        pollers
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

/// The object with `uid` from the cache, while it is there with autoscaling: its policy.
fn still_wanted(inner: &Inner, key: &ObjectRef<PulsarConsumer>, uid: &str) -> Option<Policy> {
    let ns = key.namespace.as_deref()?;
    let pc = inner.consumers.find(ns, &key.name)?;
    if pc.uid().as_deref() != Some(uid) || pc.metadata.deletion_timestamp.is_some() {
        return None;
    }
    pc.spec.autoscaling.as_ref().map(Policy::from_spec)
}

/// The task: read, keep, tell the controller when it matters, wait; until the object is
/// gone or no one listens.
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
    let mut told: Option<Told> = None;
    let object = key.to_string();
    let namespace = key.namespace.clone().unwrap_or_default();
    loop {
        let Some(policy) = still_wanted(&inner, &key, &uid) else {
            tracing::debug!(%object, "autoscaling ended; backlog poller stops");
            if let Ok(mut h) = inner.histories.lock() {
                h.remove(&uid);
            }
            break;
        };
        if inner.trigger.receiver_count() == 0 {
            tracing::debug!(%object, "no controller listens; backlog poller stops");
            break;
        }
        let result = inner
            .read(&namespace, &settings.target, &mut partitioned)
            .await;
        // Which failure it was, for the operator's log only (the status and events say the
        // same for all); the details are fixed words and codes, no text of the answer.
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
                let (kind, detail) = (error.kind(), error.detail());
                if failures == 1 {
                    tracing::warn!(%object, kind, %detail, "cannot read the backlog");
                } else {
                    tracing::debug!(%object, kind, %detail, failures, "cannot read the backlog");
                }
            }
        }
        let at = jiff::Timestamp::now().as_second();
        let (limit, replicas_change) = match &result {
            Ok(backlog) => {
                let reading = Reading {
                    at,
                    backlog: *backlog,
                };
                inner
                    .histories
                    .lock()
                    .ok()
                    .map(|mut h| dry_run(h.entry(uid.clone()).or_default(), &policy, reading))
                    .map_or((None, true), |(limit, change)| (Some(limit), change))
            }
            Err(_) => (None, false),
        };
        let now = Told {
            at,
            failure: result.as_ref().err().map(AdminError::reason),
            backlog: result.as_ref().ok().copied(),
            limit,
        };
        if let Ok(mut l) = latest.lock() {
            *l = Some(Observation { at, result });
        }
        if worth_a_reconcile(told.as_ref(), &now, replicas_change) {
            told = Some(now);
            if inner.trigger.send(key.clone()).is_err() {
                tracing::debug!(%object, "no controller listens; backlog poller stops");
                break;
            }
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

    fn told(
        at: i64,
        failure: Option<&'static str>,
        backlog: Option<u64>,
        limit: Option<Limit>,
    ) -> Told {
        Told {
            at,
            failure,
            backlog,
            limit,
        }
    }

    #[test]
    fn only_what_matters_is_worth_a_reconcile() {
        let ok = |at, backlog| told(at, None, Some(backlog), Some(Limit::WithinRange));
        let last = ok(100, 500);
        assert!(worth_a_reconcile(None, &last, false), "the first read");
        assert!(!worth_a_reconcile(Some(&last), &ok(105, 500), false));
        // The backlog only moves: at most every 30 s.
        assert!(!worth_a_reconcile(Some(&last), &ok(105, 450), false));
        assert!(!worth_a_reconcile(Some(&last), &ok(129, 450), false));
        assert!(worth_a_reconcile(Some(&last), &ok(130, 450), false));
        assert!(
            !worth_a_reconcile(Some(&last), &ok(200, 500), false),
            "same backlog"
        );
        // Drained, and no longer: at once.
        assert!(worth_a_reconcile(Some(&last), &ok(105, 0), false));
        assert!(worth_a_reconcile(Some(&ok(100, 0)), &ok(105, 1), false));
        assert!(!worth_a_reconcile(Some(&ok(100, 0)), &ok(105, 0), false));
        // The replicas would change, or ScalingLimited: at once.
        assert!(worth_a_reconcile(Some(&last), &ok(105, 450), true));
        let limited = told(105, None, Some(500), Some(Limit::TooMany));
        assert!(worth_a_reconcile(Some(&last), &limited, false));
        // A failure, another failure, the same failure again, working again.
        let down = told(105, Some("AdminAPIUnavailable"), None, None);
        assert!(worth_a_reconcile(Some(&last), &down, false));
        assert!(!worth_a_reconcile(
            Some(&down),
            &told(300, Some("AdminAPIUnavailable"), None, None),
            false
        ));
        assert!(worth_a_reconcile(
            Some(&down),
            &told(110, Some("AdminTargetNotAllowed"), None, None),
            false
        ));
        assert!(worth_a_reconcile(Some(&down), &ok(110, 500), false));
    }

    #[test]
    fn the_dry_run_tells_a_scale_from_a_moving_backlog() {
        let policy = Policy {
            min: 0,
            max: 5,
            target: 100,
            window: 60,
            up: None,
            down: None,
        };
        let mut h = History::default();
        let at = |at, backlog| Reading { at, backlog };
        // What the reconcile does when it is asked to.
        let reconcile = |h: &mut History, r: Reading| {
            let current = h.replicas.unwrap_or(1);
            let d = autoscale::decide(&policy, h, current, Some(r), r.at);
            h.replicas = Some(d.replicas);
        };
        // Nothing decided yet in this process: the reconcile must decide.
        assert_eq!(
            dry_run(&mut h, &policy, at(0, 300)),
            (Limit::WithinRange, true)
        );
        reconcile(&mut h, at(0, 300));
        assert_eq!(h.replicas, Some(3));
        assert_eq!(
            dry_run(&mut h, &policy, at(5, 250)),
            (Limit::WithinRange, false)
        );
        // Lower, within the window: held, no change.
        assert_eq!(
            dry_run(&mut h, &policy, at(10, 100)),
            (Limit::WithinRange, false)
        );
        // Higher: a change at once; beyond the maximum: limited.
        assert_eq!(
            dry_run(&mut h, &policy, at(15, 350)),
            (Limit::WithinRange, true)
        );
        assert_eq!(
            dry_run(&mut h, &policy, at(20, 900)),
            (Limit::TooMany, true)
        );
        // The dry runs decided nothing for real.
        assert_eq!(h.replicas, Some(3));
        reconcile(&mut h, at(20, 900));
        assert_eq!(h.replicas, Some(5));
        // Every reading is in the window, also one that caused no reconcile: 480 (5 wanted)
        // at t=30 holds the 5 consumers until t=90.
        assert_eq!(
            dry_run(&mut h, &policy, at(30, 480)),
            (Limit::WithinRange, false)
        );
        assert_eq!(
            dry_run(&mut h, &policy, at(85, 0)),
            (Limit::WithinRange, false)
        );
        assert_eq!(
            dry_run(&mut h, &policy, at(90, 0)),
            (Limit::WithinRange, true)
        );
    }

    /// A listener that accepts connections and never answers; counts them.
    async fn silent_listener() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let url = format!(
            "http://{}",
            listener.local_addr().unwrap_or_else(|e| panic!("{e}"))
        );
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = Arc::clone(&count);
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                seen.fetch_add(1, Ordering::SeqCst);
                held.push(conn);
            }
        });
        (url, count)
    }

    #[tokio::test]
    async fn reads_in_flight_are_capped_overall_and_per_namespace() {
        let options = Options {
            targets: crate::target::TargetPolicy::new(
                vec!["127.0.0.0/8".parse().unwrap_or_else(|e| panic!("{e}"))],
                None,
            ),
            ..Options::default()
        };
        assert_eq!(
            (
                options.max_concurrent_polls,
                options.max_concurrent_polls_per_namespace()
            ),
            (8, 2)
        );
        let pollers = Pollers::new(&options);
        let mut listeners = Vec::new();
        let mut reads = Vec::new();
        // Six namespaces, five hanging reads each.
        for ns in 0..6 {
            let (url, count) = silent_listener().await;
            listeners.push(count);
            for _ in 0..5 {
                let inner = Arc::clone(&pollers.inner);
                let target = Target {
                    admin_url: url.clone(),
                    topic: crate::admin::parse_topic("t").unwrap_or_else(|| panic!()),
                    subscription: "s".into(),
                };
                reads.push(tokio::spawn(async move {
                    let mut partitioned = false;
                    inner
                        .read(&format!("ns-{ns}"), &target, &mut partitioned)
                        .await
                }));
            }
        }
        let total = || {
            listeners
                .iter()
                .map(|c| c.load(Ordering::SeqCst))
                .sum::<usize>()
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while total() < 8 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} connections",
                total()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A moment more: nothing beyond the caps.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(total(), 8);
        assert!(listeners.iter().all(|c| c.load(Ordering::SeqCst) <= 2));
        for r in reads {
            r.abort();
        }
    }

    /// How a fake admin API treats a connection.
    #[derive(Debug, Clone, Copy)]
    enum Mode {
        /// Accepts and never answers.
        Silent,
        /// Answers like an SSH server, then closes.
        NotHttp,
        /// Answers a head and half the body it announces, then closes.
        CutShort,
        /// Answers `code` with `body` (and `Content-Length`).
        Answer(u16, &'static str),
        /// Announces a 2 MiB body.
        Huge,
    }

    /// A fake admin API on 127.0.0.1 behaving as `mode` on every connection; its URL.
    async fn fake(mode: Mode) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let url = format!(
            "http://{}",
            listener.local_addr().unwrap_or_else(|e| panic!("{e}"))
        );
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut conn, _)) = listener.accept().await {
                if matches!(mode, Mode::Silent) {
                    held.push(conn);
                    continue;
                }
                tokio::spawn(async move {
                    let mut head = [0u8; 4096];
                    let _ = conn.read(&mut head).await;
                    let answer = match mode {
                        Mode::Silent => return,
                        Mode::NotHttp => "SSH-2.0-OpenSSH_9.6\r\n".to_owned(),
                        Mode::CutShort => {
                            "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"subscr".to_owned()
                        }
                        Mode::Answer(code, body) => format!(
                            "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        ),
                        Mode::Huge => {
                            "HTTP/1.1 200 OK\r\nContent-Length: 2097152\r\n\r\n{".to_owned()
                        }
                    };
                    let _ = conn.write_all(answer.as_bytes()).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        url
    }

    /// Every way a read fails gives the same reason, the same message and the same status,
    /// at the same time after the read started (the timeout); which failure it was is
    /// only in the error's detail (the log).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_failure_is_told_alike_and_after_the_same_time() {
        let timeout = Duration::from_millis(600);
        let options = Options {
            targets: crate::target::TargetPolicy::new(
                vec!["127.0.0.0/8".parse().unwrap_or_else(|e| panic!("{e}"))],
                None,
            ),
            max_concurrent_polls: 64,
            ..Options::default()
        };
        let pollers = Pollers::with_timeout(&options, timeout);
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
            format!(
                "http://{}",
                l.local_addr().unwrap_or_else(|e| panic!("{e}"))
            )
        };
        let stats_without_sub = r#"{"subscriptions": {"other": {"msgBacklog": 1}}}"#;
        let mut cases = vec![
            ("connection refused", closed, "unreachable"),
            ("no answer", fake(Mode::Silent).await, "timeout"),
            ("not HTTP", fake(Mode::NotHttp).await, "broken"),
            ("cut short", fake(Mode::CutShort).await, "broken"),
            ("503", fake(Mode::Answer(503, "down")).await, "server_error"),
            (
                "401",
                fake(Mode::Answer(401, "no")).await,
                "unexpected_status",
            ),
            (
                "302",
                fake(Mode::Answer(302, "")).await,
                "unexpected_status",
            ),
            (
                "404",
                fake(Mode::Answer(404, "{}")).await,
                "topic_not_found",
            ),
            (
                "not JSON",
                fake(Mode::Answer(200, "<html>")).await,
                "not_stats",
            ),
            (
                "no subscription",
                fake(Mode::Answer(200, stats_without_sub)).await,
                "subscription_not_found",
            ),
            ("too large", fake(Mode::Huge).await, "too_large"),
        ];
        // TLS spoken to a plain HTTP server.
        let plain = fake(Mode::Answer(200, stats_without_sub)).await;
        cases.push((
            "TLS error",
            plain.replace("http://", "https://"),
            "unreachable",
        ));
        let reads = cases.into_iter().enumerate().map(|(i, (what, url, kind))| {
            let inner = Arc::clone(&pollers.inner);
            async move {
                let target = Target {
                    admin_url: url,
                    topic: crate::admin::parse_topic("t").unwrap_or_else(|| panic!()),
                    subscription: "s".into(),
                };
                let mut partitioned = false;
                let started = tokio::time::Instant::now();
                // A namespace each: no read waits for another's slot.
                let result = inner
                    .read(&format!("ns-{i}"), &target, &mut partitioned)
                    .await;
                (what, kind, result, started.elapsed())
            }
        });
        let results = futures::future::join_all(reads).await;
        let policy = Policy {
            min: 0,
            max: 3,
            target: 10,
            window: 60,
            up: None,
            down: None,
        };
        let status_of = |error: &AdminError| {
            // What the reconcile makes of a failed reading.
            let scaling = crate::status::Scaling {
                reading: Some(Err((error.reason(), error.to_string()))),
                decision: autoscale::decide(&policy, &mut History::default(), 2, None, 100),
                policy: policy.clone(),
            };
            let now = jiff::Timestamp::from_second(100).unwrap_or_else(|e| panic!("{e}"));
            crate::status::with_scaling(
                crate::PulsarConsumerStatus::default(),
                None,
                Some(&scaling),
                Some(1),
                now,
            )
        };
        let mut statuses = Vec::new();
        for (what, kind, result, took) in results {
            let Err(error) = result else {
                panic!("{what}: read {result:?}");
            };
            assert_eq!(error.kind(), kind, "{what}: {error:?}");
            assert_eq!(
                error.reason(),
                crate::admin::REASON_UNAVAILABLE,
                "{what}: {error:?}"
            );
            assert_eq!(
                error.to_string(),
                crate::admin::UNAVAILABLE_MESSAGE,
                "{what}: {error:?}"
            );
            assert!(
                took >= timeout,
                "{what}: told after {took:?}, before {timeout:?}"
            );
            assert!(
                took < timeout + Duration::from_millis(900),
                "{what}: told only after {took:?}"
            );
            statuses.push((what, status_of(&error)));
        }
        let (first, reference) = &statuses[0];
        for (what, status) in &statuses[1..] {
            assert_eq!(status, reference, "{what} reads unlike {first}");
        }
        let active = reference
            .conditions
            .iter()
            .find(|c| c.type_ == crate::status::SCALING_ACTIVE)
            .unwrap_or_else(|| panic!("no ScalingActive"));
        assert_eq!(
            (active.status.as_str(), active.reason.as_str()),
            ("False", crate::admin::REASON_UNAVAILABLE)
        );

        // A refused target has its own reason (it depends on the spec alone) and is told
        // after the same time too; a good read is told at once.
        let refused = Target {
            admin_url: "http://169.254.169.254:80".into(),
            topic: crate::admin::parse_topic("t").unwrap_or_else(|| panic!()),
            subscription: "s".into(),
        };
        let started = tokio::time::Instant::now();
        let result = pollers.inner.read("ns-x", &refused, &mut false).await;
        assert_eq!(result, Err(AdminError::NotAllowed));
        assert!(started.elapsed() >= timeout);
        let good = Target {
            admin_url: fake(Mode::Answer(
                200,
                r#"{"subscriptions": {"s": {"msgBacklog": 7}}}"#,
            ))
            .await,
            topic: crate::admin::parse_topic("t").unwrap_or_else(|| panic!()),
            subscription: "s".into(),
        };
        let started = tokio::time::Instant::now();
        assert_eq!(pollers.inner.read("ns-y", &good, &mut false).await, Ok(7));
        assert!(started.elapsed() < timeout, "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn namespace_slots_are_forgotten_after_use() {
        let pollers = Pollers::with_timeout(&Options::default(), Duration::from_millis(100));
        let target = Target {
            admin_url: "http://127.0.0.1:9".into(),
            topic: crate::admin::parse_topic("t").unwrap_or_else(|| panic!()),
            subscription: "s".into(),
        };
        let mut partitioned = false;
        let result = pollers.inner.read("ns", &target, &mut partitioned).await;
        assert_eq!(result, Err(AdminError::NotAllowed), "loopback, by default");
        assert!(
            pollers
                .inner
                .namespace_reads
                .lock()
                .map(|m| m.is_empty())
                .unwrap_or(false)
        );
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
        let pollers = Pollers::default();
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
        let pollers = Pollers::default();
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
