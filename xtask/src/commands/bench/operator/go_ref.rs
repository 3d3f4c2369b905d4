//! The Go originals (`--go-ref`): the seeds' PodSet, Memcached, Lolcow and PulsarConsumer
//! controllers on controller-runtime, for measurement side by side. Their source is not part of this
//! repository; it lives in `shared/go-ref` beside it (`../shared/go-ref`), and is built
//! outside it, into the cache:
//!
//! ```text
//! cp ../shared/go-ref/{*.go,go.mod,go.sum} ~/.cache/rust-operators/go-ref/src/
//! cd ~/.cache/rust-operators/go-ref/src && go build -o ../go-ref .
//! ```
//!
//! which [`binary`] does when `--go-ref` names no binary (with `go mod tidy` first when the
//! module's `go.sum` is incomplete). The binary takes
//! `-controller podset|memcached|lolcow|pulsarconsumer`, `WATCH_NAMESPACE` and `KUBECONFIG`,
//! the children's images as `-lolcow-image` and `-consumer-image` (the bench passes the
//! image the Rust operator runs them on), and serves its probes and metrics where
//! `-health-probe-bind-address` and `-metrics-bind-address` say. Their CRDs are ours
//! (same group, version, kind and fields).
//!
//! How the bench reads Ready differs where their status says nothing (see
//! [`status_shape`]): the Go PodSet's `readyReplicas` and the Go Memcached's `Available`
//! condition are read from their status; the Go Lolcow writes no status and the Go
//! PulsarConsumer's copies its spec whatever the pods do, so theirs is read from the
//! Deployment each controls (and the Lolcow's Service): rolled out at the object's current
//! spec. Every other phase measures the same thing for both implementations; for those
//! two, Ready (create, change, and the reaction's "status showing it") is the children
//! showing it, a state the Rust operator's own Ready needs too before its status write,
//! so the Go figures lack that last write (the record's `readiness` says so).

use super::options::Operator;
use super::watch::StatusShape;
use anyhow::{Context, Result, bail, ensure};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;
use xtask::say;
use xtask::support::{cmd, paths};

/// The `-controller` value of `op` (the Go originals have every kind).
pub(super) fn controller(op: Operator) -> &'static str {
    match op {
        Operator::Podset => "podset",
        Operator::Memcached => "memcached",
        Operator::Lolcow => "lolcow",
        Operator::PulsarConsumer => "pulsarconsumer",
    }
}

/// How the bench reads Ready of `op`'s Go original.
pub(super) fn status_shape(op: Operator) -> StatusShape {
    match op {
        Operator::Podset => StatusShape::GoPodSet,
        Operator::Memcached => StatusShape::GoMemcached,
        Operator::Lolcow => StatusShape::GoLolcow,
        Operator::PulsarConsumer => StatusShape::GoPulsarConsumer,
    }
}

/// The flag (without its `-`) that names the image of `op`'s children, for the kinds
/// whose children run an app of this workspace.
pub(super) fn image_flag(op: Operator) -> Option<&'static str> {
    match op {
        Operator::Lolcow => Some("lolcow-image"),
        Operator::PulsarConsumer => Some("consumer-image"),
        Operator::Podset | Operator::Memcached => None,
    }
}

/// The Go binary: `given` when it names one, else built from `../shared/go-ref` into the
/// cache (again only when a source file is newer than the binary).
pub(super) fn binary(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(given) = given {
        ensure!(
            given.is_file(),
            "--go-ref {}: no such file (build it: see `cargo xtask bench operator --help`)",
            given.display()
        );
        return Ok(given.to_owned());
    }
    let source = source_dir();
    if !source.join("go.mod").is_file() {
        bail!(
            "--go-ref: no Go originals at {} (they live beside the repository, in \
             ../shared/go-ref); build them elsewhere and pass the binary: `go build -o \
             <path> .` in their folder, then `--go-ref <path>`",
            source.display()
        );
    }
    let cache = paths::cache_dir("go-ref");
    let build_dir = cache.join("src");
    let out = cache.join("go-ref");
    let files = source_files(&source)?;
    if is_newer_than_all(&out, &files) {
        return Ok(out);
    }
    say!(
        "==> building the Go originals from {} into {} (outside the repository)",
        source.display(),
        out.display()
    );
    fs::create_dir_all(&build_dir)?;
    for file in &files {
        let to = build_dir.join(file.file_name().context("a source file has no name")?);
        // The source may be read-only; the copy must not be (go mod tidy rewrites it).
        let text = fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        fs::write(&to, text).with_context(|| format!("writing {}", to.display()))?;
    }
    let build = || {
        cmd::run(
            Command::new("go")
                .current_dir(&build_dir)
                .args(["build", "-o"])
                .arg(&out)
                .arg("."),
        )
    };
    if build().is_err() {
        cmd::run(
            Command::new("go")
                .current_dir(&build_dir)
                .args(["mod", "tidy"]),
        )?;
        build()?;
    }
    Ok(out)
}

/// `../shared/go-ref` beside the repository.
fn source_dir() -> PathBuf {
    paths::repo_root()
        .parent()
        .map_or_else(PathBuf::new, Path::to_path_buf)
        .join("shared")
        .join("go-ref")
}

/// The module's `*.go`, `go.mod` and `go.sum`.
fn source_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with(".go") || name == "go.mod" || name == "go.sum" {
            files.push(path);
        }
    }
    Ok(files)
}

/// Whether `out` exists and was written after every one of `files`.
fn is_newer_than_all(out: &Path, files: &[PathBuf]) -> bool {
    let modified = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(built) = modified(out) else {
        return false;
    };
    files
        .iter()
        .all(|f| modified(f).unwrap_or(SystemTime::UNIX_EPOCH) <= built)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operator_has_a_go_original() {
        let all = Operator::ALL.map(|op| (controller(op), status_shape(op), image_flag(op)));
        assert_eq!(
            all,
            [
                ("podset", StatusShape::GoPodSet, None),
                ("memcached", StatusShape::GoMemcached, None),
                ("lolcow", StatusShape::GoLolcow, Some("lolcow-image")),
                (
                    "pulsarconsumer",
                    StatusShape::GoPulsarConsumer,
                    Some("consumer-image")
                ),
            ]
        );
        // A flag for exactly the kinds whose children run an app of this workspace.
        for op in Operator::ALL {
            assert_eq!(image_flag(op).is_some(), op.kind().workload.is_some());
        }
    }

    #[test]
    fn a_named_binary_must_exist() {
        let missing = std::env::temp_dir().join("no-such-go-ref-binary");
        assert!(binary(Some(&missing)).is_err());
    }
}
