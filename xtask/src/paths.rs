//! Where things live: the repository, the build cache and the runtime state.
//!
//! Big artifacts (the control-plane binaries, the Pulsar broker) are cached
//! outside the repository, keyed by version, so a fresh clone on the same
//! machine reuses them. Runtime state (certificates, etcd data, logs, pid
//! files) lives in the user's state directory and is removed by `down`.

use std::path::PathBuf;

/// The project's name in cache and state paths.
const PROJECT: &str = "rust-operators";

/// The repository root (the parent of the `xtask` crate).
pub fn repo_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
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
