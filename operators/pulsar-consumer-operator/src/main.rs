//! The `pulsar-consumer-operator` binary: wiring only (the command line is `shared`'s; the
//! operator's own options are environment variables, `options`).

use anyhow::anyhow;
use pulsar_consumer_operator::{
    OPERATOR,
    options::Options,
    reconcile::{Context, IMAGE_ENV, controller, reconcile},
};

// One thread: an operator's work comes in small pieces (watch events, short reconciles)
// that one core keeps up with; a pool of workers spent CPU waking each other to hand them on.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let options = Options::from_env().map_err(|e| anyhow!(e))?;
    let context = |toolkit, image| {
        tracing::info!(
            min_poll_interval_seconds = options.min_poll_interval.as_secs(),
            max_concurrent_polls = options.max_concurrent_polls,
            targets = ?options.targets,
            "admin API reads"
        );
        Context::with_options(toolkit, image, &options)
    };
    Ok(OPERATOR
        .run(IMAGE_ENV, context, controller, reconcile)
        .await?)
}
