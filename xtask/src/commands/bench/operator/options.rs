//! What `cargo xtask bench operator` measures: its options, the operators and
//! what one object of each is, and the standard set.

use clap::{Args, ValueEnum};
use kube::core::ApiResource;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;

/// Options of `cargo xtask bench operator`.
#[derive(Args, Clone)]
pub struct OperatorArgs {
    /// The operator to measure.
    #[arg(long, value_enum, default_value_t = Operator::Podset)]
    pub(super) operator: Operator,
    /// Objects created at once (N); Lolcows at most 2,768, one NodePort (30000-32767) each.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=30_000))]
    pub(super) objects: u32,
    /// Replicas of each object (PodSet, Memcached, PulsarConsumer; a Lolcow has one pod).
    #[arg(long, default_value_t = DEFAULT_REPLICAS, value_parser = clap::value_parser!(i32).range(1..=20))]
    pub(super) replicas: i32,
    /// The quiet window after convergence, in seconds, during which the operator must not write.
    #[arg(long, default_value_t = 60)]
    pub(super) settle_seconds: u64,
    /// Development mode: a 10 s quiet window.
    #[arg(long)]
    pub(super) quick: bool,
    /// Run the standard set instead (every operator at N=100; PodSet and Memcached
    /// also at N=1000); `--quick` applies.
    #[arg(long)]
    pub(super) standard: bool,
    /// Pods that belong to nobody, created in the (first) namespace before the operator
    /// starts.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=20_000))]
    pub(super) stranger_pods: u32,
    /// Namespaces the objects are spread over, round robin (the operator watches them
    /// all), as tenants have them: what the cluster does for a namespace (the controller
    /// manager's Endpoints and EndpointSlice controllers match every pod against every
    /// Service of its namespace) grows with the objects per namespace, not in all.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(super) namespaces: u32,
    /// Extra environment of the operator process, e.g. `MALLOC_ARENA_MAX=2` (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub(super) env: Vec<String>,
    /// Rounds of the reaction phase: one object at rest scaled by one replica (or its
    /// spec edited where the kind does not scale), timed to the operator's first child
    /// write and to the status showing it; 0 skips the phase.
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub(super) reaction_rounds: u32,
    /// Also run the same phases against the seed's Go original (every kind: PodSet,
    /// Memcached, Lolcow and PulsarConsumer, on controller-runtime), after the Rust
    /// operator, in a namespace of its own once the Rust run's is gone, its children on
    /// the same image; one table compares them (`target/bench/side-by-side.md`). The Go
    /// Lolcow and PulsarConsumer write no status to read Ready from: theirs is read from
    /// their Deployments (and the Lolcow's Service), as the record's `readiness` says.
    /// PATH is its binary; without it, the bench builds `../shared/go-ref` (beside the
    /// repository) into `~/.cache/rust-operators/go-ref/` (`go build`, outside the
    /// repository).
    #[arg(long, value_name = "PATH")]
    #[allow(clippy::option_option)]
    pub(super) go_ref: Option<Option<PathBuf>>,
    /// Skip the change phase (every spec changed at once): for runs that measure how the
    /// cost grows with N (creation, the quiet window, the restart), where the change
    /// would double the run. The record says so, and the report shows `-` for it.
    #[arg(long)]
    pub(super) skip_change: bool,
    /// Measure this Rust operator binary instead of building the workspace's (a static
    /// release build of another commit, for a bisect of a regression). The run's record
    /// names it.
    #[arg(long, value_name = "PATH")]
    pub(super) binary: Option<PathBuf>,
}

impl OperatorArgs {
    /// The most pods the run holds at once: every object's pods, before or after the
    /// change phase, and the stranger pods.
    pub(super) fn peak_pods(&self) -> u64 {
        let op = self.operator;
        let mut per_object = op.pods_per_object(self.replicas);
        if !self.skip_change {
            per_object = per_object.max(op.pods_per_object(op.changed_replicas(self.replicas)));
        }
        u64::from(self.objects) * u64::try_from(per_object).unwrap_or(0)
            + u64::from(self.stranger_pods)
    }
}

