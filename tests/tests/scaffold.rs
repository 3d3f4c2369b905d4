//! `cargo xtask new` end to end: in a scratch copy of the repository (its tracked files,
//! under `target/`), scaffold an operator; nothing but its crate, its `deploy/` tree, the
//! workspace's member lists, the lock file and the one list of operators changes; the new
//! crate passes `cargo fmt --check`, `cargo clippy -D warnings` and its own unit tests;
//! its `deploy/` tree installs on the cluster; and the operator, run here with its own
//! ServiceAccount's credentials (so the RBAC it was scaffolded with is enough), brings
//! its sample to Ready and repairs its child when someone edits it.
//!
//! The copy builds into the workspace's target directory, so no dependency is rebuilt:
//! only the copy's own crates (`shared`, `xtask`, the new operator) compile.

use anyhow::{Context, Result, bail, ensure};
use e2e::{TIMEOUT, TestNamespace, kubectl_ok, kubectl_runner, poll, repo_root, target_dir};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use xtask::support::local_operator::{self, Launch, LocalOperator};

const NAME: &str = "scaffolded";
const OPERATOR: &str = "scaffolded-operator";
const GROUP: &str = "scaffold.e2e.rust-operators.dev";
const VERSION: &str = "v1alpha1";
const KIND: &str = "ScaffoldCheck";
const PLURAL: &str = "scaffoldchecks";
/// The sample's name, as the template writes it.
const SAMPLE: &str = "scaffoldcheck-sample";

/// A scratch copy of the repository's tracked files, and what the test installed from
/// it; removed from the cluster when dropped.
struct Scratch {
    root: PathBuf,
}

impl Scratch {
    /// Copies every tracked file (as `git ls-files` lists them) to
    /// `target/e2e-scaffold/repo`, emptied first. The copies are new files (modification
    /// time now), so cargo rebuilds the copy's own crates: every run's copy has the same
    /// paths, and with the workspace's older times kept, the build of the last run's copy
    /// (its xtask already knowing the scaffolded operator) passed as fresh.
    fn copy_repository() -> Result<Scratch> {
        let root = target_dir().join("e2e-scaffold").join("repo");
        if root.exists() {
            std::fs::remove_dir_all(&root)?;
        }
        let listed = Command::new("git")
            .current_dir(repo_root())
            .args(["ls-files", "-z"])
            .output()
            .context("running git ls-files")?;
        ensure!(listed.status.success(), "git ls-files failed");
        for path in listed.stdout.split(|b| *b == 0).filter(|p| !p.is_empty()) {
            let path = Path::new(std::str::from_utf8(path)?);
            let from = repo_root().join(path);
            if !from.is_file() {
                // Deleted in the working tree, not yet in the index.
                continue;
            }
            let to = root.join(path);
            if let Some(dir) = to.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::copy(&from, &to)?;
        }
        let scratch = Scratch { root };
        scratch.keep_artifacts_apart()?;
        Ok(scratch)
    }

    /// Gives the copy's own crates artifacts of their own in the shared target directory.
    /// Cargo names a crate's artifacts by a hash of its path relative to the workspace and
    /// of its profile, so without this the copy's `shared` or `xtask` (built from sources
    /// as new as the copy) would replace the workspace's, and a later `cargo xtask` in the
    /// workspace would find them fresh and run the copy's xtask, which knows the
    /// scaffolded operator. A profile setting of no consequence (255 codegen units rather
    /// than 256) for each member gives them another hash; the dependencies stay shared.
    fn keep_artifacts_apart(&self) -> Result<()> {
        let out = xtask::support::cmd::cargo()
            .current_dir(&self.root)
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .output()
            .context("running cargo metadata")?;
        ensure!(out.status.success(), "cargo metadata failed in the copy");
        let metadata: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let mut config = String::from(
            "\n# The scratch copy of the scaffold test: its crates' artifacts apart from the workspace's.\n",
        );
        for package in metadata["packages"].as_array().into_iter().flatten() {
            let name = package["name"]
                .as_str()
                .context("a package without a name")?;
            config.push_str(&format!(
                "[profile.dev.package.\"{name}\"]\ncodegen-units = 255\n"
            ));
        }
        let path = self.root.join(".cargo").join("config.toml");
        let mut file = std::fs::File::options().append(true).open(&path)?;
        std::io::Write::write_all(&mut file, config.as_bytes())?;
        Ok(())
    }

