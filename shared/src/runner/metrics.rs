//! Prometheus metrics under the names and types controller-runtime uses, so dashboards
//! and alerts written for kubebuilder operators keep working:
//!
//! - the controller's own (`controller_runtime_*`, from controller-runtime's
//!   `pkg/internal/controller/metrics/metrics.go`, same reconcile-time buckets);
//! - the work queue's (`workqueue_*{name,controller}`, `pkg/metrics/workqueue.go`);
//! - the API client's `rest_client_requests_total{code,method,host}`
//!   (`pkg/metrics/client_go_adapter.go`), counted by a layer on the kube client
//!   (see the client module), every attempt of a retried request included;
//! - `leader_election_master_status{name}` (`pkg/metrics/leaderelection.go`);
//! - the process collector's `process_*` (client_golang), read from `/proc` at each scrape;
//! - our own, with no controller-runtime counterpart: `operator_objects{controller,ready}`
//!   and `operator_objects_not_ready_seconds_max{controller}` (the primary objects Ready
//!   for their generation or not, read from the controller's caches at each scrape).
//!
//! kube-runtime's controller has no client-go work queue: its scheduler (debounce, one
//! reconcile per object at a time, backoff) keeps its queue to itself. The `workqueue_*`
//! series are therefore measured where the runner sees them, as documented on
//! [`Metrics::queued`] and [`Queued::start`]:
//!
//! - `adds_total`: reconciles dispatched by the scheduler. client-go counts an add only
//!   when the key is not queued yet, and every add is processed exactly once, so this
//!   matches except for the moment (counted when dispatched, not when triggered).
//! - `depth` and `queue_duration_seconds`: dispatched reconciles waiting until every
//!   cache has synced (non-zero only at startup). Time spent in kube-runtime's scheduler
//!   (debounce, waiting for a free worker or for the same object's reconcile to end) is
//!   not visible and not counted.
//! - `work_duration_seconds`, `unfinished_work_seconds`,
//!   `longest_running_processor_seconds`: exact (reconciles in flight, read at scrape).
//! - `retries_total`: failed reconciles, each of which is requeued with backoff (what
//!   client-go's `AddRateLimited` counts; `RequeueAfter` is not a retry there either).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
    time::Instant,
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{
        MetricType,
        counter::Counter,
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::Histogram,
    },
    registry::Registry,
};

mod object_gauges;
mod objects_ready;
mod rest_client;
pub use object_gauges::{GaugeFamily, ObjectGauges};
pub(crate) use objects_ready::ReadyGauges;
pub(crate) use rest_client::RestClientMetrics;

type Labels = Vec<(&'static str, String)>;

/// controller-runtime's reconcile-time buckets (seconds), from its
/// `pkg/internal/controller/metrics/metrics.go`.
pub(super) const RECONCILE_TIME_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];

fn reconcile_time_histogram() -> Histogram {
    Histogram::new(RECONCILE_TIME_BUCKETS)
}

/// The work queue's buckets: `prometheus.ExponentialBuckets(10e-9, 10, 12)` (10 ns to
/// 1,000 s), as in controller-runtime's `pkg/metrics/workqueue.go`.
fn workqueue_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        10e-9, 10.0, 12,
    ))
}

/// How a reconcile ended, as the `result` label of `controller_runtime_reconcile_total`.
///
/// controller-runtime's `requeue` (an immediate, rate-limited requeue without an error)
/// has no counterpart: kube-runtime's `Action` always names a delay, so it is
/// `requeue_after`, and the label value `requeue` is not exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReconcileResult {
    /// Done; wait for the next change.
    Success,
    /// Failed; retried with backoff.
    Error,
    /// Asked to be run again after a delay.
    RequeueAfter,
}

impl ReconcileResult {
    const ALL: [ReconcileResult; 3] = [
        ReconcileResult::Success,
        ReconcileResult::Error,
        ReconcileResult::RequeueAfter,
    ];

