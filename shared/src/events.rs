//! Kubernetes events (`events.k8s.io/v1`), published on condition transitions only, so a
//! steady object does not collect an event per reconcile.
//!
//! Two parts: the policy here, which transitions become events and of which type (one
//! rule, [`announcements`], for every operator; each operator only lists the condition
//! types it announces, [`Announce`]), and the bounded publisher that sends them
//! ([`Events`], in `publisher.rs`), which knows nothing of conditions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::EventType;

use crate::conditions::find;

mod publisher;

pub use publisher::Events;

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
}