impl Default for OperatorArgs {
    fn default() -> Self {
        Self {
            operator: Operator::Podset,
            objects: 100,
            replicas: DEFAULT_REPLICAS,
            settle_seconds: 60,
            quick: false,
            standard: false,
            stranger_pods: 0,
            namespaces: 1,
            env: Vec::new(),
            reaction_rounds: 12,
            go_ref: None,
            binary: None,
            skip_change: false,
        }
    }
}

impl OperatorArgs {
    /// The quiet window.
    pub(super) fn settle(&self) -> Duration {
        Duration::from_secs(if self.quick { 10 } else { self.settle_seconds })
    }
}

/// The operators, as named on the command line.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
pub enum Operator {
    /// `podset-operator` (PodSet: pods created by the operator).
    Podset,
    /// `memcached-operator` (Memcached: a Deployment and a Service).
    Memcached,
    /// `lolcow-operator` (Lolcow: a Deployment and a NodePort Service).
    Lolcow,
    /// `pulsar-consumer-operator` (PulsarConsumer: a Deployment).
    PulsarConsumer,
}

impl Operator {
    /// Every operator, in the order of the standard set.
    pub(super) const ALL: [Operator; 4] = [
        Operator::Podset,
        Operator::Memcached,
        Operator::Lolcow,
        Operator::PulsarConsumer,
    ];

    /// Its entry in the workspace's list of operators.
    pub(super) fn kind(self) -> &'static xtask::support::operators::Kind {
        use xtask::support::operators::{LOLCOW, MEMCACHED, PODSET, PULSAR_CONSUMER};
        match self {
            Operator::Podset => &PODSET,
            Operator::Memcached => &MEMCACHED,
            Operator::Lolcow => &LOLCOW,
            Operator::PulsarConsumer => &PULSAR_CONSUMER,
        }
    }

    /// The command-line name, used in file names.
    pub(super) fn name(self) -> &'static str {
        self.kind().short
    }

    /// The crate, binary and `deploy/` folder.
    pub(super) fn crate_name(self) -> &'static str {
        self.kind().operator
    }

    /// Its custom resource.
    pub(super) fn api_resource(self) -> ApiResource {
        self.kind().api_resource()
    }

    /// Whether its kind has a scale subresource (`kubectl scale` works on it).
    pub(super) fn has_scale(self) -> bool {
        self != Operator::Lolcow
    }

    /// Pods one object runs with `replicas`.
    pub(super) fn pods_per_object(self, replicas: i32) -> i32 {
        match self {
            Operator::Lolcow => 1,
            _ => replicas,
        }
    }

    /// The `i`-th object; `port` is the Lolcow's NodePort.
    pub(super) fn object(self, name: &str, replicas: i32, port: i32) -> Value {
        let spec = match self {
            Operator::Podset => json!({ "replicas": replicas }),
            Operator::Memcached => json!({ "size": replicas, "containerPort": 11211 }),
            Operator::Lolcow => json!({ "port": port, "greeting": "Hello from the bench" }),
            Operator::PulsarConsumer => json!({
                "serverAddress": "pulsar://localhost:6650",
                "topic": format!("bench-{name}"),
                "subscriptionName": "bench",
                "replicas": replicas,
            }),
        };
        self.kind().manifest(name, spec)
    }

    /// The spec change of phase 4 (merge patch) and what it is, for the report.
    pub(super) fn change(self, replicas: i32) -> (Value, String) {
        let to = self.changed_replicas(replicas);
        match self {
            Operator::Podset | Operator::PulsarConsumer => (
                json!({ "spec": { "replicas": to } }),
                format!("replicas {replicas} -> {to}"),
            ),
            Operator::Memcached => (
                json!({ "spec": { "size": to } }),
                format!("size {replicas} -> {to}"),
            ),
            Operator::Lolcow => (
                json!({ "spec": { "greeting": "Moo again from the bench" } }),
                "new greeting (rolls the Deployment)".to_owned(),
            ),
        }
    }

    /// The image of the pods of its children when they run an app of this workspace
    /// (Lolcow: `lolcow-web`, PulsarConsumer: `pulsar-consumer`), as the Rust operator in
    /// the bench would run it: from `--env <VAR>=<image>` (`env`), else from the bench's
    /// own environment (`inherited`: the value of `<VAR>` there), else `<app>:latest`, the
    /// operator's default; and the variable that names it (`LOLCOW_IMAGE`...). Empty
    /// values count as unset, as the operators read them. `None` for the other kinds.
    pub(super) fn workload_image(
        self,
        env: &[String],
        inherited: Option<String>,
    ) -> Option<(&'static str, String)> {
        let workload = self.kind().workload.as_ref()?;
        let given = env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .filter(|(k, _)| *k == workload.env)
            .map(|(_, v)| v.trim().to_owned())
            .next_back();
        let image = given
            .or(inherited.map(|v| v.trim().to_owned()))
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| format!("{}:latest", workload.app));
        Some((workload.env, image))
    }

    /// The most objects of this kind one run can have: a Lolcow holds a NodePort of its
    /// own, of the 2,768 in 30000-32767.
    pub(super) fn max_objects(self) -> u32 {
        match self {
            Operator::Lolcow => u32::try_from(LAST_NODE_PORT - FIRST_NODE_PORT + 1).unwrap_or(0),
            _ => u32::MAX,
        }
    }

    /// Replicas after [`Operator::change`]: one fewer, or one more from a single replica.
    pub(super) fn changed_replicas(self, replicas: i32) -> i32 {
        match self {
            Operator::Lolcow => replicas,
            _ if replicas > 1 => replicas - 1,
            _ => replicas + 1,
        }
    }

    /// Writes one object needs at least to become Ready: its children's
    /// creates or applies, the finalizer (Memcached), the two status changes
    /// every object goes through (created: `Progressing`; then `Ready`) and
    /// the two events the contract asks for on those condition transitions.
    pub(super) fn minimum_writes(self, replicas: i32) -> u64 {
        let children = match self {
            Operator::Podset => u64::try_from(replicas).unwrap_or(0),
            Operator::Memcached => 2 + 1,
            Operator::Lolcow => 2,
            Operator::PulsarConsumer => 1,
        };
        children + 2 + 2
    }
}

