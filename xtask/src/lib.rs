//! The library half of `cargo xtask`: the helpers its commands (the `xtask` binary,
//! `src/commands/`) and the end-to-end tests (`tests/`) share, all under [`support`]:
//! running kubectl and other commands, kubeconfigs that authenticate as a
//! ServiceAccount, so operators run with exactly the RBAC that `deploy/` grants them,
//! operators and the consumer app as local processes, the NodePorts in use, the API
//! requests an operator logged (the bench counts them; the tests derive the RBAC an
//! operator needs from them), the metric names of PromQL queries (the dashboards'
//! test), the workspace version and the machine's packages.

pub mod support;
