//! Prometheus metrics under the names controller-runtime uses, so dashboards and alerts
//! written for kubebuilder operators keep working.

use std::sync::{Arc, atomic::AtomicI64};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

type Labels = Vec<(&'static str, String)>;

/// controller-runtime's reconcile-time buckets (seconds).
const RECONCILE_TIME_BUCKETS: [f64; 18] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 5.0,
    10.0,
];

fn reconcile_time_histogram() -> Histogram {
    Histogram::new(RECONCILE_TIME_BUCKETS)
}

/// How a reconcile ended, as the `result` label of `controller_runtime_reconcile_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconcileResult {
    /// Done; wait for the next change.
    Success,
    /// Failed; retried with backoff.
    Error,
    /// Asked to be run again at once.
    Requeue,
    /// Asked to be run again after a delay.
    RequeueAfter,
}

impl ReconcileResult {
    fn label(self) -> &'static str {
        match self {
            ReconcileResult::Success => "success",
            ReconcileResult::Error => "error",
            ReconcileResult::Requeue => "requeue",
            ReconcileResult::RequeueAfter => "requeue_after",
        }
    }
}

/// All metrics of one operator process.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    reconcile_total: Family<Labels, Counter>,
    reconcile_errors_total: Family<Labels, Counter>,
    reconcile_time_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    max_concurrent_reconciles: Family<Labels, Gauge>,
    active_workers: Family<Labels, Gauge<i64, AtomicI64>>,
    leader_master_status: Family<Labels, Gauge<i64, AtomicI64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    #[must_use]
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let reconcile_total = Family::<Labels, Counter>::default();
        // prometheus-client appends `_total` to counters.
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
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            leader_master_status.clone(),
        );
        Self {
            registry: Arc::new(registry),
            reconcile_total,
            reconcile_errors_total,
            reconcile_time_seconds,
            max_concurrent_reconciles,
            active_workers,
            leader_master_status,
        }
    }

    /// Records a finished reconcile of `controller`.
    pub fn reconciled(&self, controller: &str, result: ReconcileResult, seconds: f64) {
        let c = vec![("controller", controller.to_owned())];
        let mut with_result = c.clone();
        with_result.push(("result", result.label().to_owned()));
        self.reconcile_total.get_or_create(&with_result).inc();
        if result == ReconcileResult::Error {
            self.reconcile_errors_total.get_or_create(&c).inc();
        }
        self.reconcile_time_seconds
            .get_or_create(&c)
            .observe(seconds);
    }

    /// Sets `controller_runtime_max_concurrent_reconciles` and zeroes the counters so they
    /// are exported before the first reconcile.
    pub fn controller_started(&self, controller: &str, max_concurrent: u16) {
        let c = vec![("controller", controller.to_owned())];
        self.max_concurrent_reconciles
            .get_or_create(&c)
            .set(i64::from(max_concurrent));
        let _ = self.active_workers.get_or_create(&c);
        let _ = self.reconcile_errors_total.get_or_create(&c);
        for r in [
            ReconcileResult::Success,
            ReconcileResult::Error,
            ReconcileResult::Requeue,
            ReconcileResult::RequeueAfter,
        ] {
            let mut l = c.clone();
            l.push(("result", r.label().to_owned()));
            let _ = self.reconcile_total.get_or_create(&l);
        }
    }

    /// Counts one busy worker until the returned guard is dropped.
    #[must_use]
    pub fn worker(&self, controller: &str) -> WorkerGuard {
        let gauge = self
            .active_workers
            .get_or_create(&vec![("controller", controller.to_owned())])
            .clone();
        gauge.inc();
        WorkerGuard(gauge)
    }

    /// Sets `leader_election_master_status{name}`.
    pub fn set_leader(&self, lease_name: &str, leader: bool) {
        self.leader_master_status
            .get_or_create(&vec![("name", lease_name.to_owned())])
            .set(i64::from(leader));
    }

    /// The registry in OpenMetrics text format.
    #[must_use]
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Decrements `controller_runtime_active_workers` when dropped (also when a reconcile is cancelled).
#[derive(Debug)]
pub struct WorkerGuard(Gauge<i64, AtomicI64>);

impl Drop for WorkerGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            r#"controller_runtime_reconcile_time_seconds_count{controller="podset"} 2"#,
            r#"controller_runtime_max_concurrent_reconciles{controller="podset"} 2"#,
            r#"controller_runtime_active_workers{controller="podset"} 0"#,
            r#"leader_election_master_status{name="podset-operator-leader"} 1"#,
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
