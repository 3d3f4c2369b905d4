//! The thin common crate of the operators in this workspace.
//!
//! What an operator calls, and nothing else, is public:
//! - [`run`]: [`Operator`] describes one (its name, CRD, controller and reconcile) and
//!   `Operator::run` is its whole `main`; [`Toolkit`] is what a reconcile gets (the
//!   client, the recorder of events, the status writer); [`Pacing`] is what the runner
//!   asks the reconcile context before it folds a trigger into the debounce.
//! - [`namespaces`]: the scopes an operator watches (`--watch-namespace`) and the
//!   reflector stores of each ([`Scope`], [`namespaces::ScopedStores`]), or only what a
//!   reconcile reads of each object ([`namespaces::ScopedIndex`]).
//! - The reconcile kit: [`apply`] (server-side apply, owner references), [`ownership`]
//!   (never adopting a stranger's child), [`conditions`], [`status`] (status patches
//!   that remove what left), [`events`] (what a transition announces), [`slim`] (caches
//!   of pods without what no reconcile reads), [`pod_security`] (the `restricted`
//!   profile), and at the root: [`ErrorBackoff`] and [`Expiring`] (per-object pacing
//!   and bookkeeping), [`ObjectGauges`] (per-object gauges an operator adds to
//!   `/metrics`), [`Error`] and [`ReconcileError`].
//!
//! The runner behind `Operator::run` is private: it parses the command line, starts
//! logging, connects (with the optional client-side rate limit), checks the CRD, serves
//! `/metrics` and the probes on the `serving` crate's loop (HTTPS with the API server's
//! authentication and authorization with the default `secure-metrics` feature), wins
//! leader election on its own thread, and runs one kube-runtime `Controller` per
//! namespace scope. The operators' reconcile tests run against the scripted API server
//! of the `shared-testing` crate. The data flow is in
//! `docs/design.md`.

pub mod apply;
mod backoff;
pub mod children;
mod cli;
mod client;
pub mod conditions;
mod error;
pub mod events;
mod expiring;
mod fair;
mod health;
mod leader;
mod metrics;
#[cfg(feature = "secure-metrics")]
mod metrics_auth;
pub mod namespaces;
pub mod ownership;
pub mod pod_security;
mod process_metrics;
mod rate_limit;
pub mod run;
pub mod slim;
pub mod status;
mod telemetry;
mod toolkit;

pub use backoff::ErrorBackoff;
pub use error::{Error, ReconcileError};
pub use expiring::Expiring;
pub use metrics::{GaugeFamily, Metrics, ObjectGauges};
pub use namespaces::{Scope, WatchNamespaces};
pub use run::{Operator, Pacing, Progress, Toolkit};
