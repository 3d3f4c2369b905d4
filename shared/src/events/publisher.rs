//! The bounded event publisher: sends each [`Announcement`] as an `events.k8s.io/v1`
//! Event, counting repeats as a series.

use std::{
    collections::{HashMap, VecDeque},
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Arc, Mutex, PoisonError},
};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event as K8sEvent},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams, PostParams},
    runtime::events::EventType,
};

use super::Announcement;

/// How long a published event can still become a series when it repeats (kube-rs's
/// recorder keeps them as long).
pub(crate) const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// How many recently published events are remembered for series at most: client-go's
/// event correlator keeps as many. Beyond, the oldest is forgotten (its next repeat is a new
/// event rather than a count on the old one).
pub(crate) const RECENT_CAPACITY: usize = 4096;

/// Publishes events for one operator.
///
/// An event that repeats one published within `SERIES_WINDOW` (same object, type,
/// reason and action) is counted on that event as a series (`series.count`,
/// `series.lastObservedTime`) rather than created again. kube-rs's `Recorder` does the same
/// but keeps every event it published for six minutes, whole, and scans all of them on each
/// publish: 20,000 events (10,000 objects created) took about 30 MiB and a scan of up to
/// 20,000 entries per event. Here only a hash, the event's name and its count are kept, at
/// most `RECENT_CAPACITY` of them.
#[derive(Clone)]
pub struct Events {
    client: Client,
    controller: String,
    instance: String,
    recent: Arc<Mutex<Recent>>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("controller", &self.controller)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl Events {
    /// A publisher reporting as `controller` (the operator's name), instance = this pod.
    #[must_use]
    pub fn new(client: Client, controller: &str) -> Self {
        let instance = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| controller.to_owned());
        Self {
            client,
            controller: controller.to_owned(),
            instance,
            recent: Arc::default(),
        }
    }

