//! The `podset-operator` binary: wiring only (the command line is `shared`'s).

use podset_operator::{
    OPERATOR,
    reconcile::{Context, controller, reconcile},
};

// One thread: an operator's work comes in small pieces (watch events, short reconciles)
// that one core keeps up with; a pool of workers spent CPU waking each other to hand them on.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    Ok(OPERATOR
        .run("PODSET_IMAGE", Context::new, controller, reconcile)
        .await?)
}
