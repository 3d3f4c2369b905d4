//! The `podset-operator` binary: wiring only.

use podset_operator::{OPERATOR, PodSet, reconcile};
use shared::{Cli, Command};

// One thread: an operator's work comes in small pieces (watch events, short reconciles)
// that one core keeps up with; a pool of workers spent CPU waking each other to hand them on.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse_for(OPERATOR.name);
    match cli.subcommand() {
        Command::Crd => OPERATOR.print_crd::<PodSet>()?,
        Command::Run => {
            let default_image = std::env::var("PODSET_IMAGE").ok();
            OPERATOR
                .run(
                    cli.run,
                    |toolkit| reconcile::Context::new(toolkit, default_image),
                    reconcile::controller,
                    reconcile::reconcile,
                )
                .await?;
        }
    }
    Ok(())
}
