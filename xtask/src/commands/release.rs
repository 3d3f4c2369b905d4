//! `cargo xtask release <version>`: cuts a release in the working tree, ready to tag.
//!
//! 1. checks `<version>` (SemVer, after the current workspace version) and that the
//!    tree has nothing uncommitted (`--allow-dirty` to go on anyway);
//! 2. moves CHANGELOG.md's `Unreleased` section under `## [<version>] - <today>` (and
//!    its compare links), refusing an empty one;
//! 3. sets `[workspace.package] version` in Cargo.toml and the workspace's entries in
//!    Cargo.lock (`cargo update --workspace`);
//! 4. regenerates what is generated: the CRDs (`cargo xtask crds`), the kustomize trees'
//!    image tags and the installers (`cargo xtask installers`), and the charts
//!    ([`regenerate_charts`]);
//! 5. prints the `git commit` and `git tag` commands. It commits nothing: the release
//!    commit is reviewed like any other, and pushing the tag `v<version>` starts the
//!    release workflow (`.github/workflows/release.yml`).
//!
//! The string rewrites (version, changelog) are pure and unit-tested here and in
//! `version`.

use crate::commands::crds;
use crate::commands::installers;
use anyhow::{Context, Result, bail};
use std::cmp::Ordering;
use std::process::Command;
use xtask::say;
use xtask::support::cmd;
use xtask::support::paths;
use xtask::support::workspace_version::{self, Version};

/// Options of `cargo xtask release`.
#[derive(clap::Args, Debug)]
pub struct ReleaseArgs {
    /// The new version, SemVer without a `v` (e.g. `0.2.0`, `1.0.0-rc.1`); the tag will
    /// be `v<version>`.
    pub version: String,
    /// Go on although the working tree has uncommitted changes (they would end up in
    /// the release commit).
    #[arg(long)]
    pub allow_dirty: bool,
}

/// The changelog's file name at the repository root.
const CHANGELOG: &str = "CHANGELOG.md";

/// `cargo xtask release <version>`.
pub fn run(args: &ReleaseArgs) -> Result<()> {
    let new = Version::parse(&args.version, "the <version> argument")?;
    let current = workspace_version::workspace_version()?;
    if new.precedence(&current) != Ordering::Greater {
        bail!(
            "the <version> argument {new} is not after the current workspace version {current}: \
             a release must increase it"
        );
    }
    let root = paths::repo_root();
    if !args.allow_dirty {
        let status = cmd::output(
            Command::new("git")
                .current_dir(&root)
                .args(["status", "--porcelain"]),
        )?;
        if !status.trim().is_empty() {
            bail!(
                "the working tree has uncommitted changes; commit or stash them first (or pass \
                 --allow-dirty to include them in the release commit):\n{status}"
            );
        }
    }
    // Every check before the first write: a refused release changes nothing.
    let changelog_path = root.join(CHANGELOG);
    let changelog = std::fs::read_to_string(&changelog_path)
        .with_context(|| format!("reading {}", changelog_path.display()))?;
    let changelog = release_changelog(&changelog, &new, &xtask::support::cmd::today())?;
    let toml_path = root.join("Cargo.toml");
    let toml = std::fs::read_to_string(&toml_path)?;
    let toml = workspace_version::bump_workspace_version(&toml, &new)?;

    say!("release: {current} -> {new}");
    std::fs::write(&toml_path, toml)?;
    update_lock_file()?;
    let result = regenerate(&new).and_then(|()| {
        std::fs::write(&changelog_path, changelog)?;
        Ok(())
    });
    if let Err(e) = result {
        return Err(
            e.context("the release stopped half-way; `git checkout -- .` undoes what it changed")
        );
    }
    say!(
        "release: {CHANGELOG} dated, Cargo.toml and Cargo.lock at {new}, generated files regenerated"
    );
    say!("release: review the changes (git diff), then:");
    say!("  git commit -am \"Release v{new}\"");
    say!("  git tag -a v{new} -m \"v{new}\"");
    say!("  git push origin HEAD v{new}   # the tag starts .github/workflows/release.yml");
    Ok(())
}

