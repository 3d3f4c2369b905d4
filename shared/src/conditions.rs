//! `metav1.Condition` helpers. Pure: the caller passes the clock ([`now`]).
//!
//! A status's conditions are built from the previous ones with [`Conditions`]:
//! `lastTransitionTime` moves only when a condition's `status` changes; reason, message and
//! `observedGeneration` are updated in place otherwise.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The current time to the whole second, as conditions are stamped with it: a stored
/// `metav1.Time` keeps whole seconds only, so a status recomputed from the same observation
/// compares equal to the stored one (and is not written again).
#[must_use]
pub fn now() -> jiff::Timestamp {
    whole_seconds(jiff::Timestamp::now())
}

fn whole_seconds(t: jiff::Timestamp) -> jiff::Timestamp {
    jiff::Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// `True`/`False` as a condition status string.
#[must_use]
pub(crate) fn status_str(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// A status that carries `metav1.Condition`s (every custom resource status here).
pub trait HasConditions {
    /// The conditions, in the order they are stored.
    fn conditions(&self) -> &[Condition];
}

/// The conditions of a new status, built from the old ones.
///
/// ```
/// # use shared::conditions::{Conditions, is_true};
/// let now = jiff::Timestamp::from_second(100).unwrap();
/// let conditions = Conditions::new(&[], Some(1), now)
///     .set("Ready", true, "AllPodsReady", "3/3 pods ready")
///     .set("Degraded", false, "AsExpected", "")
///     .into_vec();
/// assert!(is_true(&conditions, "Ready"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Conditions {
    list: Vec<Condition>,
    generation: Option<i64>,
    now: jiff::Timestamp,
}

impl Conditions {
    /// Starts from `old` (the stored status's conditions); every condition set is stamped
    /// with `generation` (the `metadata.generation` observed) and, when its status changes,
    /// with `now` (to the whole second).
    #[must_use]
    pub fn new(old: &[Condition], generation: Option<i64>, now: jiff::Timestamp) -> Self {
        Self {
            list: old.to_vec(),
            generation,
            now: whole_seconds(now),
        }
    }

    /// Sets the condition `type_`, replacing the one of that type in place or adding it at
    /// the end. Its `lastTransitionTime` is kept when its status is unchanged, else `now`.
    #[must_use]
    pub fn set(
        mut self,
        type_: &str,
        status: bool,
        reason: &str,
        message: impl Into<String>,
    ) -> Self {
        let status = status_str(status);
        let condition = Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: message.into(),
            observed_generation: self.generation,
            last_transition_time: Time(self.now),
        };
        match self.list.iter_mut().find(|c| c.type_ == type_) {
            Some(old) => {
                let since = (old.status == status).then(|| old.last_transition_time.clone());
                *old = Condition {
                    last_transition_time: since.unwrap_or(condition.last_transition_time.clone()),
                    ..condition
                };
            }
            None => self.list.push(condition),
        }
        self
    }

    /// Removes the condition `type_` (a feature turned off).
    #[must_use]
    pub fn remove(mut self, type_: &str) -> Self {
        self.list.retain(|c| c.type_ != type_);
        self
    }

    /// The condition `type_` as set so far.
    #[must_use]
    pub fn get(&self, type_: &str) -> Option<&Condition> {
        find(&self.list, type_)
    }

    /// The conditions.
    #[must_use]
    pub fn into_vec(self) -> Vec<Condition> {
        self.list
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

/// Whether `status` (an object's stored status) says `Ready` for `generation`, its
/// current `metadata.generation` (the condition's `observedGeneration`: a reconcile of
/// that generation set it).
pub(crate) fn says_ready<S: HasConditions>(status: Option<&S>, generation: Option<i64>) -> bool {
    status.is_some_and(|s| {
        find(s.conditions(), "Ready")
            .is_some_and(|c| c.status == "True" && c.observed_generation == generation)
    })
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
        let conds = Conditions::new(&[], Some(1), t(10))
            .set("Ready", false, "Scaling", "0/3")
            .into_vec();
        assert_eq!(conds[0].last_transition_time, Time(t(10)));
        assert_eq!(conds[0].observed_generation, Some(1));

        // Same status, new message: stamp kept, message updated.
        let conds2 = Conditions::new(&conds, Some(1), t(20))
            .set("Ready", false, "Scaling", "2/3")
            .into_vec();
        assert_eq!(conds2[0].last_transition_time, Time(t(10)));
        assert_eq!(conds2[0].message, "2/3");

        // Identical: the same list.
        let conds3 = Conditions::new(&conds2, Some(1), t(30))
            .set("Ready", false, "Scaling", "2/3")
            .into_vec();
        assert_eq!(conds3, conds2);

        // New generation observed: stamp kept.
        let conds4 = Conditions::new(&conds3, Some(2), t(35))
            .set("Ready", false, "Scaling", "2/3")
            .into_vec();
        assert_eq!(conds4[0].observed_generation, Some(2));
        assert_eq!(conds4[0].last_transition_time, Time(t(10)));

        // Status flips: stamp moves. Another type is added after it.
        let conds5 = Conditions::new(&conds4, Some(2), t(40))
            .set("Ready", true, "AllReady", "3/3")
            .set("Progressing", false, "Done", "")
            .into_vec();
        assert_eq!(conds5[0].last_transition_time, Time(t(40)));
        assert!(is_true(&conds5, "Ready"));
        assert_eq!(conds5.len(), 2);
        assert!(!is_true(&conds5, "Progressing"));
        assert_eq!(find(&conds5, "Progressing").unwrap().reason, "Done");
    }

    #[test]
    fn conditions_keep_their_order_and_can_go() {
        let old = Conditions::new(&[], None, t(1))
            .set("A", true, "R", "")
            .set("B", true, "R", "")
            .set("C", true, "R", "")
            .into_vec();
        let new = Conditions::new(&old, None, t(2))
            .set("C", false, "R", "")
            .set("A", true, "R2", "")
            .remove("B");
        assert_eq!(new.get("C").unwrap().status, "False");
        assert!(new.get("B").is_none());
        let types: Vec<String> = new.into_vec().into_iter().map(|c| c.type_).collect();
        assert_eq!(types, ["A", "C"]);
    }

    #[test]
    fn stamps_are_whole_seconds() {
        let late = t(7)
            .checked_add(jiff::SignedDuration::from_millis(900))
            .unwrap();
        let conds = Conditions::new(&[], None, late)
            .set("Ready", true, "R", "")
            .into_vec();
        assert_eq!(conds[0].last_transition_time, Time(t(7)));
        assert_eq!(now().subsec_nanosecond(), 0);
    }
}