    fn label(self) -> &'static str {
        match self {
            ReconcileResult::Success => "success",
            ReconcileResult::Error => "error",
            ReconcileResult::RequeueAfter => "requeue_after",
        }
    }
}

/// Reconciles in flight: their controller and start, for the work queue's
/// unfinished-work and longest-running gauges (computed at each scrape).
#[derive(Debug, Default)]
struct InFlight {
    next_id: AtomicU64,
    running: Mutex<HashMap<u64, (String, Instant)>>,
    /// Controllers started, so their gauges are exported (as 0) before any reconcile.
    controllers: Mutex<Vec<String>>,
}

impl InFlight {
    fn lock_running(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (String, Instant)>> {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn begin(&self, controller: &str) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock_running()
            .insert(id, (controller.to_owned(), Instant::now()));
        id
    }

    fn end(&self, id: u64) {
        self.lock_running().remove(&id);
    }

    /// Per controller: (sum of seconds running, longest seconds running).
    fn summary(&self, now: Instant) -> Vec<(String, f64, f64)> {
        let mut out: Vec<(String, f64, f64)> = self
            .controllers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|c| (c.clone(), 0.0, 0.0))
            .collect();
        for (controller, started) in self.lock_running().values() {
            let secs = now.saturating_duration_since(*started).as_secs_f64();
            match out.iter_mut().find(|(c, _, _)| c == controller) {
                Some(entry) => {
                    entry.1 += secs;
                    entry.2 = entry.2.max(secs);
                }
                None => out.push((controller.clone(), secs, secs)),
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

impl Collector for InFlight {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let summary = self.summary(Instant::now());
        for (name, help, pick) in [
            (
                "workqueue_unfinished_work_seconds",
                "How many seconds of work has been done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.",
                0,
            ),
            (
                "workqueue_longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running.",
                1,
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (controller, total, longest) in &summary {
                let labels = [
                    ("name", controller.as_str()),
                    ("controller", controller.as_str()),
                ];
                let value = if pick == 0 { *total } else { *longest };
                ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// All metrics of one operator process.
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    registry: Arc<Registry>,
    reconcile_total: Family<Labels, Counter>,
    reconcile_errors_total: Family<Labels, Counter>,
    terminal_reconcile_errors_total: Family<Labels, Counter>,
    reconcile_panics_total: Family<Labels, Counter>,
    reconcile_time_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    max_concurrent_reconciles: Family<Labels, Gauge>,
    active_workers: Family<Labels, Gauge<i64, AtomicI64>>,
    leader_master_status: Family<Labels, Gauge<i64, AtomicI64>>,
    workqueue_depth: Family<Labels, Gauge<i64, AtomicI64>>,
    workqueue_adds_total: Family<Labels, Counter>,
    workqueue_queue_duration_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    workqueue_work_duration_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    workqueue_retries_total: Family<Labels, Counter>,
    rest_client_requests_total: Family<Labels, Counter>,
    in_flight: Arc<InFlight>,
    object_gauges: object_gauges::Sources,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn controller_labels(controller: &str) -> Labels {
    vec![("controller", controller.to_owned())]
}

fn queue_labels(controller: &str) -> Labels {
    vec![
        ("name", controller.to_owned()),
        ("controller", controller.to_owned()),
    ]
}

impl Metrics {
    /// Creates and registers every metric.
    #[must_use]
    pub(crate) fn new() -> Self {
        let mut registry = Registry::default();
        // prometheus-client appends `_total` to counters' samples.
        let reconcile_total = Family::<Labels, Counter>::default();
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            reconcile_total.clone(),
        );
        let reconcile_errors_total = Family::<Labels, Counter>::default();
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            reconcile_errors_total.clone(),
        );
        let terminal_reconcile_errors_total = Family::<Labels, Counter>::default();
        registry.register(
            "controller_runtime_terminal_reconcile_errors",
            "Total number of terminal reconciliation errors per controller",
            terminal_reconcile_errors_total.clone(),
        );
        let reconcile_panics_total = Family::<Labels, Counter>::default();
        registry.register(
            "controller_runtime_reconcile_panics",
            "Total number of reconciliation panics per controller",
            reconcile_panics_total.clone(),
        );
        let reconcile_time_seconds =
            Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(
                reconcile_time_histogram,
            );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            reconcile_time_seconds.clone(),
        );
        let max_concurrent_reconciles = Family::<Labels, Gauge>::default();
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            max_concurrent_reconciles.clone(),
        );
        let active_workers = Family::<Labels, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            active_workers.clone(),
        );
        let leader_master_status = Family::<Labels, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
            leader_master_status.clone(),
        );
        let workqueue_depth = Family::<Labels, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "workqueue_depth",
            "Current depth of workqueue",
            workqueue_depth.clone(),
        );
        let workqueue_adds_total = Family::<Labels, Counter>::default();
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            workqueue_adds_total.clone(),
        );
        let workqueue_queue_duration_seconds =
            Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(
                workqueue_histogram,
            );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            workqueue_queue_duration_seconds.clone(),
        );
        let workqueue_work_duration_seconds =
            Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(
                workqueue_histogram,
            );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            workqueue_work_duration_seconds.clone(),
        );
        let workqueue_retries_total = Family::<Labels, Counter>::default();
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            workqueue_retries_total.clone(),
        );
        let rest_client_requests_total = Family::<Labels, Counter>::default();
        registry.register(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            rest_client_requests_total.clone(),
        );
        let in_flight = Arc::new(InFlight::default());
        registry.register_collector(Box::new(in_flight.clone()));
        registry.register_collector(Box::new(
            crate::runner::process_metrics::ProcessCollector::new(),
        ));
        let object_gauges = object_gauges::Sources::default();
        registry.register_collector(Box::new(object_gauges.clone()));
        Self {
            registry: Arc::new(registry),
            reconcile_total,
            reconcile_errors_total,
            terminal_reconcile_errors_total,
            reconcile_panics_total,
            reconcile_time_seconds,
            max_concurrent_reconciles,
            active_workers,
            leader_master_status,
            workqueue_depth,
            workqueue_adds_total,
            workqueue_queue_duration_seconds,
            workqueue_work_duration_seconds,
            workqueue_retries_total,
            rest_client_requests_total,
            in_flight,
            object_gauges,
        }
    }

    /// Adds gauges the operator computes at each scrape from what it caches (one series
    /// per object; see [`ObjectGauges`]).
    pub(crate) fn add_object_gauges(&self, source: Arc<dyn ObjectGauges>) {
        self.object_gauges.add(source);
    }

    /// Records a finished reconcile of `controller`: its result and time, the work queue's
    /// work duration, and a retry when it failed (it is requeued with backoff).
    pub(crate) fn reconciled(&self, controller: &str, result: ReconcileResult, seconds: f64) {
        let c = controller_labels(controller);
        let mut with_result = c.clone();
        with_result.push(("result", result.label().to_owned()));
        self.reconcile_total.get_or_create(&with_result).inc();
        if result == ReconcileResult::Error {
            self.reconcile_errors_total.get_or_create(&c).inc();
            self.workqueue_retries_total
                .get_or_create(&queue_labels(controller))
                .inc();
        }
        self.reconcile_time_seconds
            .get_or_create(&c)
            .observe(seconds);
        self.workqueue_work_duration_seconds
            .get_or_create(&queue_labels(controller))
            .observe(seconds);
    }

    /// Counts a reconcile that panicked (`controller_runtime_reconcile_panics_total`).
    pub(crate) fn reconcile_panicked(&self, controller: &str) {
        self.reconcile_panics_total
            .get_or_create(&controller_labels(controller))
            .inc();
    }

    /// Sets `controller_runtime_max_concurrent_reconciles` and zeroes the counters so they
    /// are exported before the first reconcile.
    pub(crate) fn controller_started(&self, controller: &str, max_concurrent: u16) {
        let c = controller_labels(controller);
        let q = queue_labels(controller);
        self.max_concurrent_reconciles
            .get_or_create(&c)
            .set(i64::from(max_concurrent));
        let _ = self.active_workers.get_or_create(&c);
        let _ = self.reconcile_errors_total.get_or_create(&c);
        let _ = self.terminal_reconcile_errors_total.get_or_create(&c);
        let _ = self.reconcile_panics_total.get_or_create(&c);
        let _ = self.reconcile_time_seconds.get_or_create(&c);
        for r in ReconcileResult::ALL {
            let mut l = c.clone();
            l.push(("result", r.label().to_owned()));
            let _ = self.reconcile_total.get_or_create(&l);
        }
        let _ = self.workqueue_depth.get_or_create(&q);
        let _ = self.workqueue_adds_total.get_or_create(&q);
        let _ = self.workqueue_queue_duration_seconds.get_or_create(&q);
        let _ = self.workqueue_work_duration_seconds.get_or_create(&q);
        let _ = self.workqueue_retries_total.get_or_create(&q);
        let mut controllers = self
            .in_flight
            .controllers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !controllers.iter().any(|c| c == controller) {
            controllers.push(controller.to_owned());
        }
    }

    /// A reconcile of `controller` was dispatched: counts a work-queue add and holds it in
    /// `workqueue_depth` until [`Queued::start`] (see the module docs for what this
    /// measures and what it cannot).
    #[must_use]
    pub(crate) fn queued(&self, controller: &'static str) -> Queued {
        let labels = queue_labels(controller);
        self.workqueue_adds_total.get_or_create(&labels).inc();
        let depth = self.workqueue_depth.get_or_create(&labels).clone();
        depth.inc();
        Queued {
            controller,
            since: Instant::now(),
            depth: Some(depth),
        }
    }

    /// Sets `leader_election_master_status{name}`.
    pub(crate) fn set_leader(&self, lease_name: &str, leader: bool) {
        self.leader_master_status
            .get_or_create(&vec![("name", lease_name.to_owned())])
            .set(i64::from(leader));
    }

    /// The layer that counts each request of a kube client to the API server at `host`
    /// in `rest_client_requests_total{code,method,host}` (the kube client stacks it).
    pub(crate) fn rest_client_layer(&self, host: Arc<str>) -> RestClientMetrics {
        RestClientMetrics {
            requests: self.rest_client_requests_total.clone(),
            host,
        }
    }

    /// The registry in OpenMetrics text format.
    #[must_use]
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// A dispatched reconcile not yet running (see [`Metrics::queued`]). Every object
/// waiting for a slot holds one, so it is kept small (40 bytes): the metrics it ends in
/// are passed to [`Queued::start`] rather than held.
#[derive(Debug)]
pub(crate) struct Queued {
    controller: &'static str,
    since: Instant,
    depth: Option<Gauge<i64, AtomicI64>>,
}

