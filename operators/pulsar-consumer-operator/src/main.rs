//! The `pulsar-consumer-operator` binary: wiring only (the command line is `shared`'s).

use pulsar_consumer_operator::{
    OPERATOR,
    reconcile::{Context, IMAGE_ENV, controller, reconcile},
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Ok(OPERATOR
        .run(IMAGE_ENV, Context::new, controller, reconcile)
        .await?)
}
