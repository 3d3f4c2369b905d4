//! `operator_objects{controller,ready}` and `operator_objects_not_ready_seconds_max{controller}`:
//! how many of a controller's primary objects say Ready for their generation, and how long
//! the oldest of the others has not, read from the controller's caches at each scrape
//! ([`ReadyGauges`], registered by the runner for every controller). Nothing is kept per
//! object: a deleted object leaves the cache and the counts with it.

use std::sync::Arc;

use kube::{Resource, core::object::HasStatus, runtime::reflector::Store};

use super::object_gauges::{GaugeFamily, ObjectGauges};
use crate::conditions::{HasConditions, find, says_ready};

/// `operator_objects{controller,ready}`.
pub(crate) const OBJECTS: &str = "operator_objects";
/// `operator_objects_not_ready_seconds_max{controller}`.
pub(crate) const NOT_READY_SECONDS_MAX: &str = "operator_objects_not_ready_seconds_max";

const OBJECTS_HELP: &str = "The controller's primary objects in the operator's cache, not counting those being deleted: ready=\"true\" those whose Ready condition is True for their current generation (its observedGeneration is metadata.generation), ready=\"false\" the others (Ready False or Unknown, absent, no status yet, or True for an older generation).";
const NOT_READY_SECONDS_MAX_HELP: &str = "Over the controller's cached primary objects counted in operator_objects{ready=\"false\"}, the longest time one has not been Ready, in seconds: now minus the later of its metadata.creationTimestamp and, when its Ready condition is present and not True, that condition's lastTransitionTime (an object whose Ready=True is for an older generation is counted in operator_objects{ready=\"false\"} but adds no time here: when its spec changed is not recorded); 0 when there is none.";

/// The two families of one controller, read from its caches (one store per watched scope).
pub(crate) struct ReadyGauges<K: Resource<DynamicType = ()> + Clone + 'static> {
    /// The controller (`controller` label).
    pub(crate) controller: &'static str,
    /// The controller's primary stores, one per watched scope.
    pub(crate) stores: Vec<Store<K>>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> std::fmt::Debug for ReadyGauges<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadyGauges")
            .field("controller", &self.controller)
            .field("stores", &self.stores.len())
            .finish()
    }
}

impl<K> ObjectGauges for ReadyGauges<K>
where
    K: Resource<DynamicType = ()> + HasStatus + Clone + Send + Sync + 'static,
    K::Status: HasConditions,
{
    fn families(&self) -> Vec<GaugeFamily> {
        let objects: Vec<Arc<K>> = self.stores.iter().flat_map(Store::state).collect();
        families(
            self.controller,
            objects.iter().map(AsRef::as_ref),
            crate::conditions::now(),
        )
    }
}

/// The two families for `objects` at `now` (pure).
pub(crate) fn families<'a, K>(
    controller: &'static str,
    objects: impl IntoIterator<Item = &'a K>,
    now: jiff::Timestamp,
) -> Vec<GaugeFamily>
where
    K: Resource + HasStatus + 'a,
    K::Status: HasConditions,
{
    let (mut ready, mut not_ready, mut longest) = (0_u32, 0_u32, 0_i64);
    for obj in objects {
        let meta = obj.meta();
        if meta.deletion_timestamp.is_some() {
            continue;
        }
        if says_ready(obj.status(), meta.generation) {
            ready += 1;
            continue;
        }
        not_ready += 1;
        let condition = obj.status().and_then(|s| find(s.conditions(), "Ready"));
        if condition.is_some_and(|c| c.status == "True") {
            // Ready for an older generation: its spec changed, and nothing records when
            // (counting from its creation would call a month-old object that waits its
            // turn "not Ready for a month"). The work queue's alerts cover an operator
            // that does not get to it.
            continue;
        }
        let created = meta.creation_timestamp.as_ref().map(|t| t.0);
        let turned = condition.map(|c| c.last_transition_time.0);
        if let Some(since) = created.into_iter().chain(turned).max() {
            longest = longest.max(now.as_second().saturating_sub(since.as_second()));
        }
    }
    let labels = |ready: bool| {
        vec![
            ("controller", controller.to_owned()),
            ("ready", ready.to_string()),
        ]
    };
    vec![
        GaugeFamily {
            name: OBJECTS,
            help: OBJECTS_HELP,
            series: vec![
                (labels(true), f64::from(ready)),
                (labels(false), f64::from(not_ready)),
            ],
        },
        GaugeFamily {
            name: NOT_READY_SECONDS_MAX,
            help: NOT_READY_SECONDS_MAX_HELP,
            series: vec![(
                vec![("controller", controller.to_owned())],
                // Whole seconds: exact in an f64 for any real age.
                #[allow(clippy::cast_precision_loss)]
                {
                    longest as f64
                },
            )],
        },
    ]
}

