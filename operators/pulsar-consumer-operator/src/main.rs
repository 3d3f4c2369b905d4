//! The `pulsar-consumer-operator` binary: wiring only (the command line is `shared`'s).

use pulsar_consumer_operator::{
    OPERATOR,
    reconcile::{Context, IMAGE_ENV, controller, reconcile},
};

// One thread: an operator's work comes in small pieces (watch events, short reconciles)
// that one core keeps up with; a pool of workers spent CPU waking each other to hand them on.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    Ok(OPERATOR
        .run(IMAGE_ENV, Context::new, controller, reconcile)
        .await?)
}
