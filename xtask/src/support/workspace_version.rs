//! The one version of the workspace (`[workspace.package] version` in the root
//! `Cargo.toml`) and the places that carry it besides the crates: the image tags in
//! each `deploy/<operator>/kustomization.yaml` and the workload images the operators'
//! Deployments name (`LOLCOW_IMAGE`, `PULSAR_CONSUMER_IMAGE`). Everything here works on
//! strings, so it is unit-tested without touching a file; `release` and `installers`
//! do the reading and writing.

use anyhow::{Context, Result, bail};
use std::cmp::Ordering;
use std::fmt;

/// A Semantic Versioning 2.0.0 version: `MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// MAJOR.
    pub major: u64,
    /// MINOR.
    pub minor: u64,
    /// PATCH.
    pub patch: u64,
    /// The dot-separated pre-release identifiers (empty for a release).
    pub pre: Vec<String>,
    /// The build metadata (ignored in comparisons, as SemVer says).
    pub build: Option<String>,
}

/// Whether `id` is a SemVer identifier: `[0-9A-Za-z-]+`.
fn is_identifier(id: &str) -> bool {
    !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// A numeric identifier without a leading zero (`0` itself is fine).
fn numeric(part: &str) -> Option<u64> {
    if part.is_empty() || !part.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    if part.len() > 1 && part.starts_with('0') {
        return None;
    }
    part.parse().ok()
}

impl Version {
    /// Parses `text` as a SemVer version. `what` names where it came from (`the
    /// <version> argument`, `Cargo.toml`) in the error.
    ///
    /// # Errors
    /// When `text` is not `MAJOR.MINOR.PATCH[-PRE][+BUILD]` with numbers without
    /// leading zeros; a leading `v` gets its own hint (that is the tag, not the version).
    pub fn parse(text: &str, what: &str) -> Result<Version> {
        let fail = |why: &str| -> Result<Version> {
            bail!(
                "{what} {text:?} is not a semantic version (MAJOR.MINOR.PATCH, e.g. 1.2.3 or \
                 1.2.3-rc.1, see https://semver.org): {why}"
            )
        };
        if text.starts_with(['v', 'V']) {
            return fail("write it without the leading `v` (the git tag is v<version>)");
        }
        let (rest, build) = match text.split_once('+') {
            Some((rest, build)) => {
                if !build.split('.').all(is_identifier) {
                    return fail(
                        "the build metadata after `+` must be dot-separated [0-9A-Za-z-]+",
                    );
                }
                (rest, Some(build.to_owned()))
            }
            None => (text, None),
        };
        let (core, pre) = match rest.split_once('-') {
            Some((core, pre)) => {
                let ids: Vec<&str> = pre.split('.').collect();
                if !ids.iter().all(|id| is_identifier(id)) {
                    return fail("the pre-release after `-` must be dot-separated [0-9A-Za-z-]+");
                }
                if ids
                    .iter()
                    .any(|id| id.chars().all(|c| c.is_ascii_digit()) && numeric(id).is_none())
                {
                    return fail("a numeric pre-release identifier has a leading zero");
                }
                (core, ids.into_iter().map(str::to_owned).collect())
            }
            None => (rest, Vec::new()),
        };
        let parts: Vec<&str> = core.split('.').collect();
        let [major, minor, patch] = parts.as_slice() else {
            return fail("it needs exactly three numbers separated by dots");
        };
        let (Some(major), Some(minor), Some(patch)) =
            (numeric(major), numeric(minor), numeric(patch))
        else {
            return fail("MAJOR, MINOR and PATCH must be numbers without leading zeros");
        };
        Ok(Version {
            major,
            minor,
            patch,
            pre,
            build,
        })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        if !self.pre.is_empty() {
            write!(f, "-{}", self.pre.join("."))?;
        }
        if let Some(build) = &self.build {
            write!(f, "+{build}")?;
        }
        Ok(())
    }
}

impl Version {
    /// SemVer precedence (build metadata ignored): a pre-release comes before its
    /// release; pre-release identifiers compare numerically when both are numbers,
    /// numbers before words, and a longer list after its prefix.
    pub fn precedence(&self, other: &Version) -> Ordering {
        let core =
            (self.major, self.minor, self.patch).cmp(&(other.major, other.minor, other.patch));
        if core != Ordering::Equal {
            return core;
        }
        match (self.pre.is_empty(), other.pre.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Greater,
            (false, true) => return Ordering::Less,
            (false, false) => {}
        }
        for (a, b) in self.pre.iter().zip(&other.pre) {
            let order = match (numeric(a), numeric(b)) {
                (Some(x), Some(y)) => x.cmp(&y),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => a.cmp(b),
            };
            if order != Ordering::Equal {
                return order;
            }
        }
        self.pre.len().cmp(&other.pre.len())
    }
}

/// The line range (start, end: exclusive) of the TOML table `[name]` in `toml`: from
/// its header to the next table header.
fn table_lines(lines: &[&str], name: &str) -> Option<(usize, usize)> {
    let header = format!("[{name}]");
    let start = lines.iter().position(|l| l.trim() == header)?;
    let end = lines[start + 1..]
        .iter()
        .position(|l| l.trim_start().starts_with('['))
        .map_or(lines.len(), |i| start + 1 + i);
    Some((start, end))
}

/// The `version = "..."` line of `[workspace.package]`: its index and value.
fn workspace_version_line(lines: &[&str]) -> Result<(usize, String)> {
    let (start, end) = table_lines(lines, "workspace.package")
        .context("Cargo.toml has no [workspace.package] table")?;
    for (i, line) in lines.iter().enumerate().take(end).skip(start + 1) {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if key.trim() == "version" {
            let value = value.trim();
            let unquoted = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .with_context(|| {
                    format!(
                        "Cargo.toml: [workspace.package] version = {value} is not a quoted string"
                    )
                })?;
            return Ok((i, unquoted.to_owned()));
        }
    }
    bail!("Cargo.toml: [workspace.package] has no `version = \"...\"`")
}

/// The workspace version in the text of the root `Cargo.toml`.
///
/// # Errors
/// When `[workspace.package]` has no version, or it is not SemVer.
fn workspace_version_in(toml: &str) -> Result<Version> {
    let lines: Vec<&str> = toml.lines().collect();
    let (_, value) = workspace_version_line(&lines)?;
    Version::parse(&value, "Cargo.toml's [workspace.package] version")
}

/// The root `Cargo.toml` with `[workspace.package] version` set to `version` (every
/// other line as it was).
///
/// # Errors
/// When `[workspace.package]` has no version line.
pub fn bump_workspace_version(toml: &str, version: &Version) -> Result<String> {
    let lines: Vec<&str> = toml.lines().collect();
    let (index, _) = workspace_version_line(&lines)?;
    let indent: String = lines[index]
        .chars()
        .take_while(|c| c.is_whitespace())
        .collect();
    let mut out: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
    out[index] = format!("{indent}version = \"{version}\"");
    Ok(join_lines(&out, toml))
}

/// Joins `lines` with `\n`, ending with one when `original` did.
fn join_lines(lines: &[String], original: &str) -> String {
    let mut text = lines.join("\n");
    if original.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// The workspace version of this checkout (read from the root `Cargo.toml` now, not
/// when xtask was built: `release` changes it while running).
///
/// # Errors
/// When the file cannot be read or holds no SemVer workspace version.
pub fn workspace_version() -> Result<Version> {
    let path = crate::support::paths::repo_root().join("Cargo.toml");
    let toml =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    workspace_version_in(&toml)
}

/// `deploy/<operator>/kustomization.yaml` with the `newTag` of its `images:` entry
/// named `image` set to `tag`.
///
/// # Errors
/// When the file has no `images:` entry for `image` with a `newTag`.
pub fn set_kustomization_tag(text: &str, image: &str, tag: &str) -> Result<String> {
    let mut out: Vec<String> = Vec::new();
    let mut in_entry = false;
    let mut done = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(name) = trimmed.strip_prefix("- name:") {
            in_entry = name.trim() == image;
        }
        if in_entry && !done && trimmed.starts_with("newTag:") {
            let indent = &line[..line.len() - trimmed.len()];
            out.push(format!("{indent}newTag: {tag}"));
            done = true;
            continue;
        }
        out.push(line.to_owned());
    }
    if !done {
        bail!("no `images:` entry named {image} with a `newTag:`");
    }
    Ok(join_lines(&out, text))
}

/// A manifest with every `<field>: <image>:<tag>` line (a container's `image:`, or the
/// `value:` of the operator's environment variable naming its workload image) set to
/// `<image>:<new tag>`.
///
/// # Errors
/// When no such line is there.
pub fn set_reference_tag(text: &str, field: &str, image: &str, tag: &str) -> Result<String> {
    let mut found = false;
    let key = format!("{field}:");
    let prefix = format!("{image}:");
    let out: Vec<String> = text
        .lines()
        .map(|line| {
            let trimmed = line.trim_start();
            match trimmed.strip_prefix(&key) {
                Some(value) if value.trim().starts_with(&prefix) => {
                    found = true;
                    let indent = &line[..line.len() - trimmed.len()];
                    format!("{indent}{field}: {image}:{tag}")
                }
                _ => line.to_owned(),
            }
        })
        .collect();
    if !found {
        bail!("no `{field}: {image}:<tag>` line");
    }
    Ok(join_lines(&out, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> Version {
        Version::parse(text, "test").unwrap_or_else(|e| panic!("{e:#}"))
    }

    #[test]
    fn parses_semantic_versions() {
        let full = v("1.2.3-rc.1+build.5");
        assert_eq!((full.major, full.minor, full.patch), (1, 2, 3));
        assert_eq!(full.pre, ["rc", "1"]);
        assert_eq!(full.build.as_deref(), Some("build.5"));
        assert_eq!(full.to_string(), "1.2.3-rc.1+build.5");
        assert_eq!(v("0.1.0").to_string(), "0.1.0");
        assert_eq!(v("10.20.30-alpha-1.0").pre, ["alpha-1", "0"]);
    }

    #[test]
    fn rejects_what_is_not_semver_naming_the_argument() {
        for bad in [
            "",
            "1",
            "1.2",
            "1.2.3.4",
            "01.2.3",
            "1.02.3",
            "1.2.x",
            "v1.2.3",
            "1.2.3-",
            "1.2.3-01",
            "1.2.3-a..b",
            "1.2.3+",
            "1.2.3-a_b",
            " 1.2.3",
        ] {
            let err = Version::parse(bad, "the <version> argument")
                .err()
                .unwrap_or_else(|| panic!("{bad:?} was accepted"));
            let text = format!("{err:#}");
            assert!(
                text.starts_with(&format!("the <version> argument {bad:?}")),
                "{text}"
            );
        }
        let hint = Version::parse("v1.0.0", "arg").map(|_| ()).unwrap_err();
        assert!(
            hint.to_string().contains("without the leading `v`"),
            "{hint}"
        );
    }

    #[test]
    fn orders_by_semver_precedence() {
        // The example chain of the SemVer specification, section 11.
        let chain = [
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-alpha.beta",
            "1.0.0-beta",
            "1.0.0-beta.2",
            "1.0.0-beta.11",
            "1.0.0-rc.1",
            "1.0.0",
            "1.0.1",
            "1.1.0",
            "2.0.0",
        ];
        for pair in chain.windows(2) {
            assert_eq!(
                v(pair[0]).precedence(&v(pair[1])),
                Ordering::Less,
                "{pair:?}"
            );
            assert_eq!(
                v(pair[1]).precedence(&v(pair[0])),
                Ordering::Greater,
                "{pair:?}"
            );
        }
        assert_eq!(v("1.0.0+a").precedence(&v("1.0.0+b")), Ordering::Equal);
    }

    const CARGO_TOML: &str = "[workspace]\nmembers = [\"a\"]\n\n[workspace.package]\nedition = \"2024\"\nversion = \"0.1.0\"\n\n[workspace.dependencies]\nversion = \"9.9.9\"\n";

    #[test]
    fn bumps_the_workspace_version_only() -> Result<()> {
        assert_eq!(workspace_version_in(CARGO_TOML)?, v("0.1.0"));
        let bumped = bump_workspace_version(CARGO_TOML, &v("0.2.0-rc.1"))?;
        assert_eq!(
            bumped,
            CARGO_TOML.replace("version = \"0.1.0\"", "version = \"0.2.0-rc.1\"")
        );
        // The dependency table's `version` key is not the workspace's.
        assert!(bumped.contains("version = \"9.9.9\""));
        assert_eq!(workspace_version_in(&bumped)?, v("0.2.0-rc.1"));
        assert!(bump_workspace_version("[workspace]\n", &v("1.0.0")).is_err());
        assert!(workspace_version_in("[workspace.package]\nversion = \"1.0\"\n").is_err());
        Ok(())
    }

    #[test]
    fn sets_the_image_tag_of_one_kustomization_entry() -> Result<()> {
        let text = "images:\n  - name: other\n    newTag: keep\n  - name: podset-operator\n    newName: podset-operator\n    newTag: latest\n";
        let out = set_kustomization_tag(text, "podset-operator", "0.2.0")?;
        assert_eq!(out, text.replace("newTag: latest", "newTag: 0.2.0"));
        assert!(out.contains("newTag: keep"));
        assert!(set_kustomization_tag(text, "missing", "1.0.0").is_err());
        Ok(())
    }

    #[test]
    fn sets_the_workload_image_tag() -> Result<()> {
        let text = "          env:\n            - name: LOLCOW_IMAGE\n              value: lolcow-web:latest\n            - name: OTHER\n              value: busybox:1\n";
        let out = set_reference_tag(text, "value", "lolcow-web", "0.2.0")?;
        assert_eq!(out, text.replace("lolcow-web:latest", "lolcow-web:0.2.0"));
        assert!(set_reference_tag(text, "value", "pulsar-consumer", "1.0.0").is_err());
        // Another field, or an image whose name only starts the same, is left alone.
        assert!(set_reference_tag(text, "image", "lolcow-web", "1.0.0").is_err());
        assert!(set_reference_tag(text, "value", "lolcow", "1.0.0").is_err());
        let container = "        - name: operator\n          image: lolcow-operator:latest\n";
        assert_eq!(
            set_reference_tag(container, "image", "lolcow-operator", "0.2.0")?,
            container.replace(":latest", ":0.2.0")
        );
        Ok(())
    }

    /// Every crate of the workspace takes its version and license from the workspace,
    /// which says Apache-2.0, as the LICENSE file at the root does.
    #[test]
    fn every_crate_carries_the_workspace_version_and_license() -> Result<()> {
        let root = crate::support::paths::repo_root();
        let toml = std::fs::read_to_string(root.join("Cargo.toml"))?;
        assert!(toml.contains("license = \"Apache-2.0\""));
        let license = std::fs::read_to_string(root.join("LICENSE"))?;
        assert!(
            license.contains("Apache License") && license.contains("Version 2.0, January 2004")
        );
        let lines: Vec<&str> = toml.lines().collect();
        let (start, end) = table_lines(&lines, "workspace").context("[workspace]")?;
        let members: Vec<&str> = lines[start..end]
            .iter()
            .skip_while(|l| !l.trim_start().starts_with("members"))
            .take_while(|l| !l.trim_start().starts_with(']'))
            .filter_map(|l| l.trim().strip_prefix('"')?.split('"').next())
            .collect();
        assert!(members.len() >= 9, "{members:?}");
        for member in members {
            let text = std::fs::read_to_string(root.join(member).join("Cargo.toml"))?;
            for key in ["version.workspace = true", "license.workspace = true"] {
                assert!(text.contains(key), "{member}/Cargo.toml lacks `{key}`");
            }
        }
        Ok(())
    }
}
