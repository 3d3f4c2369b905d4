//! The `memcached-operator` binary: wiring only (the command line is `shared`'s).

use memcached_operator::{
    OPERATOR,
    reconcile::{Context, controller, reconcile},
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Ok(OPERATOR
        .run("MEMCACHED_IMAGE", Context::new, controller, reconcile)
        .await?)
}
