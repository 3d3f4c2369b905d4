//! The Lolcow operator: serves a web page of a cow saying `spec.greeting` on NodePort
//! `spec.port` of every node.
//!
//! Data flow: a Lolcow, its Deployment or its Service changes -> [`reconcile::reconcile`]
//! reads the cached children -> [`desired`] builds the Deployment and Service it wants
//! (pure) -> they are server-side applied when they differ -> [`status::status`] describes
//! what is served -> the status subresource is patched if it changed, with an event when
//! `Ready` changes.

pub mod api;
pub mod desired;
pub mod reconcile;
pub mod status;

#[cfg(test)]
mod fixtures;

pub use api::{Lolcow, LolcowSpec, LolcowStatus};

/// Names of this operator (binary, field manager, events, metrics label).
pub const OPERATOR: shared::Operator = shared::Operator {
    name: "lolcow-operator",
    controller: "lolcow",
};