    /// Every file of the copy and its contents.
    fn snapshot(&self) -> Result<BTreeMap<String, Vec<u8>>> {
        let mut files = BTreeMap::new();
        let mut dirs = vec![self.root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir)? {
                let path = entry?.path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    let relative = path.strip_prefix(&self.root)?.display().to_string();
                    files.insert(relative, std::fs::read(&path)?);
                }
            }
        }
        Ok(files)
    }

    /// `cargo <args>` in the copy, with the workspace's target directory; fails with the
    /// tail of its output.
    fn cargo(&self, args: &[&str]) -> Result<()> {
        let started = std::time::Instant::now();
        let out = xtask::support::cmd::cargo()
            .current_dir(&self.root)
            .args(args)
            .env("CARGO_TARGET_DIR", target_dir())
            .output()
            .with_context(|| format!("running cargo {args:?}"))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "`cargo {}` in the scratch copy failed ({}):\n{}",
                args.join(" "),
                out.status,
                tail.join("\n")
            );
        }
        eprintln!(
            "scaffold: cargo {} ({:.0?})",
            args.join(" "),
            started.elapsed()
        );
        Ok(())
    }

    fn tree(&self) -> PathBuf {
        self.root.join("deploy").join(OPERATOR)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os("E2E_KEEP_NAMESPACES").is_some() {
            return;
        }
        // The whole tree: the CRD (and with it every object of the kind), the operator's
        // namespace and its cluster-wide roles.
        let _ = kubectl_runner()
            .command()
            .args(["delete", "--ignore-not-found", "--wait=false", "-k"])
            .arg(self.tree())
            .output();
        // Building the copy's xtask linked `target/debug/xtask` to it: link the
        // workspace's own back (its artifacts are apart, so nothing to compile).
        let _ = xtask::support::cmd::cargo()
            .current_dir(repo_root())
            .args(["build", "--quiet", "-p", "xtask"])
            .env("CARGO_TARGET_DIR", target_dir())
            .status();
    }
}

/// What `cargo xtask new` may change: its crate, its tree, the workspace's member lists
/// and lock file, and the one list of operators.
fn expected_change(path: &str) -> bool {
    path.starts_with(&format!("operators/{OPERATOR}/"))
        || path.starts_with(&format!("deploy/{OPERATOR}/"))
        || ["Cargo.toml", "Cargo.lock", "xtask/src/support/operators.rs"].contains(&path)
}

