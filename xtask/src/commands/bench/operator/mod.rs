//! `cargo xtask bench operator`: scale, speed and memory of one operator on
//! the local cluster; `--standard` (and `cargo xtask bench --all`) runs the
//! standard set: every operator with 100 objects, PodSet and Memcached also
//! with 1,000, and PodSet with 100 beside 5,000 unrelated pods.
//!
//! One run: the operator's static release binary (the one its image ships)
//! runs on this machine as in the end-to-end tests (its ServiceAccount's
//! token, `WATCH_NAMESPACE` = one fresh bench namespace), and the bench, as a plain client with its own watches on
//! the custom resources and the pods:
//! 1. reads the idle memory once the operator is ready (no objects);
//! 2. creates N objects at once and times each one to `Ready` (the `Ready`
//!    condition `True` for the current generation), until every object is
//!    Ready and the namespace holds exactly the pods wanted;
//! 3. watches a quiet window (60 s, `--quick` 10 s): the operator must write
//!    nothing;
//! 4. changes the spec of every object (replicas - 1, or a new greeting) and
//!    times the re-convergence; 5. deletes them all and times until every
//!    child is gone.
//!
//! `--stranger-pods M` first fills the namespace with M pods that are nobody's
//! (what any busy namespace holds): an operator that watches only what can be its own
//! shows the same figures with and without them.
//!
//! Throughout: peak memory (`VmHWM`), CPU time, pods ever seen (extra pods
//! beyond the desired count must be 0) and every API request the operator
//! made, by verb and phase (counted at the client; see [`requests`]).
//! Results: `target/bench/<operator>-<N>.json` (`-x<R>` at other than 3 replicas: see
//! [`options::run_name`]), and from every such file `target/bench/operators.md` and
//! `target/bench/ready-over-time.svg`; where one kind was run at several N alike (`--objects
//! 1000`, `10000`, `30000` at `--replicas 1`), `target/bench/cost-curve.md` and
//! `target/bench/memory-per-object.svg` (see [`cost`]).
//!
//! `--go-ref` then runs the seed's Go original of the same kind (all four: PodSet,
//! Memcached, Lolcow and PulsarConsumer, on controller-runtime; see [`go_ref`]) through the
//! same phases in a namespace of its own, once the Rust run's is gone, its children on the
//! same image: `target/bench/<operator>-<N>-go.json` and `target/bench/side-by-side.md`.
//! Where a Go original writes no status to read Ready from (Lolcow, PulsarConsumer), Ready
//! is read from its children, and the record's `readiness` says how.

mod chart;
mod cost;
mod go_ref;
mod options;
mod phases;
mod process;
mod procfs;
mod proxy;
mod reaction;
mod record;
pub(crate) mod report;
mod run;
mod session;
mod timing;
mod watch;

pub use options::{Operator, OperatorArgs};

use crate::commands::bench::common::out_dir;
use crate::commands::cluster;
use anyhow::{Context, Result, ensure};
use options::{FIRST_NODE_PORT, LAST_NODE_PORT, run_name, standard_set};
use process::{Launcher, WorkloadImage};
use std::fs;
use std::path::{Path, PathBuf};
use watch::StatusShape;
use xtask::support::kubectl::Kubectl;
use xtask::support::local_operator;
use xtask::{say, say_err};

/// `cargo xtask bench operator ...`.
pub fn run(args: &OperatorArgs) -> Result<()> {
    if args.standard {
        return run_standard(args);
    }
    let runtime = runtime()?;
    let result = bench_and_record(&runtime, args);
    report::write_summary()?;
    result
}

/// The standard set with default options (for `cargo xtask bench --all`).
pub fn run_all() -> Result<()> {
    run_standard(&OperatorArgs::default())
}

