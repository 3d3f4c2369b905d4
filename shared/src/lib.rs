//! The thin common crate of the operators in this workspace.
//!
//! Everything every operator needs and nothing any single one needs alone. The data flow
//! of a running operator, module by module:
//!
//! [`cli`] parses the command line -> [`telemetry`] starts logging -> [`run`] connects,
//! checks the CRD, serves [`metrics`] and [`health`], wins [`leader`] election and starts
//! one kube-runtime `Controller` per [`namespaces`] scope -> the operator's reconcile builds
//! desired children and writes them with [`apply`] -> [`conditions`] summarise what it
//! observed -> [`status`] writes them and [`events`] announce their transitions ->
//! [`backoff`] paces retries. With `--kube-api-qps`, every API request of the kube client
//! waits for a token of [`rate_limit`]'s bucket; it is sent again when the API server
//! answers 429 Too Many Requests.
//!
//! [`serving`] is the one HTTP/1 loop of every server here (with limits and timeouts);
//! it is all the crate has without its default `operator` feature, which is how the
//! lolcow web app uses it without linking kube.

#[cfg(feature = "operator")]
pub mod apply;
#[cfg(feature = "operator")]
pub mod backoff;
#[cfg(feature = "operator")]
pub mod cli;
#[cfg(feature = "operator")]
pub mod conditions;
#[cfg(feature = "operator")]
pub mod error;
#[cfg(feature = "operator")]
pub mod events;
#[cfg(feature = "operator")]
pub mod expiring;
#[cfg(feature = "operator")]
pub mod health;
#[cfg(feature = "operator")]
pub mod leader;
#[cfg(feature = "operator")]
pub mod metrics;
#[cfg(feature = "operator")]
pub mod metrics_auth;
#[cfg(feature = "operator")]
pub mod namespaces;
#[cfg(feature = "operator")]
pub mod ownership;
#[cfg(feature = "operator")]
pub mod pod_security;
#[cfg(feature = "operator")]
pub mod process_metrics;
#[cfg(feature = "operator")]
pub mod rate_limit;
#[cfg(feature = "operator")]
pub mod run;
pub mod serving;
#[cfg(feature = "operator")]
pub mod slim;
#[cfg(feature = "operator")]
pub mod status;
#[cfg(feature = "operator")]
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;

#[cfg(feature = "operator")]
pub use cli::{Cli, Command, RunArgs};
#[cfg(feature = "operator")]
pub use error::{Error, ReconcileError};
#[cfg(feature = "operator")]
pub use namespaces::{Scope, WatchNamespaces};
#[cfg(feature = "operator")]
pub use run::{Operator, Toolkit};
