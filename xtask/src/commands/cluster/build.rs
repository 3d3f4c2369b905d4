//! Builds the control-plane binaries from Go modules, once, into the cache.
//!
//! Nothing can be downloaded from the internet on the machines this project is
//! developed and tested on, but the Go module proxy is reachable, so every
//! binary is built from source with the modules under `xtask/cluster/<name>/`
//! (their `go.mod` and `go.sum` are committed). The build output is cached
//! outside the repository under `<cache>/cluster/<name>-<version>/bin`. The tools
//! the checks run (Helm, oras) are built the same way from `xtask/tools/<name>/`
//! into `<cache>/tools/`.

use anyhow::{Context, Result, bail};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xtask::say;
use xtask::support::cmd;
use xtask::support::paths;

/// One Go module under `xtask/<folder>/` and the binaries it builds.
pub struct Component {
    /// `cluster` (the local cluster's components) or `tools` (what the checks run:
    /// Helm, oras): the folder under `xtask/` and the cache folder.
    pub folder: &'static str,
    /// Folder under `xtask/<folder>/`, also the cache key prefix.
    pub name: &'static str,
    /// The module whose version keys the cache (read from `go.mod`).
    pub module: &'static str,
    /// Packages to build; `.` is the wrapper module itself.
    pub packages: &'static [&'static str],
    /// The binaries the packages produce.
    pub binaries: &'static [&'static str],
    /// Go build tags (`go build -tags`), if any.
    pub tags: &'static [&'static str],
}

/// Kubernetes itself: API server, controller manager, scheduler, kubectl, and
/// the real node's kubelet and kube-proxy.
pub const KUBERNETES: Component = Component {
    folder: "cluster",
    name: "kubernetes",
    module: "k8s.io/kubernetes",
    packages: &[
        "k8s.io/kubernetes/cmd/kube-apiserver",
        "k8s.io/kubernetes/cmd/kube-controller-manager",
        "k8s.io/kubernetes/cmd/kube-scheduler",
        "k8s.io/kubernetes/cmd/kubectl",
        "k8s.io/kubernetes/cmd/kubelet",
        "k8s.io/kubernetes/cmd/kube-proxy",
    ],
    binaries: &[
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
        "kubelet",
        "kube-proxy",
    ],
    tags: &[],
};

/// etcd 3.6, through a wrapper around `etcdmain`.
pub const ETCD: Component = Component {
    folder: "cluster",
    name: "etcd",
    module: "go.etcd.io/etcd/server/v3",
    packages: &["."],
    binaries: &["etcd"],
    tags: &[],
};

/// kwok, which simulates nodes and the pods scheduled onto them.
pub const KWOK: Component = Component {
    folder: "cluster",
    name: "kwok",
    module: "sigs.k8s.io/kwok",
    packages: &["sigs.k8s.io/kwok/cmd/kwok"],
    binaries: &["kwok"],
    tags: &[],
};

/// containerd 2 (Kubernetes 1.36 needs it; Debian's 1.6 is too old), its runc
/// shim and `ctr` for looking inside. runc itself is Debian's.
pub const CONTAINERD: Component = Component {
    folder: "cluster",
    name: "containerd",
    module: "github.com/containerd/containerd/v2",
    packages: &[
        "github.com/containerd/containerd/v2/cmd/containerd",
        "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
        "github.com/containerd/containerd/v2/cmd/ctr",
    ],
    binaries: &["containerd", "containerd-shim-runc-v2", "ctr"],
    tags: &[],
};

/// The CNI plugins the real node's pod network uses.
pub const CNI: Component = Component {
    folder: "cluster",
    name: "cni",
    module: "github.com/containernetworking/plugins",
    packages: &[
        "github.com/containernetworking/plugins/plugins/main/bridge",
        "github.com/containernetworking/plugins/plugins/ipam/host-local",
        "github.com/containernetworking/plugins/plugins/main/loopback",
        "github.com/containernetworking/plugins/plugins/meta/portmap",
    ],
    binaries: &["bridge", "host-local", "loopback", "portmap"],
    tags: &[],
};

/// CoreDNS, through a wrapper that links only the plugins the cluster uses.
pub const COREDNS: Component = Component {
    folder: "cluster",
    name: "coredns",
    module: "github.com/coredns/coredns",
    packages: &["."],
    binaries: &["coredns"],
    tags: &[],
};

/// Every component, in build order.
pub const ALL: [&Component; 6] = [&ETCD, &KWOK, &KUBERNETES, &CNI, &CONTAINERD, &COREDNS];

impl Component {
    /// The folder of the Go module in the repository.
    pub fn module_dir(&self) -> PathBuf {
        paths::repo_root()
            .join("xtask")
            .join(self.folder)
            .join(self.name)
    }

    /// The version of `self.module` required by the wrapper's `go.mod`.
    pub fn version(&self) -> Result<String> {
        required_version(&self.module_dir().join("go.mod"), self.module)
    }

    /// The cache folder holding this component's binaries.
    pub fn bin_dir(&self) -> Result<PathBuf> {
        Ok(paths::cache_dir(self.folder)
            .join(format!("{}-{}", self.name, self.version()?))
            .join("bin"))
    }

