//! The part of `cargo xtask` the end-to-end tests share (the `xtask` binary is
//! the rest): kubeconfigs that authenticate as a ServiceAccount, so operators
//! run with exactly the RBAC that `deploy/` grants them, and the NodePorts in use.

pub mod kubeconfig;
pub mod node_ports;
pub mod simulated;
