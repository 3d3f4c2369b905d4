//! Which Kubernetes the local cluster runs.
//!
//! Each version is a Go module that pins `k8s.io/kubernetes` (and its staging modules):
//! `xtask/cluster/kubernetes/` the default, which `cargo xtask cluster up` starts and CI
//! tests; `xtask/cluster/kubernetes/v1.<minor>/` one more minor each, which
//! `--kubernetes 1.<minor>` picks (the compatibility runs of `docs/kubernetes-versions.md`).
//! Each version builds its control plane, kubelet, kube-proxy and kubectl once into its own
//! cache folder, `<cache>/cluster/kubernetes-<version>/bin`.
//!
//! The version a cluster was started with is written into its state folder, so later
//! commands (`up` again, `stop`, `status`, the tests' kubectl) use the same binaries. A
//! cluster's data is never handed to another version (etcd data written by a newer API
//! server is not for an older one): starting another version needs `cluster down`, which
//! removes the data, first.

use super::build::{self, GoBuild, KUBERNETES};
use anyhow::{Context, Result, bail};
use std::fmt;
use std::path::{Path, PathBuf};
use xtask::support::paths;

/// The flag that picks a version, as error messages name it.
pub const FLAG: &str = "--kubernetes";

/// Kubernetes at one version: the Go module that pins it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kubernetes {
    module_dir: PathBuf,
    version: String,
}

impl fmt::Display for Kubernetes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.version)
    }
}

/// `1.34`, `v1.34`, `1.34.4` or `v1.34.4` as (minor, patch): Kubernetes 1 only.
fn parse(requested: &str) -> Option<(u32, Option<u32>)> {
    let mut parts = requested.trim().trim_start_matches('v').split('.');
    if parts.next()? != "1" {
        return None;
    }
    let minor = parts.next()?.parse().ok()?;
    let patch = match parts.next() {
        Some(p) => Some(p.parse().ok()?),
        None => None,
    };
    parts.next().is_none().then_some((minor, patch))
}

impl Kubernetes {
    fn at(module_dir: PathBuf) -> Result<Kubernetes> {
        let version = build::required_version(&module_dir.join("go.mod"), KUBERNETES.module)?;
        Ok(Kubernetes {
            module_dir,
            version,
        })
    }

    /// The default version: what `cargo xtask cluster up` starts and CI tests.
    pub fn default_version() -> Result<Kubernetes> {
        Kubernetes::at(KUBERNETES.module_dir())
    }