    /// Path of one of this component's binaries in the cache.
    pub fn binary(&self, name: &str) -> Result<PathBuf> {
        Ok(self.bin_dir()?.join(name))
    }

    /// Whether the cache has every binary.
    pub fn is_built(&self) -> Result<bool> {
        let dir = self.bin_dir()?;
        Ok(self
            .binaries
            .iter()
            .all(|b| cmd::is_executable(&dir.join(b))))
    }

    /// Builds the component unless the cache already has it.
    pub fn ensure_built(&self) -> Result<()> {
        self.build(false)
    }

    /// The file a failed [`Component::build_in_background`] leaves with its error, so
    /// that a process waiting for the binaries stops waiting (removed by the next build).
    pub fn failure_file(&self) -> Result<PathBuf> {
        Ok(self
            .bin_dir()?
            .parent()
            .context("the cache folder has no parent")?
            .join("build-failed"))
    }

    /// Builds `components` one after another in a thread, at the lowest CPU priority
    /// (`nice -n 19`): what runs meanwhile (the end-to-end tests) keeps the cores, and the
    /// build takes the time they leave idle. [`Component::ensure_built`] in this process
    /// waits for it rather than building the same thing twice; another process waits for
    /// the binaries or for [`Component::failure_file`].
    pub fn build_in_background(
        components: &'static [&'static Component],
    ) -> std::thread::JoinHandle<Result<()>> {
        std::thread::spawn(move || {
            for component in components {
                if let Err(e) = component.build(true) {
                    if let Ok(file) = component.failure_file() {
                        let _ = std::fs::write(file, format!("{e:#}"));
                    }
                    return Err(e);
                }
            }
            Ok(())
        })
    }

    /// Builds unless built, holding the process's build lock (one Go build at a time).
    fn build(&self, nice: bool) -> Result<()> {
        static BUILDING: Mutex<()> = Mutex::new(());
        if self.is_built()? {
            return Ok(());
        }
        let _one_at_a_time = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_built()? {
            return Ok(());
        }
        if let Ok(file) = self.failure_file() {
            let _ = std::fs::remove_file(file);
        }
        GoBuild {
            folder: self.folder,
            name: self.name,
            version: self.version()?,
            module_dir: self.module_dir(),
            packages: self.packages,
            binaries: self.binaries,
            tags: self.tags,
            nice,
            bin_dir: self.bin_dir()?,
        }
        .run()
    }
}

/// One `go build` of a module's packages into a cache folder.
pub(super) struct GoBuild<'a> {
    /// `cluster` or `tools`: for messages.
    pub folder: &'a str,
    /// The component's name: for messages and its `-ldflags`.
    pub name: &'a str,
    /// The version stamped into the binaries.
    pub version: String,
    /// Where the Go module is.
    pub module_dir: PathBuf,
    /// Packages to build; `.` is the module itself.
    pub packages: &'a [&'a str],
    /// The binaries the packages produce.
    pub binaries: &'a [&'a str],
    /// Go build tags.
    pub tags: &'a [&'a str],
    /// Whether to build at the lowest CPU priority (`nice -n 19`).
    pub nice: bool,
    /// The cache folder the binaries end up in (all or none of them).
    pub bin_dir: PathBuf,
}

