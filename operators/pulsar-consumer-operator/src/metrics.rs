//! The PulsarConsumer's own gauges on `/metrics`, beside the controller's
//! (`shared::ObjectGauges`): per object, what its status says (the backlog, the consumers the
//! autoscaler wants, those ready), read from the operator's cache at each scrape, so a
//! dashboard can plot them and a deleted object's series goes with it.
//!
//! - `pulsarconsumer_backlog_messages`: `status.backlog`, the subscription's backlog at the
//!   last read of the admin API (autoscaled objects with a successful read only);
//! - `pulsarconsumer_desired_replicas`: `status.desiredReplicas`, the autoscaler's count
//!   (autoscaled objects only);
//! - `pulsarconsumer_ready_replicas`: `status.replicas`, the ready consumers (every object).
//!
//! Each series is labelled `pulsarconsumer_namespace` and `pulsarconsumer` (the object's
//! namespace and name), as kube-state-metrics labels a Deployment's series `deployment`:
//! not `namespace`, which Prometheus sets on every scraped series to the namespace of the
//! operator's pod and would rename ours to `exported_namespace`.

use shared::{GaugeFamily, ObjectGauges};

use crate::poll::Pollers;

/// `pulsarconsumer_backlog_messages`.
pub const BACKLOG: &str = "pulsarconsumer_backlog_messages";
/// `pulsarconsumer_desired_replicas`.
pub const DESIRED_REPLICAS: &str = "pulsarconsumer_desired_replicas";
/// `pulsarconsumer_ready_replicas`.
pub const READY_REPLICAS: &str = "pulsarconsumer_ready_replicas";

/// The label naming the PulsarConsumer's namespace.
pub const NAMESPACE_LABEL: &str = "pulsarconsumer_namespace";
/// The label naming the PulsarConsumer.
pub const NAME_LABEL: &str = "pulsarconsumer";

/// The gauges of every cached PulsarConsumer (the caches the pollers check their objects
/// in hold every PulsarConsumer the operator watches).
#[derive(Debug)]
pub struct StatusGauges {
    /// Holds the PulsarConsumer caches.
    pub pollers: Pollers,
}

impl ObjectGauges for StatusGauges {
    fn families(&self) -> Vec<GaugeFamily> {
        let consumers = self.pollers.consumers().all();
        families(consumers.iter().map(|pc| pc.as_ref()))
    }
}

/// The three families for `consumers` (pure: the status fields as gauges).
pub fn families<'a>(
    consumers: impl Iterator<Item = &'a crate::PulsarConsumer>,
) -> Vec<GaugeFamily> {
    let mut backlog = Vec::new();
    let mut desired = Vec::new();
    let mut ready = Vec::new();
    for pc in consumers {
        let (Some(namespace), Some(name)) = (&pc.metadata.namespace, &pc.metadata.name) else {
            continue;
        };
        let labels = vec![
            (NAMESPACE_LABEL, namespace.clone()),
            (NAME_LABEL, name.clone()),
        ];
        let status = pc.status.clone().unwrap_or_default();
        if let Some(messages) = status.backlog {
            backlog.push((labels.clone(), messages as f64));
        }
        if let Some(count) = status.desired_replicas {
            desired.push((labels.clone(), f64::from(count)));
        }
        ready.push((labels, f64::from(status.replicas)));
    }
    vec![
        GaugeFamily {
            name: BACKLOG,
            help: "The subscription's backlog (messages) at the last read of the Pulsar admin API, per autoscaled PulsarConsumer (status.backlog).",
            series: backlog,
        },
        GaugeFamily {
            name: DESIRED_REPLICAS,
            help: "The number of consumers the autoscaler gives the Deployment, per autoscaled PulsarConsumer (status.desiredReplicas).",
            series: desired,
        },
        GaugeFamily {
            name: READY_REPLICAS,
            help: "The number of ready consumers, per PulsarConsumer (status.replicas).",
            series: ready,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PulsarConsumer, PulsarConsumerStatus};

    fn consumer(name: &str, status: Option<PulsarConsumerStatus>) -> PulsarConsumer {
        let mut pc: PulsarConsumer = serde_json::from_value(serde_json::json!({
            "apiVersion": "pulsar.pulsarconsumer.krvarma.com/v1",
            "kind": "PulsarConsumer",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"serverAddress": "pulsar://b:6650", "topic": "t", "subscriptionName": "s", "replicas": 1},
        }))
        .unwrap();
        pc.status = status;
        pc
    }

    #[test]
    fn status_fields_become_series() {
        let autoscaled = consumer(
            "auto",
            Some(PulsarConsumerStatus {
                replicas: 2,
                backlog: Some(1500),
                desired_replicas: Some(3),
                ..PulsarConsumerStatus::default()
            }),
        );
        let fixed = consumer("fixed", None);
        let all = families([&autoscaled, &fixed].into_iter());
        let series = |name: &str| {
            all.iter()
                .find(|f| f.name == name)
                .map(|f| f.series.clone())
                .unwrap()
        };
        let labels = |n: &str| {
            vec![
                ("pulsarconsumer_namespace", "ns".to_owned()),
                ("pulsarconsumer", n.to_owned()),
            ]
        };
        assert_eq!(series(BACKLOG), vec![(labels("auto"), 1500.0)]);
        assert_eq!(series(DESIRED_REPLICAS), vec![(labels("auto"), 3.0)]);
        assert_eq!(
            series(READY_REPLICAS),
            vec![(labels("auto"), 2.0), (labels("fixed"), 0.0)]
        );
        // No object: the families are still there, empty.
        assert_eq!(families(std::iter::empty()).len(), 3);
    }
}
