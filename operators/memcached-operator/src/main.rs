//! The `memcached-operator` binary: wiring only.

use memcached_operator::{Memcached, OPERATOR, reconcile};
use shared::{Cli, Command};

// One thread: an operator's work comes in small pieces (watch events, short reconciles)
// that one core keeps up with; a pool of workers spent CPU waking each other to hand them on.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse_for(OPERATOR.name);
    match cli.subcommand() {
        Command::Crd => OPERATOR.print_crd::<Memcached>()?,
        Command::Run => {
            let image = std::env::var("MEMCACHED_IMAGE").ok();
            OPERATOR
                .run(
                    cli.run,
                    |toolkit| reconcile::Context::new(toolkit, image),
                    reconcile::controller,
                    reconcile::reconcile,
                )
                .await?;
        }
    }
    Ok(())
}
