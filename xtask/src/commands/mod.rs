//! One module per `cargo xtask` subcommand, named after it (`check-docs` is
//! [`check_docs`]); a folder only where a command has parts. What several commands
//! and the end-to-end tests share is the library's, under `xtask::support`.

pub mod actionlint;
pub mod bench;
pub mod charts;
pub mod check_docs;
pub mod cluster;
pub mod crds;
pub mod demo;
/// `deploy`, `undeploy` and `run`.
pub mod deploy;
pub mod image;
pub mod installers;
pub mod lint_alerts;
pub mod lint_manifests;
pub mod new;
pub mod pulsar;
pub mod release;
pub mod test;
pub mod tool;
