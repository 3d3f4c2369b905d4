//! One run in a fresh namespace: the namespace and what it holds before the
//! operator starts, the phases in order (the start in `session.rs`, the
//! others in `phases.rs`), the record assembled from their parts, and the
//! cleanup.

use super::options::{Operator, OperatorArgs};
use super::process::Launcher;
use super::record::{
    Change, Create, Delete, End, PodCounts, Reaction, Restart, RunRecord, Startup, Steady,
};
use super::session::{Session, Target};
use super::watch::{StatusShape, create_strangers};
use crate::commands::bench::common::git_commit;
use crate::commands::bench::machine::Machine;
use anyhow::{Result, anyhow, ensure};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::{Client, ResourceExt};
use serde_json::json;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use xtask::say;

/// Creates a fresh bench namespace (`--namespaces K`: K of them), runs every phase in it
/// against what `launcher` starts (its status read as `shape` says), deletes it. `client`: the bench's own
/// (admin). Returns the namespaces (being deleted), and the run's record.
pub(super) async fn bench(
    args: &OperatorArgs,
    launcher: &Launcher,
    shape: StatusShape,
    client: &Client,
) -> (Vec<String>, Result<RunRecord>) {
    let op = args.operator;
    let base = format!(
        "bench-{}{}-{}-{}",
        op.name(),
        match launcher {
            Launcher::Rust { .. } => "",
            Launcher::Go { .. } => "-go",
        },
        args.objects,
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() % 1_000_000)
    );
    let namespaces: Vec<String> = match args.namespaces {
        1 => vec![base],
        k => (0..k).map(|i| format!("{base}-{i}")).collect(),
    };
    let result = bench_in(args, launcher, shape, client, &namespaces).await;
    (namespaces, result)
}

/// [`bench`] in `namespaces`, created here and deleted at the end.
async fn bench_in(
    args: &OperatorArgs,
    launcher: &Launcher,
    shape: StatusShape,
    client: &Client,
    namespaces: &[String],
) -> Result<RunRecord> {
    let (op, client) = (args.operator, client.clone());
    let ns_api: Api<Namespace> = Api::all(client.clone());
    for namespace in namespaces {
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {
                "name": namespace,
                "labels": { "bench.rust-operators.dev/operator": op.name() },
                // Thousands of pods: on the simulated nodes.
                "annotations": xtask::support::simulated::annotations_json(),
            }
        }))?;
        if let Err(e) = ns_api.create(&PostParams::default(), &ns).await {
            cleanup(&client, op, namespaces).await;
            return Err(e.into());
        }
    }
    say!("    namespace {}", namespaces.join(", "));
    let target = Target {
        args,
        launcher,
        shape,
        client: &client,
        namespaces,
    };
    // Ctrl-C or SIGTERM mid-run: the phases are dropped (which stops the operator, so it
    // cannot put a finalizer back), then the same clean-up as after a finished run.
    let result = tokio::select! {
        result = run_phases(&target) => result,
        signal = interrupted() => {
            say!("    {signal}: stopping the operator, deleting {}", namespaces.join(", "));
            Err(anyhow!("interrupted by {signal}"))
        }
    };
    cleanup(&client, op, namespaces).await;
    result
}

/// Waits until `namespaces` (a run's, being deleted) are gone, at most `timeout`; returns
/// whether they are.
pub(super) async fn wait_gone(
    client: &Client,
    namespaces: &[String],
    timeout: Duration,
) -> Result<bool> {
    let ns_api: Api<Namespace> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    for namespace in namespaces {
        while ns_api.get_opt(namespace).await?.is_some() {
            if Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    Ok(true)
}

/// Waits for SIGINT (Ctrl-C) or SIGTERM and names it; never ends when the handlers
/// cannot be installed.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut interrupt), Ok(mut terminate)) => {
            let signal = tokio::select! {
                _ = interrupt.recv() => "SIGINT",
                _ = terminate.recv() => "SIGTERM",
            };
            // The reader of a piped output got the SIGINT too: the cleanup's output may
            // go nowhere, and must not stop it (`say!`, `console::status`).
            xtask::support::console::interrupted();
            signal
        }
        _ => std::future::pending().await,
    }
}

