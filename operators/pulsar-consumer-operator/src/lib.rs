//! The PulsarConsumer operator: runs a Deployment of Apache Pulsar topic consumers for each
//! `PulsarConsumer`.
//!
//! Data flow: a PulsarConsumer or its Deployment changes -> [`reconcile::reconcile`] ->
//! [`desired::desired_deployment`] builds the Deployment from the spec (pure) -> it is
//! server-side applied (no write when the cached Deployment already matches) ->
//! [`desired::status`] summarises the Deployment -> the status subresource is patched if it
//! changed, with an event per `Ready` transition.

pub mod api;
pub mod desired;
pub mod reconcile;

pub use api::{PulsarConsumer, PulsarConsumerSpec, PulsarConsumerStatus};

/// Names of this operator (binary, field manager, events, metrics label).
pub const OPERATOR: shared::Operator = shared::Operator {
    name: "pulsar-consumer-operator",
    controller: "pulsarconsumer",
};
