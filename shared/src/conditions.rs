//! `metav1.Condition` helpers. Pure: the caller passes the clock.
//!
//! `lastTransitionTime` moves only when a condition's `status` changes; reason, message and
//! `observedGeneration` are updated in place otherwise.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// `True`/`False` as a condition status string.
#[must_use]
pub fn status_str(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// A new condition stamped with `now` (the stamp is kept by [`set_condition`] when the
/// status did not change).
#[must_use]
pub fn new_condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: jiff::Timestamp,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status_str(status).to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation,
        last_transition_time: Time(now),
    }
}

/// Sets `new` in `conditions`, replacing the condition of the same type. When the status is
/// unchanged the old `lastTransitionTime` is kept. Returns whether anything changed.
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            if old.status == new.status {
                new.last_transition_time = old.last_transition_time.clone();
            }
            let changed = *old != new;
            *old = new;
            changed
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

/// The condition of type `type_`, if present.
#[must_use]
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of type `type_` is present and `True`.
#[must_use]
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Conditions in `new` whose status differs from the same type in `old` (or that are new):
/// the transitions worth an event.
#[must_use]
pub fn transitions<'a>(old: &[Condition], new: &'a [Condition]) -> Vec<&'a Condition> {
    new.iter()
        .filter(|n| find(old, &n.type_).is_none_or(|o| o.status != n.status))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn t(s: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let mut conds = Vec::new();
        assert!(set_condition(
            &mut conds,
            new_condition("Ready", false, "Scaling", "0/3", Some(1), t(10))
        ));
        assert_eq!(conds[0].last_transition_time, Time(t(10)));

        // Same status, new message: stamp kept, change reported.
        assert!(set_condition(
            &mut conds,
            new_condition("Ready", false, "Scaling", "2/3", Some(1), t(20))
        ));
        assert_eq!(conds[0].last_transition_time, Time(t(10)));
        assert_eq!(conds[0].message, "2/3");

        // Identical: no change.
        assert!(!set_condition(
            &mut conds,
            new_condition("Ready", false, "Scaling", "2/3", Some(1), t(30))
        ));
        assert_eq!(conds[0].last_transition_time, Time(t(10)));

        // New generation observed: change, stamp kept.
        assert!(set_condition(
            &mut conds,
            new_condition("Ready", false, "Scaling", "2/3", Some(2), t(35))
        ));
        assert_eq!(conds[0].observed_generation, Some(2));
        assert_eq!(conds[0].last_transition_time, Time(t(10)));

        // Status flips: stamp moves.
        assert!(set_condition(
            &mut conds,
            new_condition("Ready", true, "AllReady", "3/3", Some(2), t(40))
        ));
        assert_eq!(conds[0].last_transition_time, Time(t(40)));
        assert!(is_true(&conds, "Ready"));
        assert_eq!(conds.len(), 1);

        // Another type is added beside.
        assert!(set_condition(
            &mut conds,
            new_condition("Progressing", false, "Done", "", Some(2), t(40))
        ));
        assert_eq!(conds.len(), 2);
        assert!(!is_true(&conds, "Progressing"));
    }

    #[test]
    fn transitions_are_status_changes_and_new_types() {
        let old = vec![new_condition("Ready", false, "A", "", None, t(1))];
        let same = vec![new_condition(
            "Ready",
            false,
            "B",
            "other message",
            None,
            t(2),
        )];
        assert!(transitions(&old, &same).is_empty());
        let flipped = vec![
            new_condition("Ready", true, "A", "", None, t(2)),
            new_condition("Progressing", false, "A", "", None, t(2)),
        ];
        let tr: Vec<_> = transitions(&old, &flipped)
            .iter()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(tr, ["Ready", "Progressing"]);
    }
}