impl Queued {
    /// The reconcile starts: leaves `workqueue_depth`, observes its wait in
    /// `workqueue_queue_duration_seconds`, and counts a busy worker (and its running time
    /// for the unfinished-work gauges) until the guard is dropped.
    #[must_use]
    pub(crate) fn start(mut self, m: &Metrics) -> WorkerGuard {
        if let Some(depth) = self.depth.take() {
            depth.dec();
        }
        m.workqueue_queue_duration_seconds
            .get_or_create(&queue_labels(self.controller))
            .observe(self.since.elapsed().as_secs_f64());
        let active = m
            .active_workers
            .get_or_create(&controller_labels(self.controller))
            .clone();
        active.inc();
        let id = m.in_flight.begin(self.controller);
        WorkerGuard {
            active,
            in_flight: m.in_flight.clone(),
            id,
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        // Cancelled before it started (shutdown).
        if let Some(depth) = self.depth.take() {
            depth.dec();
        }
    }
}

/// Decrements `controller_runtime_active_workers` and ends the reconcile's running time
/// when dropped (also when a reconcile is cancelled).
#[derive(Debug)]
pub(crate) struct WorkerGuard {
    active: Gauge<i64, AtomicI64>,
    in_flight: Arc<InFlight>,
    id: u64,
}

impl Drop for WorkerGuard {
    fn drop(&mut self) {
        self.active.dec();
        self.in_flight.end(self.id);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::collections::BTreeMap;

    /// `name -> type` from the `# TYPE` lines, with counters under their Prometheus
    /// sample name (`..._total`: OpenMetrics names the family without the suffix).
    fn families(text: &str) -> BTreeMap<String, String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_once(' '))
            .map(|(name, kind)| {
                let name = if kind == "counter" && !name.ends_with("_total") {
                    format!("{name}_total")
                } else {
                    name.to_owned()
                };
                (name, kind.to_owned())
            })
            .collect()
    }

