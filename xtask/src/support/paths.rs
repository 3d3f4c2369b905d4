//! Where things live: the repository, the build cache and the runtime state.
//!
//! Big artifacts (the control-plane binaries, the Pulsar broker) are cached
//! outside the repository, keyed by version, so a fresh clone on the same
//! machine reuses them. Runtime state (certificates, etcd data, logs, pid
//! files) lives in the user's state directory and is removed by `down`.

use std::path::{Path, PathBuf};

/// The project's name in cache and state paths.
const PROJECT: &str = "rust-operators";

/// The repository root (the parent of the `xtask` crate).
///
/// Found at run time first, from the `CARGO_MANIFEST_DIR` that cargo sets for what it runs
/// (`cargo xtask`, `cargo test`): cargo keys its fingerprints to paths relative to the
/// workspace, so a checkout that was moved or copied with its modification times reuses a
/// build whose compile-time path still names the old place, and `cargo xtask new` would
/// write there. The compile-time path is the fallback for a binary run by hand.
pub fn repo_root() -> PathBuf {
    let is_root = |dir: &Path| dir.join("xtask").join("Cargo.toml").is_file();
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .and_then(|dir| dir.ancestors().find(|d| is_root(d)).map(Path::to_path_buf))
        .unwrap_or_else(|| {
            let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            manifest.parent().map(PathBuf::from).unwrap_or(manifest)
        })
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from)
}

fn xdg(var: &str, fallback: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => home().join(fallback),
    }
}

/// `$XDG_CACHE_HOME/rust-operators/<sub>` (default `~/.cache/...`).
pub fn cache_dir(sub: &str) -> PathBuf {
    xdg("XDG_CACHE_HOME", ".cache").join(PROJECT).join(sub)
}

/// `$XDG_STATE_HOME/rust-operators/<sub>` (default `~/.local/state/...`).
pub fn state_dir(sub: &str) -> PathBuf {
    xdg("XDG_STATE_HOME", ".local/state")
        .join(PROJECT)
        .join(sub)
}

/// The cargo target directory of the workspace.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => repo_root().join("target"),
    }
}