impl GoBuild<'_> {
    /// Builds into `<bin_dir>.partial`, then renames it to `bin_dir`: a build that stops
    /// half-way leaves no folder that looks complete.
    pub fn run(self) -> Result<()> {
        if !cmd::on_path("go") {
            bail!(
                "Go is needed to build {} {} (for the local test cluster and its checks) but `go` is not on PATH.\n\
                 Install Go 1.26 or newer (for example `apt-get install golang-go` where it is new enough, \
                 or the official tarball), then run the command again.\n\
                 Alternatively use any cluster you can reach: point KUBECONFIG at it and set \
                 E2E_KUBECONFIG to the same file so the tests use it instead.",
                self.name,
                self.version
            );
        }
        let version = &self.version;
        let final_dir = &self.bin_dir;
        let tmp_dir = final_dir.with_file_name("bin.partial");
        let _ = std::fs::remove_dir_all(&tmp_dir);
        std::fs::create_dir_all(&tmp_dir)?;
        let start = Instant::now();
        say!(
            "{}: building {} {} ({}) from Go modules; the first build takes several minutes, later runs reuse {}",
            self.folder,
            self.name,
            version,
            self.binaries.join(", "),
            final_dir.display()
        );
        let mut go = if self.nice {
            let mut nice = Command::new("nice");
            nice.args(["-n", "19", "go"]);
            nice
        } else {
            Command::new("go")
        };
        go.current_dir(&self.module_dir)
            .args(["build", "-v", "-trimpath", "-ldflags"])
            .arg(ldflags(self.name, version));
        if !self.tags.is_empty() {
            go.arg("-tags").arg(self.tags.join(","));
        }
        go.arg("-o");
        if self.packages == ["."] {
            go.arg(tmp_dir.join(self.binaries[0]));
        } else {
            go.arg(format!("{}/", tmp_dir.display()));
        }
        go.args(self.packages)
            .env("CGO_ENABLED", "0")
            .stdout(Stdio::inherit())
            .stderr(Stdio::piped());
        let mut child = go.spawn().context("could not start `go build`")?;
        let stderr = child.stderr.take().context("no stderr from go build")?;
        let compiled = Arc::new(AtomicUsize::new(0));
        let errors = Arc::new(Mutex::new(Vec::<String>::new()));
        let reader = {
            let compiled = Arc::clone(&compiled);
            let errors = Arc::clone(&errors);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    // `go build -v` names each package as it compiles it;
                    // anything else is a diagnostic worth keeping.
                    if !line.contains(' ') {
                        compiled.fetch_add(1, Ordering::Relaxed);
                    } else if let Ok(mut errors) = errors.lock() {
                        errors.push(line);
                    }
                }
            })
        };
        let mut last_report = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            std::thread::sleep(Duration::from_millis(500));
            if last_report.elapsed() >= Duration::from_secs(20) {
                last_report = Instant::now();
                say!(
                    "{}: building {} {}: {} elapsed, {} packages compiled",
                    self.folder,
                    self.name,
                    version,
                    cmd::elapsed(start),
                    compiled.load(Ordering::Relaxed)
                );
            }
        };
        let _ = reader.join();
        if !status.success() {
            let errors = errors.lock().map(|e| e.join("\n")).unwrap_or_default();
            let other_cluster = if self.folder == "cluster" {
                ", or use another cluster: point KUBECONFIG at it and set E2E_KUBECONFIG for the tests"
            } else {
                ""
            };
            bail!(
                "building {} {} failed ({status}):\n{errors}\n\
                 Fix the Go toolchain or module download (GOPROXY must reach the Go module proxy){other_cluster}.",
                self.name,
                version
            );
        }
        if final_dir.exists() {
            std::fs::remove_dir_all(final_dir)?;
        }
        std::fs::rename(&tmp_dir, final_dir)?;
        say!(
            "{}: built {} {} in {}",
            self.folder,
            self.name,
            version,
            cmd::elapsed(start)
        );
        Ok(())
    }
}

/// The version of `module` that the `go.mod` at `go_mod` requires.
pub fn required_version(go_mod: &Path, module: &str) -> Result<String> {
    let text =
        std::fs::read_to_string(go_mod).with_context(|| format!("reading {}", go_mod.display()))?;
    text.lines()
        .map(str::trim)
        .map(|line| line.trim_start_matches("require").trim())
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some(module))
                .then(|| words.next().map(str::to_owned))
                .flatten()
        })
        .with_context(|| format!("{} does not require {module}", go_mod.display()))
}

/// `-ldflags` stamping the real version into the binaries of the component `name`.
fn ldflags(name: &str, version: &str) -> String {
    let mut flags = String::from("-s -w");
    match name {
        "kubernetes" => {
            let minor = version.split('.').nth(1).unwrap_or("0");
            for pkg in [
                "k8s.io/component-base/version",
                "k8s.io/client-go/pkg/version",
            ] {
                flags.push_str(&format!(
                    " -X {pkg}.gitVersion={version} -X {pkg}.gitMajor=1 -X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean -X {pkg}.buildDate=1970-01-01T00:00:00Z"
                ));
            }
        }
        "kwok" => {
            let bare = version.trim_start_matches('v');
            flags.push_str(&format!(" -X sigs.k8s.io/kwok/pkg/consts.Version={bare}"));
        }
        "containerd" => {
            flags.push_str(&format!(
                " -X github.com/containerd/containerd/v2/version.Version={version}"
            ));
        }
        "coredns" => {}
        "helm" => {
            flags.push_str(&format!(
                " -X helm.sh/helm/v3/internal/version.version={version}"
            ));
        }
        "cni" => {
            flags.push_str(&format!(
                " -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion={version}"
            ));
        }
        _ => {}
    }
    flags
}

/// Builds every component that the cache lacks, with Kubernetes at `kubernetes`.
pub fn ensure_all(kubernetes: &super::Kubernetes) -> Result<()> {
    for component in ALL {
        if component.name == KUBERNETES.name {
            kubernetes.ensure_built()?;
        } else {
            component.ensure_built()?;
        }
    }
    Ok(())
}

/// The default version's `kubectl` (generating manifests needs one fixed kubectl: its
/// kustomize decides their bytes); [`super::Layout::kubectl`] talks to the cluster with its
/// own version's.
pub fn kubectl() -> Result<PathBuf> {
    KUBERNETES.binary("kubectl")
}

/// The `kubectl` built with the cluster when it is there, else `kubectl` on PATH.
pub fn kubectl_or_path() -> PathBuf {
    kubectl()
        .ok()
        .filter(|p| cmd::is_executable(p))
        .unwrap_or_else(|| "kubectl".into())
}

/// Tells whether `path` is inside one of the cache folders (to recognise our
/// own processes before signalling them).
pub fn is_cached_binary(path: &Path) -> bool {
    path.starts_with(paths::cache_dir("cluster"))
}