    /// The runner's `operator_objects*` source of a controller with no object.
    #[derive(Debug)]
    struct ObjectsOf(&'static str);

    impl ObjectGauges for ObjectsOf {
        fn families(&self) -> Vec<GaugeFamily> {
            objects_ready::tests::families_of_none(self.0)
        }
    }

    #[test]
    fn names_and_types_match_controller_runtime() {
        // Taken from controller-runtime's sources: pkg/internal/controller/metrics/metrics.go
        // (controller_runtime_*), pkg/metrics/workqueue.go (workqueue_*),
        // pkg/metrics/client_go_adapter.go (rest_client_requests_total),
        // pkg/metrics/leaderelection.go (leader_election_master_status), and the
        // process collector it registers (client_golang prometheus/process_collector.go).
        let expected = [
            ("controller_runtime_reconcile_total", "counter"),
            ("controller_runtime_reconcile_errors_total", "counter"),
            (
                "controller_runtime_terminal_reconcile_errors_total",
                "counter",
            ),
            ("controller_runtime_reconcile_panics_total", "counter"),
            ("controller_runtime_reconcile_time_seconds", "histogram"),
            ("controller_runtime_max_concurrent_reconciles", "gauge"),
            ("controller_runtime_active_workers", "gauge"),
            ("workqueue_depth", "gauge"),
            ("workqueue_adds_total", "counter"),
            ("workqueue_queue_duration_seconds", "histogram"),
            ("workqueue_work_duration_seconds", "histogram"),
            ("workqueue_unfinished_work_seconds", "gauge"),
            ("workqueue_longest_running_processor_seconds", "gauge"),
            ("workqueue_retries_total", "counter"),
            ("rest_client_requests_total", "counter"),
            ("leader_election_master_status", "gauge"),
            ("process_cpu_seconds_total", "counter"),
            ("process_open_fds", "gauge"),
            ("process_max_fds", "gauge"),
            ("process_virtual_memory_bytes", "gauge"),
            ("process_resident_memory_bytes", "gauge"),
            ("process_start_time_seconds", "gauge"),
            // Our own (no controller-runtime counterpart), registered by the runner for
            // every controller.
            (objects_ready::OBJECTS, "gauge"),
            (objects_ready::NOT_READY_SECONDS_MAX, "gauge"),
        ];
        let m = Metrics::new();
        m.add_object_gauges(Arc::new(ObjectsOf("podset")));
        m.controller_started("podset", 2);
        m.set_leader("podset-operator-leader", true);
        m.rest_client_requests_total
            .get_or_create(&vec![
                ("code", "200".to_owned()),
                ("method", "GET".to_owned()),
                ("host", "10.0.0.1:443".to_owned()),
            ])
            .inc();
        let text = m.encode();
        let found = families(&text);
        for (name, kind) in expected {
            assert_eq!(
                found.get(name).map(String::as_str),
                Some(kind),
                "{name} ({kind}) in\n{text}"
            );
        }
        // controller-runtime's reconcile-time buckets, 5 ms to 60 s.
        for le in ["0.005", "0.35", "1.25", "60.0"] {
            let bucket = format!(
                "controller_runtime_reconcile_time_seconds_bucket{{le=\"{le}\",controller=\"podset\"}} 0"
            );
            assert!(text.contains(&bucket), "missing {bucket} in\n{text}");
        }
        // The work queue's: 10 ns to 1,000 s.
        for le in ["1e-8", "0.001", "1000.0"] {
            let bucket = format!(
                "workqueue_work_duration_seconds_bucket{{le=\"{le}\",name=\"podset\",controller=\"podset\"}} 0"
            );
            assert!(text.contains(&bucket), "missing {bucket} in\n{text}");
        }
        assert!(
            !text.contains("result=\"requeue\""),
            "requeue is never produced"
        );
    }

    #[test]
    fn exposes_controller_runtime_names() {
        let m = Metrics::new();
        m.controller_started("podset", 2);
        m.reconciled("podset", ReconcileResult::Success, 0.01);
        m.reconciled("podset", ReconcileResult::Error, 0.02);
        m.set_leader("podset-operator-leader", true);
        let text = m.encode();
        for needle in [
            r#"controller_runtime_reconcile_total{controller="podset",result="success"} 1"#,
            r#"controller_runtime_reconcile_total{controller="podset",result="error"} 1"#,
            r#"controller_runtime_reconcile_errors_total{controller="podset"} 1"#,
            r#"controller_runtime_terminal_reconcile_errors_total{controller="podset"} 0"#,
            r#"controller_runtime_reconcile_panics_total{controller="podset"} 0"#,
            r#"controller_runtime_reconcile_time_seconds_count{controller="podset"} 2"#,
            r#"controller_runtime_max_concurrent_reconciles{controller="podset"} 2"#,
            r#"controller_runtime_active_workers{controller="podset"} 0"#,
            r#"leader_election_master_status{name="podset-operator-leader"} 1"#,
            r#"workqueue_retries_total{name="podset",controller="podset"} 1"#,
            r#"workqueue_work_duration_seconds_count{name="podset",controller="podset"} 2"#,
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }

    #[test]
    fn work_queue_follows_a_reconcile_from_dispatch_to_end() {
        let m = Metrics::new();
        m.controller_started("c", 1);
        let queued = m.queued("c");
        let text = m.encode();
        assert!(
            text.contains(r#"workqueue_depth{name="c",controller="c"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"workqueue_adds_total{name="c",controller="c"} 1"#),
            "{text}"
        );
        let worker = queued.start(&m);
        let text = m.encode();
        assert!(
            text.contains(r#"workqueue_depth{name="c",controller="c"} 0"#),
            "{text}"
        );
        assert!(text.contains(r#"controller_runtime_active_workers{controller="c"} 1"#));
        assert!(
            text.contains(r#"workqueue_queue_duration_seconds_count{name="c",controller="c"} 1"#)
        );
        // Running now: the unfinished-work gauges move while it runs.
        let running = m
            .in_flight
            .summary(Instant::now() + std::time::Duration::from_secs(3));
        assert_eq!(running.len(), 1);
        assert!(running[0].1 >= 3.0 && running[0].2 >= 3.0, "{running:?}");
        drop(worker);
        let text = m.encode();
        assert!(text.contains(r#"controller_runtime_active_workers{controller="c"} 0"#));
        assert!(
            text.contains(r#"workqueue_unfinished_work_seconds{name="c",controller="c"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"workqueue_longest_running_processor_seconds{name="c",controller="c"} 0"#
            ),
            "{text}"
        );
        // A reconcile cancelled before it started leaves the queue too.
        drop(m.queued("c"));
        assert!(
            m.encode()
                .contains(r#"workqueue_depth{name="c",controller="c"} 0"#)
        );
    }
}