/// `cargo update --workspace`: the lock file's entries of the workspace's own crates
/// take the new version (offline first: nothing else changes, nothing needs fetching).
fn update_lock_file() -> Result<()> {
    let update = |offline: bool| {
        let mut cargo = xtask::support::cmd::cargo();
        cargo
            .current_dir(paths::repo_root())
            .args(["update", "--workspace", "--quiet"]);
        if offline {
            cargo.arg("--offline");
        }
        cmd::run(&mut cargo)
    };
    update(true).or_else(|_| update(false))
}

/// Everything generated that carries the version or comes from the code.
fn regenerate(version: &Version) -> Result<()> {
    crds::run(false)?;
    installers::sync(&crds::deployed_operators(), version, false)?;
    regenerate_charts(version)
}

/// The charts (`deploy/<operator>/chart/`), regenerated from the kustomize trees that the
/// steps before have just moved to the new version.
///
/// # Errors
/// When a chart cannot be generated (`cargo xtask charts`).
pub fn regenerate_charts(_version: &Version) -> Result<()> {
    crate::commands::charts::run(false)
}

/// Whether `line` is a Markdown link reference definition (`[label]: url`).
fn is_link_definition(line: &str) -> bool {
    line.starts_with('[') && line.contains("]: ")
}

/// The version of a `## [x.y.z] - date` heading.
fn heading_version(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("## [")?;
    let (version, _) = rest.split_once(']')?;
    Some(version)
}

/// CHANGELOG.md (Keep a Changelog) with the `Unreleased` section's entries moved under a
/// new `## [<version>] - <date>` heading, an empty `Unreleased` above it, and the link
/// definitions at the bottom updated: `[Unreleased]` compares from the new tag, and the
/// new version links to its comparison with the previous one (or its tag, the first
/// time).
///
/// # Errors
/// When there is no `## [Unreleased]` heading, nothing under it, or `version` already
/// has a section.
pub fn release_changelog(text: &str, version: &Version, date: &str) -> Result<String> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim().eq_ignore_ascii_case("## [unreleased]"))
        .with_context(|| format!("{CHANGELOG} has no `## [Unreleased]` heading"))?;
    let new = version.to_string();
    if lines
        .iter()
        .any(|l| heading_version(l) == Some(new.as_str()))
    {
        bail!("{CHANGELOG} already has a section for {new}");
    }
    let end = lines[start + 1..]
        .iter()
        .position(|l| l.starts_with("## ") || is_link_definition(l))
        .map_or(lines.len(), |i| start + 1 + i);
    let body = &lines[start + 1..end];
    let first = body.iter().position(|l| !l.trim().is_empty());
    let last = body.iter().rposition(|l| !l.trim().is_empty());
    let (Some(first), Some(last)) = (first, last) else {
        bail!("{CHANGELOG}'s Unreleased section is empty: say what {new} changes there first");
    };
    let previous = lines[end..].iter().find_map(|l| heading_version(l));

    let mut out: Vec<String> = lines[..=start].iter().map(|l| (*l).to_owned()).collect();
    out.push(String::new());
    out.push(format!("## [{new}] - {date}"));
    out.push(String::new());
    out.extend(body[first..=last].iter().map(|l| (*l).to_owned()));
    out.push(String::new());
    for line in &lines[end..] {
        let Some(url) = line
            .strip_prefix("[Unreleased]: ")
            .or_else(|| line.strip_prefix("[unreleased]: "))
        else {
            out.push((*line).to_owned());
            continue;
        };
        let base = repository_url(url.trim());
        out.push(format!("[Unreleased]: {base}/compare/v{new}...HEAD"));
        out.push(match previous {
            Some(previous) => format!("[{new}]: {base}/compare/v{previous}...v{new}"),
            None => format!("[{new}]: {base}/releases/tag/v{new}"),
        });
    }
    let mut text_out = out.join("\n");
    text_out.push('\n');
    Ok(text_out)
}

