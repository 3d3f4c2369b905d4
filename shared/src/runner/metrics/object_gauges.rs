//! Gauges an operator computes at each scrape from what it already caches, one series per
//! object (the PulsarConsumer's backlog and desired replicas, read from the cached
//! objects' status): [`ObjectGauges`], registered with [`super::Metrics::add_object_gauges`].
//!
//! Computed at scrape time rather than set as the objects change: a deleted object's series
//! goes with it from the cache, and nothing is kept twice.

use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, gauge::ConstGauge},
};

use super::Labels;

/// One gauge family: its name, help, and one `(labels, value)` per series.
#[derive(Debug, Clone, PartialEq)]
pub struct GaugeFamily {
    /// The metric name (`pulsarconsumer_backlog_messages`).
    pub name: &'static str,
    /// Its help text.
    pub help: &'static str,
    /// The series now.
    pub series: Vec<(Labels, f64)>,
}

/// A source of gauge families read at each scrape. Every family it returns must be
/// returned at every scrape (with no series when there is nothing to report), so that
/// `/metrics` always describes it.
pub trait ObjectGauges: std::fmt::Debug + Send + Sync + 'static {
    /// The families as they are now.
    fn families(&self) -> Vec<GaugeFamily>;
}

/// The sources registered so far, encoded at each scrape.
#[derive(Debug, Default, Clone)]
pub(super) struct Sources(Arc<Mutex<Vec<Arc<dyn ObjectGauges>>>>);

impl Sources {
    pub(super) fn add(&self, source: Arc<dyn ObjectGauges>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(source);
    }
}

impl Collector for Sources {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sources: Vec<Arc<dyn ObjectGauges>> = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for family in sources.iter().flat_map(|s| s.families()) {
            let mut metric =
                encoder.encode_descriptor(family.name, family.help, None, MetricType::Gauge)?;
            for (labels, value) in &family.series {
                ConstGauge::new(*value).encode(metric.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;
    use super::*;

    #[derive(Debug)]
    struct Fixed(Vec<(Labels, f64)>);

    impl ObjectGauges for Fixed {
        fn families(&self) -> Vec<GaugeFamily> {
            vec![GaugeFamily {
                name: "thing_backlog_messages",
                help: "Backlog of each thing.",
                series: self.0.clone(),
            }]
        }
    }

    #[test]
    fn object_gauges_are_encoded_at_each_scrape() {
        let m = Metrics::new();
        m.add_object_gauges(Arc::new(Fixed(Vec::new())));
        let text = m.encode();
        // Described even with no object to report.
        assert!(
            text.contains("# TYPE thing_backlog_messages gauge"),
            "{text}"
        );
        let m = Metrics::new();
        m.add_object_gauges(Arc::new(Fixed(vec![(
            vec![("namespace", "a".to_owned()), ("name", "b".to_owned())],
            42.0,
        )])));
        let text = m.encode();
        assert!(
            text.contains(r#"thing_backlog_messages{namespace="a",name="b"} 42"#),
            "{text}"
        );
    }
}
