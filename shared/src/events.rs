//! Kubernetes events (`events.k8s.io/v1`), published on condition transitions only, so a
//! steady object does not collect an event per reconcile.
//!
//! Which transitions become events, and of which type, is one rule ([`announcements`]) for
//! every operator; each operator only lists the condition types it announces ([`Announce`]).

use std::{
    collections::{HashMap, VecDeque},
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Arc, Mutex, PoisonError},
};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event as K8sEvent},
    apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, ObjectMeta},
};
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams, PostParams},
    runtime::events::EventType,
};

use crate::conditions::find;

/// How the transitions of one condition type are announced (see [`announcements`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announce {
    type_: &'static str,
    abnormal_true: bool,
    warnings: &'static [&'static str],
    on_entry: &'static [&'static str],
}

impl Announce {
    /// A condition whose `True` is the good state (`Ready`, `Available`, `ScalingActive`):
    /// announced when it appears and whenever its status changes.
    #[must_use]
    pub const fn normal_true(type_: &'static str) -> Self {
        Self {
            type_,
            abnormal_true: false,
            warnings: &[],
            on_entry: &[],
        }
    }

    /// A condition whose `True` means trouble (`Degraded`): announced when its status
    /// changes, and when it appears `True` (appearing `False`, nothing is wrong and nothing
    /// was: no news).
    #[must_use]
    pub const fn abnormal_true(type_: &'static str) -> Self {
        Self {
            abnormal_true: true,
            ..Self::normal_true(type_)
        }
    }

    /// Reasons that are a problem for the user to fix: their events are Warnings (every
    /// other event is Normal).
    #[must_use]
    pub const fn warnings(self, reasons: &'static [&'static str]) -> Self {
        Self {
            warnings: reasons,
            ..self
        }
    }

    /// Reasons also announced when the condition turns to them with its status unchanged
    /// (e.g. `Ready=False` going from a rollout to a port conflict).
    #[must_use]
    pub const fn on_entry(self, reasons: &'static [&'static str]) -> Self {
        Self {
            on_entry: reasons,
            ..self
        }
    }

    /// The condition type.
    #[must_use]
    pub const fn type_(&self) -> &'static str {
        self.type_
    }
}

/// One event a status change deserves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    /// Warning for a reason listed by [`Announce::warnings`], else Normal.
    pub warning: bool,
    /// The condition's reason.
    pub reason: String,
    /// `<type> is <status>: <message>` (without `: <message>` when the message is empty).
    pub note: String,
    /// `<type>Changed`.
    pub action: String,
}

impl Announcement {
    /// The event type.
    #[must_use]
    pub fn event_type(&self) -> EventType {
        if self.warning {
            EventType::Warning
        } else {
            EventType::Normal
        }
    }
}

/// The events the change of conditions from `old` to `new` deserves, in the order of
/// `new`. The one rule of every operator, for each condition type listed in `announced`
/// (other types are never announced):
///
/// - a condition that appears is announced, except an [`Announce::abnormal_true`] one
///   appearing `False`;
/// - a condition whose status changes is announced;
/// - a condition whose status stays is announced only when its reason changes to one of
///   its [`Announce::on_entry`] reasons;
/// - a condition that disappears is not announced.
///
/// Nothing is announced for a condition that stays as it was, so repeated reconciles of a
/// stuck object publish nothing.
#[must_use]
pub fn announcements(
    old: &[Condition],
    new: &[Condition],
    announced: &[Announce],
) -> Vec<Announcement> {
    new.iter()
        .filter_map(|c| {
            let rule = announced.iter().find(|a| a.type_ == c.type_)?;
            let news = match find(old, &c.type_) {
                None => !(rule.abnormal_true && c.status == "False"),
                Some(before) => {
                    before.status != c.status
                        || (before.reason != c.reason && rule.on_entry.contains(&c.reason.as_str()))
                }
            };
            news.then(|| Announcement {
                warning: rule.warnings.contains(&c.reason.as_str()),
                reason: c.reason.clone(),
                note: if c.message.is_empty() {
                    format!("{} is {}", c.type_, c.status)
                } else {
                    format!("{} is {}: {}", c.type_, c.status, c.message)
                },
                action: format!("{}Changed", c.type_),
            })
        })
        .collect()
}

/// How long a published event can still become a series when it repeats (kube-rs's
/// recorder keeps them as long).
pub const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// How many recently published events are remembered for series at most: client-go's
/// event correlator keeps as many. Beyond, the oldest is forgotten (its next repeat is a new
/// event rather than a count on the old one).
pub const RECENT_CAPACITY: usize = 4096;

