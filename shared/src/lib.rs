//! The thin common crate of the operators in this workspace: what an operator calls, and
//! nothing else, is public, each name at one path.
//!
//! - Running: [`Operator`] describes one (its name, CRD, controller and reconcile) and
//!   `Operator::run` is its whole `main`; [`Toolkit`] is what a reconcile context gets
//!   (the client, the events, the status writer); [`Pacing`] and [`Progress`] say when an
//!   object on its way to its spec is worth another status write ([`awaiting_ready`]).
//! - Watching: [`namespaces`] (the [`Scope`](namespaces::Scope) of one controller, the
//!   reflector stores of each scope, or only what a reconcile reads of each object) and
//!   [`slim`] (what a cache keeps of a child or a pod: a bounded projection).
//! - Writing: [`children`] (the kit every reconcile writes its children through: claim,
//!   apply or scale, prune, slow-start creates, problems), [`apply`] (owner references
//!   and labels), [`ownership`] (whose a name is), [`pod_security`] (the `restricted`
//!   profile).
//! - Reporting: [`conditions`], [`events`] (what a transition announces), [`status`]
//!   (status writes the cache has not shown yet); at the root [`ErrorBackoff`] and
//!   [`Expiring`] (per-object pacing and bookkeeping), [`ObjectGauges`] and
//!   [`GaugeFamily`] (gauges an operator adds to `/metrics`), [`Error`] and
//!   [`ReconcileError`].
//!
//! The runner behind `Operator::run` (`src/runner/`) is private: it parses the command
//! line, starts logging, connects (with the optional client-side rate limit), checks the
//! CRD, serves `/metrics` and the probes on the `serving` crate's loop (HTTPS with the
//! API server's authentication and authorization with the default `secure-metrics`
//! feature), wins leader election on its own thread, and runs one kube-runtime
//! `Controller` per namespace scope, its reconciles taking turns by namespace. The
//! operators' reconcile tests run against the scripted API server of the `shared-testing`
//! crate. The data flow is in `docs/design.md`.

// Public is what operators call; the rest says `pub(crate)` (`tests/public_surface.rs`
// checks the public part is used, at one path each).
#![warn(unreachable_pub)]

// The reconcile kit: what a reconcile calls.
pub mod apply;
pub mod children;
pub mod conditions;
pub mod events;
pub mod namespaces;
pub mod ownership;
pub mod pod_security;
pub mod slim;
pub mod status;

mod backoff;
mod error;
mod expiring;
// The runner behind `Operator::run`: private.
mod runner;

pub use backoff::{ErrorBackoff, Progress};
pub use error::{Error, ReconcileError};
pub use expiring::Expiring;
pub use runner::{GaugeFamily, ObjectGauges, Operator, Pacing, Toolkit, awaiting_ready};
