//! The thin common crate of the operators in this workspace.
//!
//! Everything every operator needs and nothing any single one needs alone. The data flow
//! of a running operator, module by module:
//!
//! [`cli`] parses the command line -> [`telemetry`] starts logging -> [`run`] connects,
//! checks the CRD, serves [`metrics`] and [`health`], wins [`leader`] election and starts
//! one kube-runtime `Controller` per [`namespaces`] scope -> the operator's reconcile builds
//! desired children and writes them with [`apply`] -> [`conditions`] summarise what it
//! observed -> [`events`] announce condition transitions -> [`backoff`] paces retries.

pub mod apply;
pub mod backoff;
pub mod cli;
pub mod conditions;
pub mod error;
pub mod events;
pub mod health;
pub mod leader;
pub mod metrics;
pub mod metrics_auth;
pub mod namespaces;
pub mod ownership;
pub mod pod_security;
pub mod process_metrics;
pub mod run;
pub mod telemetry;

pub use cli::{Cli, Command, RunArgs};
pub use error::{Error, ReconcileError};
pub use namespaces::{Scope, WatchNamespaces};
pub use run::{Operator, Toolkit};
