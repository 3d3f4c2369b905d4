//! `cargo xtask bench operator` leaves nothing behind when it is interrupted: Ctrl-C
//! stops the operator it started and deletes its namespace, finalizers included.

use anyhow::{Context, Result, ensure};
use e2e::{TIMEOUT, admin_client, poll, repo_root};
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The label the bench puts on its namespaces.
const BENCH_LABEL: &str = "bench.rust-operators.dev/operator";

#[tokio::test]
async fn an_interrupted_bench_stops_its_operator_and_deletes_its_namespace() -> Result<()> {
    if std::env::var_os("E2E_LOCAL_CLUSTER").is_none() {
        return e2e::skip(
            "an_interrupted_bench_stops_its_operator_and_deletes_its_namespace",
            "needs the local cluster (cargo xtask test sets E2E_LOCAL_CLUSTER)",
        );
    }
    let client = admin_client().await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let labelled = ListParams::default().labels(&format!("{BENCH_LABEL}=memcached"));
    let before: Vec<String> = namespaces
        .list(&labelled)
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    // `cargo run` replaces itself with xtask, so the child's pid is the bench's.
    let log = e2e::target_dir()
        .join("e2e-logs")
        .join("bench-interrupted.log");
    std::fs::create_dir_all(log.parent().context("log directory")?)?;
    let out = std::fs::File::create(&log)?;
    let child = xtask::support::cmd::cargo()
        .current_dir(repo_root())
        .args(["run", "--quiet", "-p", "xtask", "--", "bench", "operator"])
        .args([
            "--operator",
            "memcached",
            "--objects",
            "3",
            "--replicas",
            "1",
        ])
        .arg("--quick")
        // A group of its own: a failed test stops the bench with its cargo build.
        .process_group(0)
        .stdout(Stdio::from(out.try_clone()?))
        .stderr(Stdio::from(out))
        .spawn()
        .context("starting cargo xtask bench")?;
    let pid = child.id();
    let bench = std::sync::Mutex::new(child);
    let exited = || -> Result<Option<std::process::ExitStatus>> {
        let mut child = bench.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        Ok(child.try_wait()?)
    };

    // The bench builds the image binaries first: cold, that takes minutes (the image
    // tests, which run later, then find them built). Then its namespace, once the
    // operator has put its finalizer on all three Memcacheds.
    let memcacheds = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cache.example.com", "v1alpha1", "Memcached"),
        "memcacheds",
    );
    let built = poll(
        "the bench to build its binaries and start",
        Duration::from_secs(2400),
        || async {
            if let Some(status) = exited()? {
                anyhow::bail!("the bench ended ({status}); see {}", log.display());
            }
            let output = std::fs::read_to_string(&log)?;
            Ok(output.contains("    namespace bench-").then_some(()))
        },
    )
    .await;
    // On a failure: SIGTERM to the whole group (the bench cleans up after it).
    let stop = || {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{pid}")])
            .status();
    };
    if let Err(e) = built {
        stop();
        return Err(e);
    }
    let wait = poll(
        "the bench's three Memcacheds with their finalizer",
        Duration::from_secs(300),
        || async {
            if let Some(status) = exited()? {
                anyhow::bail!(
                    "the bench ended ({status}) before it was interrupted; see {}",
                    log.display()
                );
            }
            for ns in namespaces.list(&labelled).await?.items {
                let name = ns.name_any();
                if before.contains(&name) {
                    continue;
                }
                let api: Api<DynamicObject> =
                    Api::namespaced_with(client.clone(), &name, &memcacheds);
                let objects = api.list(&ListParams::default()).await?.items;
                if objects.len() == 3 && objects.iter().all(|o| !o.finalizers().is_empty()) {
                    return Ok(Some(name));
                }
            }
            Ok(None)
        },
    )
    .await;
    let namespace = match wait {
        Ok(namespace) => namespace,
        Err(e) => {
            stop();
            return Err(e);
        }
    };

    let sent = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()?;
    ensure!(sent.success(), "kill -INT {pid} failed");
    let status = poll("the bench to exit", Duration::from_secs(120), || async {
        exited()
    })
    .await?;
    let output = std::fs::read_to_string(&log)?;
    ensure!(
        !status.success(),
        "an interrupted bench reported success:\n{output}"
    );
    ensure!(
        output.contains("interrupted by SIGINT") && output.contains(&namespace),
        "the bench did not say it was interrupted and cleaned up:\n{output}"
    );
    let left: Vec<String> = std::fs::read_dir("/proc")?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            let wanted = format!("WATCH_NAMESPACE={namespace}");
            environ
                .split(|b| *b == 0)
                .any(|var| var == wanted.as_bytes())
                .then(|| entry.file_name().to_string_lossy().into_owned())
        })
        .collect();
    ensure!(
        left.is_empty(),
        "the bench's operator still runs (pids {left:?})"
    );
    // The operator was stopped before the clean-up took the finalizers off, so nothing
    // put one back: the namespace goes away entirely.
    poll(&format!("namespace {namespace} gone"), TIMEOUT, || async {
        Ok(namespaces
            .get_opt(&namespace)
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    Ok(())
}
