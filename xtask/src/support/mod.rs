//! The helpers `cargo xtask`'s commands and the end-to-end tests share, one
//! module per thing they hold.

pub mod cmd;
pub mod console;
pub mod http;
pub mod kubeconfig;
pub mod kubectl;
pub mod kustomize;
pub mod local_consumer;
pub mod local_operator;
pub mod logged_requests;
pub mod machine_packages;
pub mod node_ports;
pub mod openssl;
pub mod operators;
pub mod paths;
pub mod process_group;
pub mod promql;
pub mod service_monitor;
pub mod simulated;
pub mod workspace_version;