/// Replicas of each object unless `--replicas` says otherwise.
pub(super) const DEFAULT_REPLICAS: i32 = 3;

/// The first port of the cluster's NodePort range (`--service-node-port-range` of the
/// local cluster, the Kubernetes default 30000-32767).
pub(super) const FIRST_NODE_PORT: i32 = 30000;
/// Its last port.
pub(super) const LAST_NODE_PORT: i32 = 32767;

/// The standard set: (operator, N, stranger pods).
pub(super) fn standard_set() -> Vec<(Operator, u32, u32)> {
    let mut set: Vec<(Operator, u32, u32)> = Operator::ALL.iter().map(|o| (*o, 100, 0)).collect();
    set.push((Operator::Podset, 1000, 0));
    set.push((Operator::Memcached, 1000, 0));
    set.push((Operator::Podset, 100, 5000));
    set
}

/// The run's name, used for its file: `<operator>-<N>`, `-x<R>` when each object has
/// R replicas other than the default 3 (a Lolcow has no replicas), `-strangers-<M>`
/// with them, `-namespaces-<K>` when spread over more than one. Runs that differ in any
/// of these keep files of their own (a cost curve at 1 replica beside the standard set).
pub(super) fn run_name(args: &OperatorArgs) -> String {
    let mut name = format!("{}-{}", args.operator.name(), args.objects);
    if args.replicas != DEFAULT_REPLICAS && args.operator != Operator::Lolcow {
        name.push_str(&format!("-x{}", args.replicas));
    }
    if args.stranger_pods > 0 {
        name.push_str(&format!("-strangers-{}", args.stranger_pods));
    }
    if args.namespaces > 1 {
        name.push_str(&format!("-namespaces-{}", args.namespaces));
    }
    name
}