fn is_ready(object: &DynamicObject) -> bool {
    let status = &object.data["status"];
    status["observedGeneration"] == object.metadata.generation.unwrap_or(-1)
        && status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

#[tokio::test]
async fn a_scaffolded_operator_builds_passes_its_lints_and_brings_its_sample_to_ready() -> Result<()>
{
    let scratch = Scratch::copy_repository()?;
    let before = scratch.snapshot()?;
    scratch.cargo(&[
        "xtask",
        "new",
        NAME,
        "--group",
        GROUP,
        "--version",
        VERSION,
        "--kind",
        KIND,
    ])?;
    let after = scratch.snapshot()?;
    let changed: Vec<&String> = after
        .keys()
        .chain(before.keys())
        .filter(|p| before.get(*p) != after.get(*p))
        .collect();
    let unexpected: Vec<&&String> = changed.iter().filter(|p| !expected_change(p)).collect();
    ensure!(
        unexpected.is_empty(),
        "`cargo xtask new` changed files outside its crate, its tree and the lists: {unexpected:?}"
    );
    for path in [
        "Cargo.toml",
        "xtask/src/support/operators.rs",
        &format!("operators/{OPERATOR}/src/reconcile.rs"),
        &format!("deploy/{OPERATOR}/crd.yaml"),
        &format!("deploy/{OPERATOR}/install.yaml"),
        &format!("deploy/{OPERATOR}/chart/Chart.yaml"),
        &format!("deploy/{OPERATOR}/samples/scaffoldcheck.yaml"),
    ] {
        ensure!(
            changed.iter().any(|p| *p == path),
            "`cargo xtask new` did not write {path}"
        );
    }
    // The CRD was generated from the new crate's types.
    let crd = String::from_utf8_lossy(&after[&format!("deploy/{OPERATOR}/crd.yaml")]).into_owned();
    ensure!(
        crd.contains(&format!("name: {PLURAL}.{GROUP}"))
            && crd.contains("x-kubernetes-list-type: map"),
        "the generated CRD: {crd}"
    );

    scratch.cargo(&["fmt", "-p", OPERATOR, "--check"])?;
    scratch.cargo(&[
        "clippy",
        "-p",
        OPERATOR,
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    scratch.cargo(&["test", "-p", OPERATOR])?;
    scratch.cargo(&["build", "-p", OPERATOR])?;

    // Installed as the other operators are for the tests: the tree (CRD, RBAC, ...), the
    // binary run here with its ServiceAccount's token.
    let kubectl = kubectl_runner();
    local_operator::install_tree(&kubectl, OPERATOR, &scratch.tree(), "e2e")?;
    let ns = TestNamespace::new("scaffold").await?;
    let kubeconfig = target_dir()
        .join("e2e")
        .join(format!("{}-{OPERATOR}.kubeconfig", ns.name));
    local_operator::service_account_kubeconfig(
        &kubectl,
        &format!("{OPERATOR}-system"),
        OPERATOR,
        "1h",
        None,
        &kubeconfig,
    )?;
    let logs = target_dir().join("e2e-logs");
    std::fs::create_dir_all(&logs)?;
    let mut operator = LocalOperator::spawn(Launch {
        binary: &target_dir().join("debug").join(OPERATOR),
        kubeconfig: &kubeconfig,
        watch_namespace: &ns.name,
        log_path: &logs.join(format!("{}-{OPERATOR}.log", ns.name)),
        args: &[],
        env: &[],
    })?;
    let with_log =
        |e: anyhow::Error, op: &LocalOperator| e.context(format!("operator log:\n{}", op.log()));
    poll("the operator's /readyz", TIMEOUT, || {
        let state = (operator.exited(), operator.ready());
        async move {
            match state {
                (Some(status), _) => bail!("the operator exited ({status})"),
                (None, ready) => Ok(ready.then_some(())),
            }
        }
    })
    .await
    .map_err(|e| with_log(e, &operator))?;

    // The sample, as a user applies it.
    let samples = scratch.tree().join("samples");
    kubectl_ok([
        "apply".as_ref(),
        "-n".as_ref(),
        ns.name.as_ref(),
        "-k".as_ref(),
        samples.as_os_str(),
    ])?;
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL);
    let objects: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), &ns.name, &resource);
    let sample = poll("the sample to be Ready", TIMEOUT, || async {
        let object = objects.get(SAMPLE).await?;
        Ok(is_ready(&object).then_some(object))
    })
    .await
    .map_err(|e| with_log(e, &operator))?;
    let config_maps: Api<ConfigMap> = ns.api();
    let config_map = config_maps.get(SAMPLE).await?;
    let data = config_map.data.clone().unwrap_or_default();
    ensure!(
        data.get("greeting").map(String::as_str) == Some(&format!("Hello from {OPERATOR}"))
            && data.get("color").map(String::as_str) == Some("blue"),
        "the ConfigMap holds {data:?}"
    );
    ensure!(
        e2e::controlled_by(
            &config_map,
            sample.metadata.uid.as_deref().unwrap_or_default()
        ),
        "the ConfigMap is not controlled by the sample: {:?}",
        config_map.metadata.owner_references
    );
    ensure!(
        sample.data["status"]["entries"] == 2,
        "status: {}",
        sample.data["status"]
    );

    // Someone edits the ConfigMap: the operator puts the entries back.
    kubectl_ok([
        "patch",
        "configmap",
        SAMPLE,
        "-n",
        &ns.name,
        "--type=merge",
        "-p",
        r#"{"data":{"color":"red"}}"#,
    ])?;
    poll("the edited ConfigMap to be repaired", TIMEOUT, || async {
        let data = config_maps.get(SAMPLE).await?.data.unwrap_or_default();
        Ok((data.get("color").map(String::as_str) == Some("blue")).then_some(()))
    })
    .await
    .map_err(|e| with_log(e, &operator))?;

    // SIGTERM: a clean shutdown.
    ensure!(
        operator.terminate()?,
        "the operator did not exit 0 on SIGTERM; log:\n{}",
        operator.log()
    );
    drop(scratch);
    // The CRD goes with the tree (and the namespace with `ns`).
    poll(
        "the scaffolded CRD to go",
        Duration::from_secs(120),
        || async {
            let out = kubectl_runner().capture(["get", "crd", &format!("{PLURAL}.{GROUP}")])?;
            Ok((!out.success).then_some(()))
        },
    )
    .await?;
    Ok(())
}
