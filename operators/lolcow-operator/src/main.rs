//! The `lolcow-operator` binary: wiring only (the command line is `shared`'s).

use lolcow_operator::{
    OPERATOR,
    reconcile::{Context, controller, reconcile},
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Ok(OPERATOR
        .run("LOLCOW_IMAGE", Context::new, controller, reconcile)
        .await?)
}