/// Every phase, in order; the record they fill.
async fn run_phases(target: &Target<'_>) -> Result<RunRecord> {
    for namespace in target.namespaces {
        wait_for_default_service_account(target.client, namespace).await?;
    }
    create_strangers(
        target.client,
        &target.namespaces[0],
        target.args.stranger_pods,
    )
    .await?;
    let (mut run, startup) = Session::start(target).await?;
    let create = run.create().await?;
    let (steady, pods) = run.quiet_window().await?;
    let restart = run.restart(&steady).await?;
    let reaction = run.reaction().await?;
    let ever_before_change = run.pods.lock().map_or(0, |p| p.ever.len());
    let (change, created_by_change) = if target.args.skip_change {
        (
            super::record::Change {
                what: super::record::Change::SKIPPED.to_owned(),
                ..super::record::Change::default()
            },
            0,
        )
    } else {
        run.change(ever_before_change).await?
    };
    let (delete, end) = run.delete().await?;
    Ok(assemble(
        &run,
        Phases {
            startup,
            create,
            pods: PodCounts {
                created_by_change,
                ..pods
            },
            steady,
            restart,
            reaction,
            change,
            delete,
            end,
        },
    ))
}

/// Deletes the bench namespaces. Objects with a finalizer whose operator has
/// stopped would keep a namespace `Terminating` forever, so they lose their
/// finalizers first.
async fn cleanup(client: &Client, op: Operator, namespaces: &[String]) {
    let ns_api: Api<Namespace> = Api::all(client.clone());
    for namespace in namespaces {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &op.api_resource());
        let _ = api
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
        if let Ok(left) = api.list_metadata(&ListParams::default()).await {
            for obj in left.items {
                if !obj.finalizers().is_empty() {
                    let _ = api
                        .patch(
                            &obj.name_any(),
                            &PatchParams::default(),
                            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
                        )
                        .await;
                }
            }
        }
        let _ = ns_api.delete(namespace, &DeleteParams::default()).await;
    }
}

/// Pods need the namespace's default ServiceAccount: up to 30 s for it.
async fn wait_for_default_service_account(client: &Client, namespace: &str) -> Result<()> {
    let sa_api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + Duration::from_secs(30);
    while sa_api.get_opt("default").await?.is_none() {
        ensure!(
            Instant::now() < deadline,
            "no default ServiceAccount in {namespace}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Every phase's part of the record.
struct Phases {
    startup: Startup,
    create: Create,
    pods: PodCounts,
    steady: Steady,
    restart: Restart,
    reaction: Option<Reaction>,
    change: Change,
    delete: Delete,
    end: End,
}

/// The record of the run from its phases.
fn assemble(run: &Session<'_>, phases: Phases) -> RunRecord {
    let (op, n, args) = (run.op, run.n, run.target.args);
    let Phases {
        startup,
        create,
        pods,
        steady,
        restart,
        reaction,
        change,
        delete,
        end,
    } = phases;
    // What the objects cost: converged RSS above idle, per object.
    let kib_per_object =
        steady.rss_kib.saturating_sub(startup.idle_rss_kib) as f64 / f64::from(n.max(1));
    let (binary, build) = match run.target.launcher {
        Launcher::Rust { .. } => match &args.binary {
            Some(given) => (
                given.display().to_string(),
                "given with --binary (not built by this run)".to_owned(),
            ),
            None => (
                op.crate_name().to_owned(),
                "release, static (the image's binary)".to_owned(),
            ),
        },
        Launcher::Go { controller, .. } => (
            format!("go-ref -controller {controller}"),
            "go build (the seed's Go original on controller-runtime)".to_owned(),
        ),
    };
    let request_counting =
        "the bench's counting proxy between the operator and the API server (loopback HTTP/1.1 in, \
         one HTTP/2 connection out)"
            .to_owned();
    RunRecord {
        benchmark: "operator".to_owned(),
        operator: op.name().to_owned(),
        binary,
        implementation: run.target.launcher.implementation().to_owned(),
        build,
        objects: n,
        replicas: args.replicas,
        stranger_pods: args.stranger_pods,
        namespaces: args.namespaces,
        pods_per_object: op.pods_per_object(args.replicas),
        unix_time: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        git_commit: git_commit(),
        machine: Machine::probe(),
        operator_env: args.env.clone(),
        request_counting,
        minimum_writes_per_object: op.minimum_writes(args.replicas),
        readiness: run.target.shape.describe().to_owned(),
        workload_image: run
            .target
            .launcher
            .workload()
            .map(|w| w.image.clone())
            .unwrap_or_default(),
        startup,
        create,
        pods,
        steady,
        restart: Some(restart),
        reaction,
        change,
        delete,
        end,
        kib_per_object,
    }
}