/// Publishes events for one operator.
///
/// An event that repeats one published within [`SERIES_WINDOW`] (same object, type,
/// reason and action) is counted on that event as a series (`series.count`,
/// `series.lastObservedTime`) rather than created again. kube-rs's `Recorder` does the same
/// but keeps every event it published for six minutes, whole, and scans all of them on each
/// publish: 20,000 events (10,000 objects created) took about 30 MiB and a scan of up to
/// 20,000 entries per event. Here only a hash, the event's name and its count are kept, at
/// most [`RECENT_CAPACITY`] of them.
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
    use crate::conditions::Conditions;

    fn conditions(list: &[(&str, bool, &str)]) -> Vec<Condition> {
        list.iter()
            .fold(
                Conditions::new(&[], Some(1), jiff::Timestamp::UNIX_EPOCH),
                |c, (type_, status, reason)| c.set(type_, *status, reason, "msg"),
            )
            .into_vec()
    }

    fn announced(
        old: &[(&str, bool, &str)],
        new: &[(&str, bool, &str)],
        rules: &[Announce],
    ) -> Vec<(String, bool)> {
        announcements(&conditions(old), &conditions(new), rules)
            .into_iter()
            .map(|a| (a.action, a.warning))
            .collect()
    }

    const READY: Announce = Announce::normal_true("Ready");
    const DEGRADED: Announce = Announce::abnormal_true("Degraded").warnings(&["Broken"]);

    #[test]
    fn appearing_and_flipping() {
        // Ready appears either way; Degraded only when True; Progressing never.
        let first = [
            ("Ready", false, "Starting"),
            ("Progressing", true, "Creating"),
            ("Degraded", false, "AsExpected"),
        ];
        assert_eq!(
            announced(&[], &first, &[READY, DEGRADED]),
            [("ReadyChanged".to_owned(), false)]
        );
        assert_eq!(
            announced(&[], &[("Ready", true, "Up")], &[READY]),
            [("ReadyChanged".to_owned(), false)]
        );
        assert_eq!(
            announced(&[], &[("Degraded", true, "Broken")], &[DEGRADED]),
            [("DegradedChanged".to_owned(), true)]
        );
        // Flips, in the order of the new list.
        let broken = [
            ("Ready", true, "Up"),
            ("Progressing", false, "Done"),
            ("Degraded", true, "Broken"),
        ];
        assert_eq!(
            announced(&first, &broken, &[DEGRADED, READY]),
            [
                ("ReadyChanged".to_owned(), false),
                ("DegradedChanged".to_owned(), true)
            ]
        );
        // Back to fine: Normal.
        assert_eq!(
            announced(&broken, &first, &[READY, DEGRADED]),
            [
                ("ReadyChanged".to_owned(), false),
                ("DegradedChanged".to_owned(), false)
            ]
        );
        // Steady, or a reason change that is not on_entry: nothing.
        assert!(announced(&broken, &broken, &[READY, DEGRADED]).is_empty());
        let other = [("Degraded", true, "Other")];
        assert!(announced(&broken, &other, &[DEGRADED]).is_empty());
        // Gone: nothing.
        assert!(announced(&broken, &[], &[READY, DEGRADED]).is_empty());
    }

    #[test]
    fn reasons_announced_on_entry() {
        const WARN: &[&str] = &["PortConflict"];
        let rule = Announce::normal_true("Ready").warnings(WARN).on_entry(WARN);
        let rolling = [("Ready", false, "RollingOut")];
        let conflict = [("Ready", false, "PortConflict")];
        assert_eq!(
            announced(&rolling, &conflict, &[rule]),
            [("ReadyChanged".to_owned(), true)]
        );
        assert!(announced(&conflict, &conflict, &[rule]).is_empty());
        assert!(announced(&conflict, &rolling, &[rule]).is_empty());
        // A Normal reason can be announced on entry too.
        let finalizing = Announce::abnormal_true("Degraded").on_entry(&["Finalizing"]);
        assert_eq!(
            announced(
                &[("Degraded", true, "ApplyFailed")],
                &[("Degraded", true, "Finalizing")],
                &[finalizing]
            ),
            [("DegradedChanged".to_owned(), false)]
        );
    }

    #[test]
    fn notes() {
        let new = Conditions::new(&[], None, jiff::Timestamp::UNIX_EPOCH)
            .set("Ready", true, "Serving", "serving on 30080")
            .set("ScalingActive", false, "TopicNotFound", "")
            .into_vec();
        let a = announcements(&[], &new, &[READY, Announce::normal_true("ScalingActive")]);
        assert_eq!(a[0].note, "Ready is True: serving on 30080");
        assert_eq!(a[0].reason, "Serving");
        assert_eq!(a[1].note, "ScalingActive is False");
        assert_eq!(a[1].action, "ScalingActiveChanged");
        assert!(matches!(a[1].event_type(), EventType::Normal));
    }

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
