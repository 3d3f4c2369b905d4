//! Kubernetes events (`events.k8s.io/v1`), published on condition transitions only, so a
//! steady object does not collect an event per reconcile.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{
    Client, Resource,
    runtime::events::{Event, EventType, Recorder, Reporter},
};

use crate::conditions;

/// Publishes events for one operator.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// A publisher reporting as `controller` (the operator's name), instance = this pod.
    #[must_use]
    pub fn new(client: Client, controller: &str) -> Self {
        let instance = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .ok();
        Self {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: controller.to_owned(),
                    instance,
                },
            ),
        }
    }

    /// One event per condition whose status changed between `old` and `new`. Normal, except
    /// `Degraded=True` and a `False` condition with a reason listed in `warning_reasons`.
    /// Failures to publish are logged, never fatal.
    pub async fn condition_transitions<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        old: &[Condition],
        new: &[Condition],
        warning_reasons: &[&str],
    ) {
        for c in conditions::transitions(old, new) {
            let warning = (c.type_ == "Degraded" && c.status == "True")
                || (c.status == "False" && warning_reasons.contains(&c.reason.as_str()));
            let type_ = if warning {
                EventType::Warning
            } else {
                EventType::Normal
            };
            let note = if c.message.is_empty() {
                format!("{} is {}", c.type_, c.status)
            } else {
                format!("{} is {}: {}", c.type_, c.status, c.message)
            };
            self.publish(obj, type_, &c.reason, &note, &format!("{}Changed", c.type_))
                .await;
        }
    }

    /// Publishes one event about `obj`; errors are logged (events are best effort).
    pub async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        note: &str,
        action: &str,
    ) {
        let ev = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate(note, 1024)),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            tracing::warn!(%error, reason, "cannot publish event");
        }
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}