#[cfg(test)]
pub(super) mod tests {
    #![allow(clippy::unwrap_used)]
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use kube::core::ObjectMeta;

    use super::*;

    /// A status with conditions, on a stand-in kind.
    #[derive(Debug, Clone, Default)]
    struct St(Vec<Condition>);

    impl HasConditions for St {
        fn conditions(&self) -> &[Condition] {
            &self.0
        }
    }

    #[derive(Debug, Clone)]
    struct Obj {
        meta: ObjectMeta,
        status: Option<St>,
    }

    impl Resource for Obj {
        type DynamicType = ();
        type Scope = k8s_openapi::NamespaceResourceScope;
        fn kind(_: &()) -> std::borrow::Cow<'_, str> {
            "Thing".into()
        }
        fn group(_: &()) -> std::borrow::Cow<'_, str> {
            "example.com".into()
        }
        fn version(_: &()) -> std::borrow::Cow<'_, str> {
            "v1".into()
        }
        fn plural(_: &()) -> std::borrow::Cow<'_, str> {
            "things".into()
        }
        fn meta(&self) -> &ObjectMeta {
            &self.meta
        }
        fn meta_mut(&mut self) -> &mut ObjectMeta {
            &mut self.meta
        }
    }

    impl HasStatus for Obj {
        type Status = St;
        fn status(&self) -> Option<&St> {
            self.status.as_ref()
        }
        fn status_mut(&mut self) -> &mut Option<St> {
            &mut self.status
        }
    }

    fn t(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(s).unwrap()
    }

    fn ready(status: &str, observed: i64, since: i64) -> Condition {
        Condition {
            type_: "Ready".into(),
            status: status.into(),
            observed_generation: Some(observed),
            last_transition_time: Time(t(since)),
            reason: "R".into(),
            message: String::new(),
        }
    }

    fn obj(created: i64, generation: i64, status: Option<St>) -> Obj {
        Obj {
            meta: ObjectMeta {
                name: Some("o".into()),
                namespace: Some("ns".into()),
                generation: Some(generation),
                creation_timestamp: Some(Time(t(created))),
                ..ObjectMeta::default()
            },
            status,
        }
    }

    /// `(ready, not ready, longest)` from the families.
    fn read(families: &[GaugeFamily]) -> (f64, f64, f64) {
        assert_eq!(families.len(), 2);
        assert_eq!(families[0].name, "operator_objects");
        assert_eq!(families[1].name, "operator_objects_not_ready_seconds_max");
        let value = |ready: &str| {
            families[0]
                .series
                .iter()
                .find(|(l, _)| {
                    l == &vec![
                        ("controller", "thing".to_owned()),
                        ("ready", ready.to_owned()),
                    ]
                })
                .unwrap()
                .1
        };
        assert_eq!(
            families[1].series[0].0,
            vec![("controller", "thing".to_owned())]
        );
        (value("true"), value("false"), families[1].series[0].1)
    }

    /// The families of `controller` with no object (for the runner's metric names test).
    pub(in crate::runner::metrics) fn families_of_none(
        controller: &'static str,
    ) -> Vec<GaugeFamily> {
        families::<Obj>(controller, [], t(0))
    }

    #[test]
    fn no_objects_still_describe_both_families() {
        let none: Vec<Obj> = Vec::new();
        assert_eq!(read(&families("thing", &none, t(1000))), (0.0, 0.0, 0.0));
    }

    #[test]
    fn every_object_ready_is_zero_seconds() {
        let objects = [
            obj(100, 1, Some(St(vec![ready("True", 1, 200)]))),
            obj(100, 3, Some(St(vec![ready("True", 3, 900)]))),
        ];
        assert_eq!(read(&families("thing", &objects, t(1000))), (2.0, 0.0, 0.0));
    }

    #[test]
    fn not_ready_objects_count_from_the_later_of_creation_and_transition() {
        let mut deleting = obj(0, 1, Some(St(vec![ready("False", 1, 0)])));
        deleting.meta.deletion_timestamp = Some(Time(t(10)));
        let objects = [
            // Ready for its generation.
            obj(100, 1, Some(St(vec![ready("True", 1, 200)]))),
            // Ready False since 400 (created at 100): 600 s.
            obj(100, 2, Some(St(vec![ready("False", 2, 400)]))),
            // Unknown since 50, before its creation at 300 (a stale stamp): 700 s.
            obj(300, 1, Some(St(vec![ready("Unknown", 1, 50)]))),
            // No status yet, created at 800: 200 s.
            obj(800, 1, None),
            // A status without a Ready condition, created at 850: 150 s.
            obj(850, 1, Some(St::default())),
            // Ready True for generation 1, its spec now at generation 2: not Ready,
            // but no time (when its spec changed is not recorded; else 800 s).
            obj(200, 2, Some(St(vec![ready("True", 1, 250)]))),
            // Being deleted: not counted at all (else 1000 s).
            deleting,
        ];
        assert_eq!(
            read(&families("thing", &objects, t(1000))),
            (1.0, 5.0, 700.0)
        );
    }

    #[test]
    fn a_stamp_in_the_future_counts_as_zero() {
        let objects = [obj(2000, 1, Some(St(vec![ready("False", 1, 2000)])))];
        assert_eq!(read(&families("thing", &objects, t(1000))), (0.0, 1.0, 0.0));
    }

    #[test]
    fn a_registered_source_reads_its_stores_at_each_scrape() {
        use kube::runtime::watcher::Event;
        let (store, mut writer) = kube::runtime::reflector::store::<Obj>();
        let source = Arc::new(ReadyGauges {
            controller: "thing",
            stores: vec![store],
        });
        let m = super::super::Metrics::new();
        m.add_object_gauges(source);
        let text = m.encode();
        for needle in [
            "# TYPE operator_objects gauge",
            "# TYPE operator_objects_not_ready_seconds_max gauge",
            r#"operator_objects{controller="thing",ready="false"} 0"#,
            r#"operator_objects_not_ready_seconds_max{controller="thing"} 0"#,
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        let mut a = obj(100, 1, Some(St(vec![ready("True", 1, 200)])));
        a.meta.name = Some("a".into());
        let mut b = obj(100, 1, Some(St(vec![ready("False", 1, 200)])));
        b.meta.name = Some("b".into());
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(a));
        writer.apply_watcher_event(&Event::InitApply(b));
        writer.apply_watcher_event(&Event::InitDone);
        let text = m.encode();
        for needle in [
            r#"operator_objects{controller="thing",ready="true"} 1"#,
            r#"operator_objects{controller="thing",ready="false"} 1"#,
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        // Created at 100 s after the epoch: not Ready for decades.
        assert!(
            !text.contains(r#"operator_objects_not_ready_seconds_max{controller="thing"} 0"#),
            "{text}"
        );
    }
}
