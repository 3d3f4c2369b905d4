//! The PodSet operator: keeps `spec.replicas` pods of each `PodSet` running.
//!
//! Data flow: a PodSet or one of its pods changes -> [`reconcile::reconcile`] reads what
//! the [`pods`] index keeps of the pods it controls (and puts our [`labels`] back on those
//! that lost them) -> [`desired::plan`] decides what to create or delete (pure) -> pods
//! are created/deleted (tracked by [`expectations`] until the watch sees them) ->
//! [`status::status`] summarises the pods -> the status subresource is patched if it
//! changed, with an event per announced transition ([`status::ANNOUNCED`]).

pub mod api;
pub mod desired;
pub mod expectations;
pub mod labels;
pub mod pods;
pub mod reconcile;
pub mod status;
pub mod strays;

#[cfg(test)]
mod fixtures;

pub use api::{PodSet, PodSetSpec, PodSetStatus};

/// Names of this operator (binary, field manager, events, metrics label).
pub const OPERATOR: shared::Operator = shared::Operator {
    name: "podset-operator",
    controller: "podset",
};
