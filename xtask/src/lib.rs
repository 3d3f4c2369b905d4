//! The part of `cargo xtask` the end-to-end tests share (the `xtask` binary is
//! the rest): running kubectl and other commands, kubeconfigs that authenticate as a
//! ServiceAccount, so operators run with exactly the RBAC that `deploy/` grants them,
//! the NodePorts in use, the API requests an operator logged (the bench counts
//! them; the tests derive the RBAC an operator needs from them), and the metric names of
//! PromQL queries (the dashboards' test).

pub mod cmd;
pub mod http;
pub mod kubeconfig;
pub mod kubectl;
pub mod kustomize;
pub mod local_operator;
pub mod node_ports;
pub mod openssl;
pub mod operators;
pub mod paths;
pub mod process_group;
pub mod promql;
pub mod pulsar_consumer;
pub mod requests;
pub mod simulated;
