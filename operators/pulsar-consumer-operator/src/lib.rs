//! The PulsarConsumer operator: runs a Deployment of Apache Pulsar topic consumers for each
//! `PulsarConsumer`.
//!
//! Data flow: a PulsarConsumer or its Deployment changes -> [`reconcile::reconcile`] ->
//! [`desired::desired_deployment`] builds the Deployment from the spec (pure) -> it is
//! server-side applied (no write when the cached Deployment already matches) ->
//! [`status::status`] summarises the Deployment -> the status subresource is patched if it
//! changed, with an event per announced transition ([`status::ANNOUNCED`]).
//!
//! Autoscaling (`spec.autoscaling`): a [`poll`] task per object reads the subscription's
//! backlog from the Pulsar [`admin`] API every `pollIntervalSeconds` (not more often than
//! the operator's floor) and triggers a reconcile when a reading matters -> [`scaling`]
//! hands the latest reading to [`autoscale::decide`], which turns it into a replica count
//! (pure: clamp, stabilisation window, step limits) -> that count goes into the
//! Deployment, and `status.backlog`, `desiredReplicas`, `lastScaleTime`, `ScalingActive` and
//! `ScalingLimited` describe it. The admin API is a tenant's endpoint: [`target`] decides
//! where the operator connects, [`options`] what its administrator allows beyond that.
//! [`metrics`] puts the backlog and the counts on `/metrics`.

pub mod admin;
pub mod api;
pub mod autoscale;
pub mod desired;
pub mod metrics;
pub mod options;
pub mod poll;
pub mod reconcile;
pub mod scaling;
pub mod status;
pub mod target;

#[cfg(test)]
mod fixtures;

pub use api::{PulsarConsumer, PulsarConsumerSpec, PulsarConsumerStatus};

/// Names of this operator (binary, field manager, events, metrics label).
pub const OPERATOR: shared::Operator = shared::Operator {
    name: "pulsar-consumer-operator",
    controller: "pulsarconsumer",
};
