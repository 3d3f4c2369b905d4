//! What writing a child came to: its [`Outcome`] (with the [`Problem`] the status reports)
//! and the child as it now is ([`Current`]), together a [`Child`]. Pure.

use std::sync::Arc;

use kube::Resource;
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    apply::namespace_terminating,
    error::Error,
    ownership::{self, NameConflict},
    slim::Slim,
};

/// Why a child could not be written: what the status turns into a condition.
#[derive(Debug, Clone)]
pub enum Problem {
    /// The name is held by an object this primary does not control: left untouched.
    NameConflict(NameConflict),
    /// The API server refused the write: `403` (admission, quota) or `422` (invalid,
    /// immutable field, a NodePort taken).
    Refused(Refusal),
}

impl Problem {
    /// A short reason: [`ownership::REASON_NAME_CONFLICT`], or the API server's
    /// (`Forbidden`, `Invalid`).
    #[must_use]
    pub fn reason(&self) -> &str {
        match self {
            Problem::NameConflict(_) => ownership::REASON_NAME_CONFLICT,
            Problem::Refused(r) => &r.0.reason,
        }
    }

    /// The object in the way, when that is the problem.
    #[must_use]
    pub fn name_conflict(&self) -> Option<&NameConflict> {
        match self {
            Problem::NameConflict(c) => Some(c),
            Problem::Refused(_) => None,
        }
    }

    /// What to tell the user: the object in the way, or the API server's message.
    #[must_use]
    pub fn message(&self) -> String {
        match self {
            Problem::NameConflict(c) => c.message(),
            Problem::Refused(r) => r.message().to_owned(),
        }
    }
}

/// A write the API server refused with `403` or `422` (not a namespace being deleted).
#[derive(Debug, Clone)]
pub struct Refusal(Box<kube::core::Status>);

impl Refusal {
    /// The HTTP status code: `403` or `422`.
    #[must_use]
    pub fn code(&self) -> u16 {
        self.0.code
    }

    /// The API server's message.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// The refusal as the error the write returned, for an operator that retries it as one.
    #[must_use]
    pub fn into_error(self) -> Error {
        Error::Kube(kube::Error::Api(self.0))
    }
}

/// What happened to one child.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Written by this reconcile (created, updated, or its count scaled).
    Written,
    /// Already held every desired field: nothing was written.
    InSync,
    /// The name is held by the child of an earlier primary of the same kind and name
    /// (garbage collection removes it; it may be stuck terminating): nothing was written,
    /// and [`Children::leftover_recheck`](super::Children::leftover_recheck) says when to
    /// look again.
    Leftover,
    /// Not written, for a reason the status reports.
    Problem(Problem),
    /// The namespace is being deleted: nothing more is written there.
    NamespaceTerminating,
}

impl Outcome {
    /// What a failed write means: a namespace being deleted, a refusal the status reports
    /// (`403`, `422`), or else the error itself (to retry with backoff).
    ///
    /// # Errors
    /// `error` when it is neither.
    pub fn of_error(error: kube::Error) -> Result<Outcome, kube::Error> {
        match error {
            e if namespace_terminating(&e) => Ok(Outcome::NamespaceTerminating),
            kube::Error::Api(s) if matches!(s.code, 403 | 422) => {
                Ok(Outcome::Problem(Problem::Refused(Refusal(s))))
            }
            e => Err(e),
        }
    }
}

/// A child of the primary as a write left it: whole when the kit has it whole, else as
/// cached (parsed only when asked for: [`Child::into_object`]).
#[derive(Debug, Clone)]
pub(crate) enum Current<K: Resource<DynamicType = ()>> {
    /// As the API server answered (a write, or the GET of a claim); after a write of the
    /// count alone, the object before it (the count not updated yet).
    Object(K),
    /// As the cache holds it (nothing was written or read).
    Cached(Arc<Slim<K>>),
}

impl<K: Resource<DynamicType = ()> + Serialize + DeserializeOwned> Current<K> {
    /// The object whole ([`Slim::full`] for a cached one).
    fn into_full(self) -> Result<K, Error> {
        match self {
            Current::Object(k) => Ok(k),
            Current::Cached(slim) => slim.full(),
        }
    }
}

/// What writing one child came to: the [`Outcome`], and the child of this primary as it
/// now is (`None`: there is none, or the name is held by another object).
#[derive(Debug, Clone)]
pub struct Child<K: Resource<DynamicType = ()>> {
    /// What happened.
    pub outcome: Outcome,
    /// The primary's own child as written or cached, if there is one.
    pub(crate) current: Option<Current<K>>,
}

impl<K: Resource<DynamicType = ()> + Serialize + DeserializeOwned> Child<K> {
    /// The primary's own child, whole.
    ///
    /// # Errors
    /// When the cached text does not parse.
    pub fn into_object(self) -> Result<Option<K>, Error> {
        self.current.map(Current::into_full).transpose()
    }

    /// Whether the primary has its own child there (written, or as cached).
    #[must_use]
    pub fn exists(&self) -> bool {
        self.current.is_some()
    }

    /// Whether the name is held by an object that is not this primary's (a stranger's,
    /// or a leftover of an earlier primary).
    #[must_use]
    pub fn is_held_by_another(&self) -> bool {
        matches!(
            self.outcome,
            Outcome::Leftover | Outcome::Problem(Problem::NameConflict(_))
        )
    }

    /// Whether a [`Problem`] kept it from being written.
    #[must_use]
    pub fn is_problem(&self) -> bool {
        matches!(self.outcome, Outcome::Problem(_))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::Service;

    const TERMINATING: &str = "services \"moo\" is forbidden: unable to create new content in namespace ns because it is being terminated";

    #[test]
    fn refusals_are_problems_and_other_failures_errors() {
        let api = |code: u16, message: &str| {
            kube::Error::Api(
                kube::core::Status::failure(message, "Forbidden")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(matches!(
            Outcome::of_error(api(403, TERMINATING)),
            Ok(Outcome::NamespaceTerminating)
        ));
        for code in [403, 422] {
            let Ok(Outcome::Problem(problem)) = Outcome::of_error(api(code, "no")) else {
                panic!("{code} is a problem");
            };
            let Problem::Refused(refusal) = &problem else {
                panic!("{problem:?}")
            };
            assert_eq!((refusal.code(), refusal.message()), (code, "no"));
            assert_eq!(
                (problem.reason(), problem.message()),
                ("Forbidden", "no".into())
            );
            assert!(problem.name_conflict().is_none());
            let Error::Kube(kube::Error::Api(s)) = refusal.clone().into_error() else {
                panic!("the refusal is the error it was");
            };
            assert_eq!(s.code, code);
        }
        for code in [404, 409, 429, 500] {
            assert!(Outcome::of_error(api(code, "no")).is_err(), "{code}");
        }
    }

    #[test]
    fn a_name_conflict_names_the_object() {
        let problem = Problem::NameConflict(NameConflict {
            kind: "Service".into(),
            name: "moo".into(),
            owner_kind: "Lolcow".into(),
        });
        assert_eq!(problem.reason(), "NameConflict");
        assert!(problem.message().starts_with("Service moo exists"));
        assert!(problem.name_conflict().is_some());
        let child = Child::<Service> {
            outcome: Outcome::Problem(problem),
            current: None,
        };
        assert!(child.is_held_by_another() && child.is_problem());
        let leftover = Child::<Service> {
            outcome: Outcome::Leftover,
            current: None,
        };
        assert!(leftover.is_held_by_another() && !leftover.is_problem());
    }
}
