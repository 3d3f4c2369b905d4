//! The `podset-operator` binary: wiring only (the command line is `shared`'s).

use podset_operator::{
    OPERATOR,
    reconcile::{Context, controller, reconcile},
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Ok(OPERATOR
        .run("PODSET_IMAGE", Context::new, controller, reconcile)
        .await?)
}