    /// Every version with a module, oldest first.
    pub fn available() -> Result<Vec<Kubernetes>> {
        let root = KUBERNETES.module_dir();
        let mut all = vec![Kubernetes::default_version()?];
        for entry in
            std::fs::read_dir(&root).with_context(|| format!("reading {}", root.display()))?
        {
            let dir = entry?.path();
            let named_for_a_version = dir
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| parse(n).is_some());
            if named_for_a_version && dir.join("go.mod").is_file() {
                all.push(Kubernetes::at(dir)?);
            }
        }
        all.sort_by_key(|k| parse(&k.version));
        Ok(all)
    }

    /// The version `--kubernetes <requested>` names: a minor (`1.34`, `v1.34`) is the
    /// patch its module pins; a full version (`v1.34.4`) must be exactly that patch.
    pub fn find(requested: &str) -> Result<Kubernetes> {
        let available = Kubernetes::available()?;
        let listed = || {
            available
                .iter()
                .map(|k| {
                    if k.is_default() {
                        format!("{} (the default)", k.version)
                    } else {
                        k.version.clone()
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let Some((minor, patch)) = parse(requested) else {
            bail!(
                "{FLAG} `{requested}`: not a Kubernetes version; give a minor such as `1.34` or a release such as `v1.34.4` (available: {})",
                listed()
            );
        };
        let Some(found) = available
            .iter()
            .find(|k| parse(&k.version).map(|v| v.0) == Some(minor))
        else {
            bail!(
                "{FLAG} {requested}: no Go module pins Kubernetes 1.{minor}, so it cannot be built; \
                 available: {}. Versions outside the tested range are untested \
                 (docs/kubernetes-versions.md says how to add one).",
                listed()
            );
        };
        if let Some(patch) = patch
            && parse(&found.version) != Some((minor, Some(patch)))
        {
            bail!(
                "{FLAG} {requested}: {} pins {}, not 1.{minor}.{patch} (one release per minor, \
                 the newest); ask for `1.{minor}` or `{}`",
                found.module_dir.display(),
                found.version,
                found.version
            );
        }
        Ok(found.clone())
    }

    /// The release, e.g. `v1.34.4`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Whether this is the default version's module.
    pub fn is_default(&self) -> bool {
        self.module_dir == KUBERNETES.module_dir()
    }

    /// The cache folder of this version's binaries.
    pub fn bin_dir(&self) -> PathBuf {
        paths::cache_dir(KUBERNETES.folder)
            .join(format!("{}-{}", KUBERNETES.name, self.version))
            .join("bin")
    }

    /// One of this version's binaries (`kube-apiserver`, `kubectl`, ...).
    pub fn binary(&self, name: &str) -> PathBuf {
        self.bin_dir().join(name)
    }

    /// Builds this version's binaries unless the cache has them.
    pub fn ensure_built(&self) -> Result<()> {
        let bin_dir = self.bin_dir();
        if KUBERNETES
            .binaries
            .iter()
            .all(|b| xtask::support::cmd::is_executable(&bin_dir.join(b)))
        {
            return Ok(());
        }
        GoBuild {
            folder: KUBERNETES.folder,
            name: KUBERNETES.name,
            version: self.version.clone(),
            module_dir: self.module_dir.clone(),
            packages: KUBERNETES.packages,
            binaries: KUBERNETES.binaries,
            tags: KUBERNETES.tags,
            nice: false,
            bin_dir,
        }
        .run()
    }
}

/// The file in a cluster's state folder that names the version it was started with.
fn version_file(root: &Path) -> PathBuf {
    root.join("kubernetes-version")
}

/// The version of the cluster whose state is in `root`, if there is one. A cluster without
/// the file was started before versions could be picked: the default (then the only one).
pub(super) fn of_cluster(root: &Path) -> Result<Option<Kubernetes>> {
    if !root.join("data").exists() {
        return Ok(None);
    }
    let Ok(text) = std::fs::read_to_string(version_file(root)) else {
        return Kubernetes::default_version().map(Some);
    };
    let version = text.trim();
    Kubernetes::available()?
        .into_iter()
        .find(|k| k.version == version)
        .map(Some)
        .with_context(|| {
            format!(
                "the local cluster runs Kubernetes {version}, which this checkout has no module for; \
                 `cargo xtask cluster down` removes it (and its data)"
            )
        })
}

/// Records that the cluster in `root` runs `kubernetes`.
pub(super) fn record(root: &Path, kubernetes: &Kubernetes) -> Result<()> {
    std::fs::write(version_file(root), format!("{}\n", kubernetes.version))
        .with_context(|| format!("writing {}", version_file(root).display()))
}

/// The version `up` starts: the one asked for (`requested`), which must be the one whose
/// data is there, if any; else the existing cluster's; else the default.
pub(super) fn for_up(root: &Path, requested: Option<&Kubernetes>) -> Result<Kubernetes> {
    let existing = of_cluster(root)?;
    match (requested, existing) {
        (Some(requested), Some(existing)) if *requested != existing => bail!(
            "the local cluster is Kubernetes {existing} (its state and data are in {}), not {requested}: \
             a cluster's data is not handed to another version. `cargo xtask cluster down` removes it \
             (data included), then ask again for {requested}{}",
            root.display(),
            if requested.is_default() {
                String::from(" (the default: no flag needed)")
            } else {
                format!(" with `{FLAG} {requested}`")
            }
        ),
        (Some(requested), _) => Ok(requested.clone()),
        (None, Some(existing)) => Ok(existing),
        (None, None) => Kubernetes::default_version(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_as_minor_and_optional_patch() {
        assert_eq!(parse("1.34"), Some((34, None)));
        assert_eq!(parse("v1.34"), Some((34, None)));
        assert_eq!(parse("v1.34.4"), Some((34, Some(4))));
        assert_eq!(parse(" 1.37.2 "), Some((37, Some(2))));
        for bad in ["", "1", "2.0", "1.x", "v1.34.4.1", "v1.34.4-rc.0", "latest"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    /// Every module in the repository: one per minor, each in the folder its minor names,
    /// and the default among them.
    #[test]
    fn each_module_pins_the_minor_its_folder_names() -> Result<()> {
        let all = Kubernetes::available()?;
        let minors: Vec<u32> = all
            .iter()
            .filter_map(|k| parse(&k.version))
            .map(|v| v.0)
            .collect();
        let mut unique = minors.clone();
        unique.dedup();
        assert_eq!(minors, unique, "one module per minor: {all:?}");
        assert_eq!(all.iter().filter(|k| k.is_default()).count(), 1);
        for k in all.iter().filter(|k| !k.is_default()) {
            let folder = k
                .module_dir
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            assert_eq!(
                parse(folder).map(|v| v.0),
                parse(&k.version).map(|v| v.0),
                "{k:?}"
            );
            assert!(k.module_dir.join("go.sum").is_file(), "{k:?} has no go.sum");
        }
        Ok(())
    }

    #[test]
    fn the_flag_finds_a_minor_or_its_exact_release() -> Result<()> {
        let default = Kubernetes::default_version()?;
        let (minor, _) = parse(default.version()).context("the default's version")?;
        assert_eq!(Kubernetes::find(&format!("1.{minor}"))?, default);
        assert_eq!(Kubernetes::find(default.version())?, default);
        Ok(())
    }

    #[test]
    fn bad_versions_are_refused_naming_the_flag() {
        for (requested, says) in [
            ("latest", "not a Kubernetes version"),
            ("1.20", "no Go module pins Kubernetes 1.20"),
            ("v1.99.0", "no Go module pins Kubernetes 1.99"),
        ] {
            let error = Kubernetes::find(requested)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                error.starts_with(FLAG) && error.contains(says),
                "{requested}: {error}"
            );
            assert!(
                error.contains("(the default)"),
                "{requested}: lists what there is: {error}"
            );
        }
        // A patch other than the pinned one.
        let default = Kubernetes::default_version()
            .map(|k| k.version)
            .unwrap_or_default();
        if let Some((minor, Some(patch))) = parse(&default) {
            let other = format!("v1.{minor}.{}", patch + 100);
            let error = Kubernetes::find(&other)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(error.contains(&format!("pins {default}, not")), "{error}");
        }
    }

    #[test]
    fn a_cluster_keeps_its_version_until_it_is_removed() -> Result<()> {
        let root = std::env::temp_dir().join(format!("xtask-k8s-version-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let default = Kubernetes::default_version()?;
        // No cluster: the default, or what is asked.
        assert_eq!(for_up(&root, None)?, default);
        let other = Kubernetes::available()?
            .into_iter()
            .find(|k| !k.is_default());
        let Some(other) = other else {
            return Ok(());
        };
        assert_eq!(for_up(&root, Some(&other))?, other);
        // A cluster of `other`: `up` without the flag resumes it; the default is refused.
        std::fs::create_dir_all(root.join("data"))?;
        record(&root, &other)?;
        assert_eq!(for_up(&root, None)?, other);
        assert_eq!(for_up(&root, Some(&other))?, other);
        let error = for_up(&root, Some(&default))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            error.contains("cluster down") && error.contains(other.version()),
            "{error}"
        );
        // Data from before versions were recorded: the default's.
        std::fs::remove_file(version_file(&root))?;
        assert_eq!(of_cluster(&root)?, Some(default));
        std::fs::remove_dir_all(&root)?;
        Ok(())
    }
}