    /// Logs and publishes each of `announcements` about `obj` (Warnings logged as warnings,
    /// the rest at info). Failures to publish are logged, never fatal.
    pub async fn announce<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        announcements: &[Announcement],
    ) {
        for a in announcements {
            if a.warning {
                tracing::warn!(reason = %a.reason, "{}", a.note);
            } else {
                tracing::info!(reason = %a.reason, "{}", a.note);
            }
            self.publish(obj, a.event_type(), &a.reason, &a.note, &a.action)
                .await;
        }
    }

    /// Publishes one event about `obj`; errors are logged (events are best effort; in a
    /// namespace being deleted, where no event can be created, at debug level only).
    pub async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        note: &str,
        action: &str,
    ) {
        let regarding = obj.object_ref(&());
        match self
            .send(regarding, type_, reason, &truncate(note, 1024), action)
            .await
        {
            Ok(()) => {}
            Err(error) if crate::apply::namespace_terminating(&error) => {
                tracing::debug!(%error, reason, "no event: the namespace is being deleted");
            }
            Err(error) => tracing::warn!(%error, reason, "cannot publish event"),
        }
    }

    async fn send(
        &self,
        regarding: ObjectReference,
        type_: EventType,
        reason: &str,
        note: &str,
        action: &str,
    ) -> Result<(), kube::Error> {
        let type_ = match type_ {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        let key = series_key(&regarding, type_, reason, action);
        let now = Timestamp::now();
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let repeat = self.recent().repeat_of(key, now);
        if let Some((name, count)) = repeat {
            let series = serde_json::json!({
                "series": { "count": count, "lastObservedTime": MicroTime(now) }
            });
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&series))
                .await
            {
                Ok(_) => {
                    self.recent().sent(key, name, count, now);
                    return Ok(());
                }
                // Deleted meanwhile (events expire after an hour): a new one.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let name = format!(
            "{}.{:x}",
            regarding.name.as_deref().unwrap_or(&self.controller),
            now.as_nanosecond()
        );
        let event = K8sEvent {
            action: Some(action.to_owned()),
            reason: Some(reason.to_owned()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding),
            note: Some(note.to_owned()),
            metadata: ObjectMeta {
                namespace: Some(namespace),
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(type_.to_owned()),
            ..K8sEvent::default()
        };
        api.create(&PostParams::default(), &event).await?;
        self.recent().sent(key, name, 1, now);
        Ok(())
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What makes two events one series: the object, type, reason and action (the note may
/// differ), hashed.
fn series_key(regarding: &ObjectReference, type_: &str, reason: &str, action: &str) -> u64 {
    let mut h = DefaultHasher::new();
    (
        &regarding.uid,
        &regarding.kind,
        &regarding.namespace,
        &regarding.name,
        type_,
        reason,
        action,
    )
        .hash(&mut h);
    h.finish()
}

/// The events published recently: by series key, the event's name, its count and when it
/// was last observed; `order` holds the keys oldest first.
#[derive(Debug, Default)]
struct Recent {
    entries: HashMap<u64, (String, i32, Timestamp)>,
    order: VecDeque<u64>,
}

impl Recent {
    /// The name of the event `key` repeats and its next count, if one was published within
    /// [`SERIES_WINDOW`] of `now`. Forgets what has expired.
    fn repeat_of(&mut self, key: u64, now: Timestamp) -> Option<(String, i32)> {
        while let Some(oldest) = self.order.front() {
            let expired = self
                .entries
                .get(oldest)
                .is_none_or(|(_, _, last)| *last + SERIES_WINDOW <= now);
            if !expired {
                break;
            }
            self.entries.remove(oldest);
            self.order.pop_front();
        }
        self.entries
            .get(&key)
            .filter(|(_, _, last)| *last + SERIES_WINDOW > now)
            .map(|(name, count, _)| (name.clone(), count.saturating_add(1)))
    }

    /// Records that the event `name` was published (`count` = 1) or counted (`count` > 1)
    /// for `key` at `now`, forgetting the oldest beyond [`RECENT_CAPACITY`].
    fn sent(&mut self, key: u64, name: String, count: i32, now: Timestamp) {
        if self.entries.insert(key, (name, count, now)).is_none() {
            self.order.push_back(key);
        }
        while self.entries.len() > RECENT_CAPACITY {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.entries.remove(&oldest);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeat_within_the_window_is_a_series_and_memory_is_bounded() {
        let t0 = Timestamp::UNIX_EPOCH;
        let mut recent = Recent::default();
        assert_eq!(recent.repeat_of(1, t0), None);
        recent.sent(1, "a.1".into(), 1, t0);
        let later = t0 + SignedDuration::from_mins(5);
        assert_eq!(recent.repeat_of(1, later), Some(("a.1".into(), 2)));
        recent.sent(1, "a.1".into(), 2, later);
        // The window runs from the last time the event was observed.
        let still = later + SignedDuration::from_mins(5);
        assert_eq!(recent.repeat_of(1, still), Some(("a.1".into(), 3)));
        assert_eq!(recent.repeat_of(2, still), None);
        // Expired: forgotten, so the repeat is a new event.
        let gone = later + SERIES_WINDOW;
        assert_eq!(recent.repeat_of(1, gone), None);
        assert!(recent.entries.is_empty() && recent.order.is_empty());
        // Never more than RECENT_CAPACITY remembered; the oldest go first.
        for key in 0..(RECENT_CAPACITY as u64 + 10) {
            recent.sent(key, format!("e.{key}"), 1, gone);
        }
        assert_eq!(recent.entries.len(), RECENT_CAPACITY);
        assert_eq!(recent.order.len(), RECENT_CAPACITY);
        assert_eq!(recent.repeat_of(0, gone), None);
        assert_eq!(recent.repeat_of(10, gone), Some(("e.10".into(), 2)));
    }

    #[test]
    fn the_series_key_is_the_object_type_reason_and_action() {
        let obj = |name: &str| ObjectReference {
            kind: Some("PodSet".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectReference::default()
        };
        let key = series_key(&obj("a"), "Normal", "Ready", "ReadyChanged");
        assert_eq!(
            key,
            series_key(&obj("a"), "Normal", "Ready", "ReadyChanged")
        );
        for other in [
            series_key(&obj("b"), "Normal", "Ready", "ReadyChanged"),
            series_key(&obj("a"), "Warning", "Ready", "ReadyChanged"),
            series_key(&obj("a"), "Normal", "Other", "ReadyChanged"),
            series_key(&obj("a"), "Normal", "Ready", "DegradedChanged"),
        ] {
            assert_ne!(key, other);
        }
    }
}
