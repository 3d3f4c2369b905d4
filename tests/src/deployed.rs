//! Operators rolled out from their images with `cargo xtask deploy` onto the local
//! cluster's real node (containerd + kubelet), and what the tests read of their pods on
//! this machine: processes, cgroups, restarts.

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};

use crate::{kubeconfig_path, place_namespace, repo_root};

/// The node that runs containers.
pub const REAL_NODE: &str = "real-node";
/// Its registry, as `cargo xtask cluster up` starts it.
pub const REGISTRY: &str = "127.0.0.1:15000";

/// Why a test that needs the real node reports itself skipped.
pub const NO_REAL_NODE: &str =
    "needs the local cluster's real node, which `cargo xtask cluster up` starts when run as root";

/// Whether the cluster has the real node (`cargo xtask cluster up` starts it when run as
/// root); a test without it reports itself skipped.
pub async fn has_real_node(client: &kube::Client) -> Result<bool> {
    let nodes: Api<Node> = Api::all(client.clone());
    Ok(nodes.get_opt(REAL_NODE).await?.is_some())
}

/// `cargo xtask <args>` with the test cluster's kubeconfig.
pub fn xtask(args: &[&str]) -> Result<String> {
    let out = xtask::support::cmd::cargo()
        .current_dir(repo_root())
        .args(["run", "--quiet", "-p", "xtask", "--"])
        .args(args)
        .env("KUBECONFIG", kubeconfig_path()?)
        .output()
        .with_context(|| format!("running cargo xtask {args:?}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "cargo xtask {args:?} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

/// How long a rollout of an operator may take (release builds and image pulls take a
/// while the first time).
pub const ROLLOUT: std::time::Duration = std::time::Duration::from_secs(240);

/// An operator rolled out from its image; undeployed (its objects first) when dropped.
pub struct Deployed {
    /// The operator, e.g. `podset-operator`.
    pub operator: &'static str,
}

impl Deployed {
    /// `cargo xtask deploy <operator> --registry <local registry>`, which waits for the
    /// rollout (so the kubelet's probes passed).
    pub fn new(operator: &'static str) -> Result<Deployed> {
        place_namespace(&format!("{operator}-system"), false)?;
        let deployed = Deployed { operator };
        xtask(&["deploy", operator, "--registry", REGISTRY])?;
        Ok(deployed)
    }

    /// Like [`Deployed::new`], installed namespace-scoped, watching only `namespaces`
    /// (`cargo xtask deploy --namespaced`): objects of other tests' namespaces are left to
    /// their own operators.
    pub fn watching(operator: &'static str, namespaces: &[&str]) -> Result<Deployed> {
        place_namespace(&format!("{operator}-system"), false)?;
        let deployed = Deployed { operator };
        let watched = format!("--namespaced={}", namespaces.join(","));
        xtask(&["deploy", operator, "--registry", REGISTRY, &watched])?;
        Ok(deployed)
    }

    /// The namespace it runs in.
    pub fn namespace(&self) -> String {
        format!("{}-system", self.operator)
    }

    /// Sets environment variables (`NAME=value`) on its Deployment and waits for the
    /// rollout that follows.
    pub fn set_env(&self, vars: &[String]) -> Result<()> {
        let system = self.namespace();
        let target = format!("deployment/{}", self.operator);
        let mut args = vec!["set", "env", "-n", &system, &target];
        args.extend(vars.iter().map(String::as_str));
        crate::kubectl_ok(args)?;
        crate::kubectl_ok([
            "rollout",
            "status",
            "-n",
            &system,
            &target,
            &format!("--timeout={}s", ROLLOUT.as_secs()),
        ])?;
        Ok(())
    }

    /// Its pods (not being deleted).
    pub async fn pods(&self, client: &kube::Client) -> Result<Vec<Pod>> {
        pods(
            client,
            &self.namespace(),
            &format!("app.kubernetes.io/name={}", self.operator),
        )
        .await
    }
}

impl Drop for Deployed {
    fn drop(&mut self) {
        if let Err(e) = xtask(&["undeploy", self.operator]) {
            eprintln!("undeploy {}: {e:#}", self.operator);
        }
    }
}

/// The pods of `selector` in `namespace` that are not being deleted.
pub async fn pods(client: &kube::Client, namespace: &str, selector: &str) -> Result<Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    Ok(api
        .list(&ListParams::default().labels(selector))
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

/// The pod's UID.
pub fn pod_uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// Processes of this machine that run in the pod's containers (found by the pod's
/// cgroup), without the sandbox's.
pub fn container_processes(pod: &Pod) -> Vec<u32> {
    let uid = pod_uid(pod);
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cgroup.contains(&format!("pod{uid}"))
                && !cmdline.starts_with(b"/bin/sleep\x002147483647")
        })
        .collect()
}

/// The most memory the pod's (first) container has used since it started, in bytes, as
/// its memory cgroup counts it (what the kubelet's limit is enforced on): cgroup v1's
/// `memory.max_usage_in_bytes`, or v2's `memory.peak`.
pub fn container_peak_memory(pod: &Pod) -> Result<u64> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let pid = *container_processes(pod)
        .first()
        .with_context(|| format!("no process of pod {name} runs on this machine"))?;
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
        let (Some(controllers), Some(path)) = (controllers, path) else {
            continue;
        };
        let file = if controllers.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory{path}/memory.max_usage_in_bytes")
        } else if controllers.is_empty() {
            format!("/sys/fs/cgroup{path}/memory.peak")
        } else {
            continue;
        };
        if let Ok(text) = std::fs::read_to_string(&file) {
            return text
                .trim()
                .parse()
                .with_context(|| format!("{file}: {text:?}"));
        }
    }
    bail!("no memory cgroup with a peak for pod {name} (process {pid})")
}

/// Restarts of every container of the pod.
pub fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |c| c.iter().map(|c| c.restart_count).sum())
}

/// Whether every container of the pod is ready.
pub fn all_containers_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|c| !c.is_empty() && c.iter().all(|c| c.ready))
}