/// The repository's URL from the `[Unreleased]` link (`<repo>/compare/...` or
/// `<repo>/commits/...`).
fn repository_url(link: &str) -> &str {
    for marker in ["/compare/", "/commits/", "/releases/", "/tree/"] {
        if let Some((base, _)) = link.split_once(marker) {
            return base;
        }
    }
    link.trim_end_matches('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> Version {
        Version::parse(text, "test").unwrap()
    }

    const FIRST: &str = "# Changelog\n\nIntro.\n\n## [Unreleased]\n\n### Added\n\n- Everything.\n\n[Unreleased]: https://github.com/o/r/commits/main\n";

    #[test]
    fn the_first_release_takes_the_unreleased_entries() -> Result<()> {
        let out = release_changelog(FIRST, &v("0.1.0"), "2026-11-25")?;
        assert_eq!(
            out,
            "# Changelog\n\nIntro.\n\n## [Unreleased]\n\n## [0.1.0] - 2026-11-25\n\n### Added\n\n- Everything.\n\n\
             [Unreleased]: https://github.com/o/r/compare/v0.1.0...HEAD\n\
             [0.1.0]: https://github.com/o/r/releases/tag/v0.1.0\n"
        );
        Ok(())
    }

    #[test]
    fn a_later_release_links_its_comparison_with_the_previous_one() -> Result<()> {
        let once = release_changelog(FIRST, &v("0.1.0"), "2026-11-25")?;
        let entries = once.replace(
            "## [Unreleased]\n",
            "## [Unreleased]\n\n### Fixed\n\n- A bug.\n",
        );
        let out = release_changelog(&entries, &v("0.2.0-rc.1"), "2026-12-01")?;
        let expected = "## [Unreleased]\n\n## [0.2.0-rc.1] - 2026-12-01\n\n### Fixed\n\n- A bug.\n\n## [0.1.0] - 2026-11-25\n";
        assert!(out.contains(expected), "{out}");
        assert!(out.contains("[Unreleased]: https://github.com/o/r/compare/v0.2.0-rc.1...HEAD\n"));
        assert!(
            out.contains("[0.2.0-rc.1]: https://github.com/o/r/compare/v0.1.0...v0.2.0-rc.1\n")
        );
        assert!(out.contains("[0.1.0]: https://github.com/o/r/releases/tag/v0.1.0\n"));
        // Released twice: refused, the file is left to the caller unchanged.
        let err = release_changelog(&out, &v("0.2.0-rc.1"), "2026-12-02").unwrap_err();
        assert!(err.to_string().contains("already has a section"), "{err}");
        Ok(())
    }

    #[test]
    fn an_empty_unreleased_section_or_none_is_refused() {
        let empty = "# Changelog\n\n## [Unreleased]\n\n## [0.1.0] - 2026-11-25\n\n- x\n";
        let err = release_changelog(empty, &v("0.2.0"), "d").unwrap_err();
        assert!(
            err.to_string().contains("Unreleased section is empty"),
            "{err}"
        );
        let err = release_changelog("# Changelog\n", &v("0.2.0"), "d").unwrap_err();
        assert!(err.to_string().contains("no `## [Unreleased]`"), "{err}");
    }

    #[test]
    fn today_is_a_date() {
        let d = xtask::support::cmd::today();
        assert_eq!(d.len(), 10, "{d}");
        assert_eq!(d.as_bytes()[4], b'-');
    }

    /// The committed changelog can be released as it is.
    #[test]
    fn the_repository_changelog_has_entries_to_release() -> Result<()> {
        let text = std::fs::read_to_string(paths::repo_root().join(CHANGELOG))?;
        let next = Version::parse("99.0.0", "test")?;
        let out = release_changelog(&text, &next, "2099-01-01")?;
        assert!(out.contains("## [99.0.0] - 2099-01-01"));
        Ok(())
    }
}
