//! The Memcached operator: runs `spec.size` memcached pods (a Deployment) and a Service for
//! each `Memcached`.
//!
//! Data flow: a Memcached, its Deployment, its Service or one of its pods changes ->
//! [`reconcile::reconcile`] (behind the `cache.example.com/finalizer` [`finalizer`]) ->
//! [`desired`] builds the Deployment and Service (pure) -> they are server-side applied
//! when they drifted -> [`status::status`] summarises the Deployment and pods -> the status
//! subresource is patched if it changed, with an event per announced transition; a failure
//! is an [`error::Error`], retried with backoff. On deletion the finalizer marks the
//! Memcached `Degraded` (`Finalizing`), emits one Normal event and lets garbage collection
//! remove the children. Installed namespace-scoped, [`release`] removes the finalizer of
//! Memcacheds being deleted in a watched namespace the operator can no longer reconcile
//! (its Role deleted with the namespace while the operator was down), so the namespace
//! does not stay Terminating.

pub mod api;
pub mod desired;
pub mod error;
pub mod finalizer;
pub mod reconcile;
pub mod release;
pub mod status;

#[cfg(test)]
mod fixtures;

pub use api::{Memcached, MemcachedSpec, MemcachedStatus};

/// Names of this operator (binary, field manager, events, metrics label).
pub const OPERATOR: shared::Operator = shared::Operator {
    name: "memcached-operator",
    controller: "memcached",
};

/// The finalizer the operator keeps on every Memcached (as in the Go original).
pub const FINALIZER: &str = "cache.example.com/finalizer";