fn run_standard(base: &OperatorArgs) -> Result<()> {
    let runtime = runtime()?;
    let mut failed = Vec::new();
    for (operator, objects, stranger_pods) in standard_set() {
        let args = OperatorArgs {
            operator,
            objects,
            stranger_pods,
            standard: false,
            ..base.clone()
        };
        if let Err(e) = bench_and_record(&runtime, &args) {
            say_err!(
                "bench operator: {} N={objects} failed: {e:#}",
                operator.name()
            );
            failed.push(format!("{}: {e:#}", run_name(&args)));
        }
    }
    let summary = report::write_summary()?;
    say!("{summary}");
    ensure!(
        failed.is_empty(),
        "some runs failed:\n{}",
        failed.join("\n")
    );
    Ok(())
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

/// The Rust operator's run, then with `--go-ref` the Go original's, each recorded.
fn bench_and_record(runtime: &tokio::runtime::Runtime, args: &OperatorArgs) -> Result<()> {
    let op = args.operator;
    ensure!(
        args.objects <= op.max_objects(),
        "--objects {}: every {} holds a NodePort of {FIRST_NODE_PORT}-{LAST_NODE_PORT}, so a \
         run has at most {}: lower --objects",
        args.objects,
        op.kind().kind,
        op.max_objects()
    );
    // Found (or built) first: a missing Go original fails the command at once.
    let go = match &args.go_ref {
        Some(path) => Some(go_ref::binary(path.as_deref())?),
        None => None,
    };
    let rust_namespaces = bench_rust(runtime, args)?;
    if let Some(binary) = go {
        bench_go(runtime, args, binary, &rust_namespaces)?;
    }
    Ok(())
}

/// The image the children's pods of `args`' operator run in the bench, the same for the
/// Rust operator and the Go original (see [`Operator::workload_image`]).
fn workload(args: &OperatorArgs) -> Option<WorkloadImage> {
    let op = args.operator;
    let var = op.kind().workload.as_ref()?.env;
    let (env, image) = op.workload_image(&args.env, std::env::var(var).ok())?;
    Some(WorkloadImage {
        image,
        env,
        go_flag: go_ref::image_flag(op)?,
    })
}

/// One run of the Rust operator, recorded in `target/bench/<run>.json`; returns its
/// namespaces (being deleted).
fn bench_rust(runtime: &tokio::runtime::Runtime, args: &OperatorArgs) -> Result<Vec<String>> {
    let op = args.operator;
    say!(
        "==> bench operator: {} with {} objects ({} replicas){}{}",
        op.name(),
        args.objects,
        args.replicas,
        if args.stranger_pods > 0 {
            format!(", beside {} stranger pods", args.stranger_pods)
        } else {
            String::new()
        },
        if args.namespaces > 1 {
            format!(", in {} namespaces", args.namespaces)
        } else {
            String::new()
        }
    );
    // The binary the image ships (static, release): what runs in a cluster, so what
    // is measured. It maps no shared libraries, which are 2 MiB of a dynamic build's RSS.
    let binary = match &args.binary {
        Some(given) => {
            ensure!(
                given.is_file(),
                "--binary {}: no such file",
                given.display()
            );
            given.clone()
        }
        None => crate::commands::image::build_binary(op.crate_name())?,
    };
    ensure!(binary.is_file(), "{} was not built", binary.display());
    let kubeconfig = cluster::up()?;
    cluster::ensure_simulated_nodes(args.peak_pods())?;
    // `kubectl apply -k deploy/<operator>` (CRD, RBAC...), as the tests do.
    local_operator::install(&admin_kubectl(&kubeconfig), op.crate_name(), "bench")?;
    let sa_kubeconfig = service_account_kubeconfig(op, &kubeconfig)?;
    let proxy_kubeconfig = proxy_kubeconfig_path(op, "")?;
    let result = runtime.block_on(async {
        let client = xtask::support::kubeconfig::client_from(&kubeconfig).await?;
        // Through the counting proxy, as the Go original: the same hop, the same count,
        // and no request log to write. The proxy sends on with the ServiceAccount's token.
        let launcher = Launcher::Rust {
            binary,
            proxy: counting_proxy(&sa_kubeconfig, &proxy_kubeconfig).await?,
            kubeconfig: proxy_kubeconfig.clone(),
            workload: workload(args),
        };
        Ok::<_, anyhow::Error>(run::bench(args, &launcher, StatusShape::Conditions, &client).await)
    });
    let _ = fs::remove_file(&sa_kubeconfig);
    let _ = fs::remove_file(&proxy_kubeconfig);
    let (namespaces, result) = result?;
    record(&result?, &run_name(args))?;
    Ok(namespaces)
}

/// One run of the Go original (`-controller <controller>`), recorded in
/// `target/bench/<run>-go.json`, once `after` (the Rust run's namespaces, being deleted)
/// are gone: the Go original starts on a cluster as quiet as the Rust operator did, and
/// no NodePort of theirs is still held. The counting proxy sends its requests on with
/// the admin credentials: the Rust operators' RBAC in `deploy/` is not written for it.
fn bench_go(
    runtime: &tokio::runtime::Runtime,
    args: &OperatorArgs,
    binary: PathBuf,
    after: &[String],
) -> Result<()> {
    let op = args.operator;
    let controller = go_ref::controller(op);
    say!(
        "==> bench operator: the Go original of {} ({}) with {} objects ({} replicas)",
        op.name(),
        binary.display(),
        args.objects,
        args.replicas
    );
    let kubeconfig = cluster::up()?;
    cluster::ensure_simulated_nodes(args.peak_pods())?;
    local_operator::install(&admin_kubectl(&kubeconfig), op.crate_name(), "bench")?;
    let shape = go_ref::status_shape(op);
    let proxy_kubeconfig = proxy_kubeconfig_path(op, "-go")?;
    let result = runtime.block_on(async {
        let client = xtask::support::kubeconfig::client_from(&kubeconfig).await?;
        let started = std::time::Instant::now();
        // As long as a phase of the run may take.
        let timeout = std::time::Duration::from_secs(180 + u64::from(args.objects) / 2);
        if run::wait_gone(&client, after, timeout).await? {
            say!(
                "    the Rust run's namespace gone after {:.1}s",
                started.elapsed().as_secs_f64()
            );
        } else {
            say_err!(
                "bench operator: {} still there after {}s; the Go run starts beside it",
                after.join(", "),
                timeout.as_secs()
            );
        }
        let launcher = Launcher::Go {
            binary,
            controller,
            proxy: counting_proxy(&kubeconfig, &proxy_kubeconfig).await?,
            kubeconfig: proxy_kubeconfig.clone(),
            workload: workload(args),
        };
        Ok::<_, anyhow::Error>(run::bench(args, &launcher, shape, &client).await.1)
    });
    let _ = fs::remove_file(&proxy_kubeconfig);
    record(&result??, &format!("{}-go", run_name(args)))
}

/// Writes `target/bench/<name>.json` and prints the run's line.
fn record(outcome: &record::RunRecord, name: &str) -> Result<()> {
    let path = out_dir()?.join(format!("{name}.json"));
    fs::write(&path, outcome.to_json()?).with_context(|| format!("writing {}", path.display()))?;
    say!("{}", report::one_line(outcome));
    say!("wrote {}", path.display());
    Ok(())
}

/// kubectl (the cluster's own when built) with the admin kubeconfig.
fn admin_kubectl(kubeconfig: &Path) -> Kubectl {
    Kubectl::new(cluster::build::kubectl_or_path()).with_kubeconfig(kubeconfig)
}

/// A counting proxy sending on with the credentials of `upstream` (a kubeconfig), and at
/// `kubeconfig` the kubeconfig that points at it.
async fn counting_proxy(
    upstream: &Path,
    kubeconfig: &Path,
) -> Result<std::sync::Arc<proxy::CountingProxy>> {
    let proxy = proxy::CountingProxy::start(upstream).await?;
    proxy.write_kubeconfig(kubeconfig)?;
    Ok(std::sync::Arc::new(proxy))
}

/// Where the kubeconfig pointing at a run's counting proxy goes (`suffix`: `-go` or none).
fn proxy_kubeconfig_path(op: Operator, suffix: &str) -> Result<PathBuf> {
    Ok(out_dir()?.join("logs").join(format!(
        "{}{suffix}-proxy-{}.kubeconfig",
        op.name(),
        std::process::id()
    )))
}

/// A kubeconfig with a fresh token of the operator's ServiceAccount.
fn service_account_kubeconfig(op: Operator, admin: &Path) -> Result<PathBuf> {
    let path =
        out_dir()?
            .join("logs")
            .join(format!("{}-{}.kubeconfig", op.name(), std::process::id()));
    local_operator::service_account_kubeconfig(
        &admin_kubectl(admin),
        &format!("{}-system", op.crate_name()),
        op.crate_name(),
        "2h",
        None,
        &path,
    )?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;
    use kube::core::DynamicObject;

    #[test]
    fn standard_set_covers_every_operator() {
        let set = standard_set();
        for op in Operator::ALL {
            assert!(set.contains(&(op, 100, 0)));
        }
        assert!(set.contains(&(Operator::Podset, 1000, 0)));
        assert!(set.contains(&(Operator::Memcached, 1000, 0)));
        assert!(set.contains(&(Operator::Podset, 100, 5000)));
        let name = |operator, objects, replicas, stranger_pods, namespaces| {
            run_name(&OperatorArgs {
                operator,
                objects,
                replicas,
                stranger_pods,
                namespaces,
                ..OperatorArgs::default()
            })
        };
        assert_eq!(name(Operator::Podset, 100, 3, 0, 1), "podset-100");
        assert_eq!(
            name(Operator::Podset, 100, 3, 5000, 1),
            "podset-100-strangers-5000"
        );
        assert_eq!(
            name(Operator::Memcached, 1000, 3, 0, 10),
            "memcached-1000-namespaces-10"
        );
        // A cost curve's runs at one replica keep files of their own.
        assert_eq!(name(Operator::Podset, 1000, 1, 0, 1), "podset-1000-x1");
        assert_eq!(name(Operator::Lolcow, 1000, 1, 0, 1), "lolcow-1000");
        // The simulated nodes are sized for the most pods a run holds.
        let args = |replicas, skip_change| OperatorArgs {
            objects: 30_000,
            replicas,
            skip_change,
            stranger_pods: 10,
            ..OperatorArgs::default()
        };
        assert_eq!(args(1, true).peak_pods(), 30_010);
        assert_eq!(args(1, false).peak_pods(), 60_010);
        assert_eq!(args(3, false).peak_pods(), 90_010);
    }

    #[test]
    fn both_implementations_run_the_children_on_the_image_the_rust_operator_would() {
        let env = |kvs: &[&str]| kvs.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let image = |op: Operator, given: &[&str], inherited: Option<&str>| {
            op.workload_image(&env(given), inherited.map(str::to_owned))
        };
        assert_eq!(image(Operator::Podset, &[], None), None);
        assert_eq!(image(Operator::Memcached, &[], Some("x")), None);
        // The operator's default, else the bench's environment, else --env (the last).
        assert_eq!(
            image(Operator::Lolcow, &["RUST_LOG=debug"], None),
            Some(("LOLCOW_IMAGE", "lolcow-web:latest".to_owned()))
        );
        assert_eq!(
            image(Operator::PulsarConsumer, &[], Some("reg.local/pc:1")),
            Some(("PULSAR_CONSUMER_IMAGE", "reg.local/pc:1".to_owned()))
        );
        assert_eq!(
            image(
                Operator::Lolcow,
                &["LOLCOW_IMAGE=a:1", "LOLCOW_IMAGE=b:2"],
                Some("c:3")
            ),
            Some(("LOLCOW_IMAGE", "b:2".to_owned()))
        );
        // Empty counts as unset, as the operators read it.
        assert_eq!(
            image(Operator::Lolcow, &["LOLCOW_IMAGE="], Some(" ")),
            Some(("LOLCOW_IMAGE", "lolcow-web:latest".to_owned()))
        );
    }

    #[test]
    fn only_lolcows_are_capped_below_the_option_s_range() {
        assert_eq!(Operator::Lolcow.max_objects(), 2768);
        for op in [
            Operator::Podset,
            Operator::Memcached,
            Operator::PulsarConsumer,
        ] {
            assert!(op.max_objects() >= 30_000);
        }
    }

    #[test]
    fn objects_parse() -> Result<()> {
        for op in Operator::ALL {
            let obj: DynamicObject = serde_json::from_value(op.object("x-0001", 3, 31000))?;
            assert_eq!(obj.name_any(), "x-0001");
            assert!(op.change(3).0["spec"].is_object());
        }
        Ok(())
    }
}
