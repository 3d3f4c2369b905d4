//! What is in an image: an SPDX 2.3 document (JSON) per platform, listing the crates
//! linked into its binary, each with its version, its source (the crates.io download,
//! its `.crate` checksum from `Cargo.lock`), its declared license and its package URL
//! (`pkg:cargo/<name>@<version>`), and who depends on whom.
//!
//! The crates are cargo's own answer for the build that made the binary: `cargo tree`
//! with the same packages selected together (their features unify as in that build) and
//! the same `--target`, normal dependencies only and no proc-macros (build scripts and
//! macros run at build time and are not linked).
//!
//! `oci::attach_sbom` stores it beside the image in the OCI layout as an OCI 1.1
//! artifact (`artifactType: application/spdx+json`) whose `subject` is the platform's
//! manifest, so `oras discover` lists it as a referrer of the image.

use super::{Package, Platform, rfc3339};
use anyhow::{Context, Result, bail};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use xtask::support::{cmd, paths};

/// The media type of the document, and the artifact's `artifactType`.
pub const MEDIA_TYPE: &str = "application/spdx+json";

/// One crate linked into the binary.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Crate {
    /// The crate's name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// Where it comes from: `None` for crates.io, else what cargo shows (a path or a
    /// git URL).
    pub origin: Option<String>,
    /// Its declared license (cargo's `license` field), if any.
    pub license: Option<String>,
}

/// The crates of the binary `name` and who depends on whom (indices into the list;
/// the binary's own crate is first), from `cargo tree` as the binary was built.
pub struct Tree {
    /// Every crate once, the binary's own first.
    pub crates: Vec<Crate>,
    /// `(dependent, dependency)` pairs.
    pub edges: BTreeSet<(usize, usize)>,
}

/// `cargo tree` for `name` built for `triple` together with `built_with`.
///
/// # Errors
/// When cargo fails or the binary's crate is not in its answer.
pub fn linked_crates(name: &str, triple: &str, built_with: &[&str]) -> Result<Tree> {
    let mut tree = cmd::cargo();
    // --no-dedupe: with several packages, cargo prints a crate's dependencies once,
    // under the first package that has it; each binary's tree must be whole.
    tree.current_dir(paths::repo_root()).args([
        "tree",
        "--no-dedupe",
        "--edges",
        "normal,no-proc-macro",
        "--target",
        triple,
        "--prefix",
        "depth",
        "--format",
        "{p}|{l}",
        "--charset",
        "ascii",
    ]);
    for package in built_with {
        tree.args(["-p", package]);
    }
    parse_tree(&cmd::output(&mut tree)?, name)
}

/// Parses `cargo tree --prefix depth --format '{p}|{l}'` and keeps the tree of `root`.
fn parse_tree(text: &str, root: &str) -> Result<Tree> {
    let mut crates: Vec<Crate> = Vec::new();
    let mut edges = BTreeSet::new();
    // The chain of crates from the root to the current line, by depth.
    let mut chain: Vec<usize> = Vec::new();
    let mut inside = false;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let digits = line.bytes().take_while(u8::is_ascii_digit).count();
        let depth: usize = line[..digits]
            .parse()
            .context("a cargo tree line without its depth")?;
        if depth == 0 {
            inside = crate_of(&line[digits..])?.name == root;
            chain.clear();
        }
        if !inside {
            continue;
        }
        let krate = crate_of(&line[digits..])?;
        let index = match crates.iter().position(|c| *c == krate) {
            Some(i) => i,
            None => {
                crates.push(krate);
                crates.len() - 1
            }
        };
        chain.truncate(depth);
        if let Some(parent) = chain.last() {
            edges.insert((*parent, index));
        }
        chain.push(index);
    }
    if crates.is_empty() {
        bail!("cargo tree does not list {root}");
    }
    Ok(Tree { crates, edges })
}

/// `name vX.Y.Z[ (origin)]|license[ (*)]`.
fn crate_of(text: &str) -> Result<Crate> {
    let text = text.trim_end().trim_end_matches("(*)").trim_end();
    let (package, license) = text.split_once('|').unwrap_or((text, ""));
    let (name, rest) = package
        .split_once(" v")
        .with_context(|| format!("cannot read the crate of {package:?}"))?;
    let (version, origin) = match rest.split_once(" (") {
        Some((v, o)) => (v, Some(o.trim_end_matches(')').to_owned())),
        None => (rest, None),
    };
    Ok(Crate {
        name: name.to_owned(),
        version: version.to_owned(),
        origin,
        license: Some(license.trim().to_owned()).filter(|l| !l.is_empty()),
    })
}

/// The `.crate` checksums of `Cargo.lock`, by `(name, version)`.
pub fn lock_checksums(lock: &str) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    for block in lock.split("[[package]]") {
        let field = |key: &str| {
            block.lines().find_map(|l| {
                let (k, v) = l.split_once(" = ")?;
                (k.trim() == key).then(|| v.trim().trim_matches('"').to_owned())
            })
        };
        if let (Some(name), Some(version), Some(sum)) =
            (field("name"), field("version"), field("checksum"))
        {
            out.insert((name, version), sum);
        }
    }
    out
}

/// A license expression as SPDX writes it (`MIT/Apache-2.0`, an old cargo form, is
/// `MIT OR Apache-2.0`); `NOASSERTION` when the crate declares none.
fn spdx_license(license: Option<&str>) -> String {
    match license {
        None => "NOASSERTION".to_owned(),
        Some(l) if l.contains('/') && !l.contains(" OR ") => {
            l.split('/').map(str::trim).collect::<Vec<_>>().join(" OR ")
        }
        Some(l) => l.to_owned(),
    }
}

/// An SPDX identifier: letters, digits, `.` and `-` only.
fn spdx_id(index: usize, name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("SPDXRef-Package-{index}-{clean}")
}

/// What the document describes besides the crates.
pub struct Subject<'a> {
    /// The binary (= image) name.
    pub name: &'a str,
    /// Its package (version, source, license).
    pub package: &'a Package,
    /// The platform it was built for.
    pub platform: Platform,
    /// `sha256:...` of the binary.
    pub binary_digest: &'a str,
    /// Seconds since the epoch, for `created`.
    pub epoch: u64,
}

/// The SPDX 2.3 document (pure: same inputs, same bytes).
///
/// # Errors
/// When it cannot be serialized.
pub fn spdx(
    subject: &Subject,
    tree: &Tree,
    checksums: &BTreeMap<(String, String), String>,
) -> Result<Vec<u8>> {
    let hex = subject.binary_digest.trim_start_matches("sha256:");
    let arch = subject.platform.arch();
    let mut packages = Vec::new();
    for (index, krate) in tree.crates.iter().enumerate() {
        let root = index == 0;
        let mut package = json!({
            "name": krate.name,
            "SPDXID": spdx_id(index, &krate.name),
            "versionInfo": krate.version,
            "filesAnalyzed": false,
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": spdx_license(krate.license.as_deref()),
            "copyrightText": "NOASSERTION",
            "primaryPackagePurpose": if root { "APPLICATION" } else { "LIBRARY" },
        });
        match &krate.origin {
            // crates.io: its download, checksum and package URL.
            None => {
                package["downloadLocation"] = json!(format!(
                    "https://crates.io/api/v1/crates/{}/{}/download",
                    krate.name, krate.version
                ));
                package["externalRefs"] = json!([{
                    "referenceCategory": "PACKAGE-MANAGER",
                    "referenceType": "purl",
                    "referenceLocator": format!("pkg:cargo/{}@{}", krate.name, krate.version),
                }]);
                if let Some(sum) = checksums.get(&(krate.name.clone(), krate.version.clone())) {
                    package["checksums"] = json!([{"algorithm": "SHA256", "checksumValue": sum}]);
                }
            }
            // A git dependency: its URL. A path one: this repository's own code (no
            // package URL: `pkg:cargo/` names crates.io's crates).
            Some(origin) if origin.contains("://") => {
                package["downloadLocation"] = json!(format!("git+{origin}"));
            }
            Some(_) => {
                package["downloadLocation"] = json!(if subject.package.source.contains("://") {
                    subject.package.source.clone()
                } else {
                    "NOASSERTION".to_owned()
                });
            }
        }
        if root {
            package["checksums"] = json!([{"algorithm": "SHA256", "checksumValue": hex}]);
            package["comment"] = json!(format!(
                "/usr/local/bin/{} in the image, built for {}",
                subject.name, subject.platform
            ));
        }
        packages.push(package);
    }
    let id = |i: usize| spdx_id(i, &tree.crates[i].name);
    let mut relationships = vec![json!({
        "spdxElementId": "SPDXRef-DOCUMENT",
        "relationshipType": "DESCRIBES",
        "relatedSpdxElement": id(0),
    })];
    for (from, to) in &tree.edges {
        relationships.push(json!({
            "spdxElementId": id(*from),
            "relationshipType": "DEPENDS_ON",
            "relatedSpdxElement": id(*to),
        }));
    }
    let document = json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": format!("{}-{}-linux-{arch}", subject.name, subject.package.version),
        "documentNamespace": format!("https://spdx.org/spdxdocs/{}-{}-linux-{arch}-{hex}", subject.name, subject.package.version),
        "creationInfo": {
            "created": rfc3339(subject.epoch),
            "creators": ["Tool: cargo-xtask-image"],
            "comment": "The crates cargo links into the binary: cargo tree --edges normal,no-proc-macro for its build.",
        },
        "packages": packages,
        "relationships": relationships,
    });
    Ok(serde_json::to_vec_pretty(&document)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const TREE: &str = "\
0lolcow-web v0.1.0 (/r/operators/lolcow-operator/web)|Apache-2.0
1anyhow v1.0.104|MIT OR Apache-2.0
1axum v0.8.9|MIT
2bytes v1.12.1|MIT
0podset-operator v0.1.0 (/r/operators/podset-operator)|Apache-2.0
1kube v5.0.0|Apache-2.0
2bytes v1.12.1|MIT
2tokio v1.50.0|MIT
1shared v0.1.0 (/r/shared)|Apache-2.0
2bytes v1.12.1|MIT (*)
2old v0.1.0|MIT/Apache-2.0
";

    #[test]
    fn only_the_binarys_tree_is_kept_with_its_edges() -> Result<()> {
        let tree = parse_tree(TREE, "podset-operator")?;
        let names: Vec<&str> = tree.crates.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["podset-operator", "kube", "bytes", "tokio", "shared", "old"]
        );
        assert_eq!(tree.crates[4].origin.as_deref(), Some("/r/shared"));
        assert_eq!(tree.crates[1].origin, None);
        assert!(tree.edges.contains(&(0, 1)) && tree.edges.contains(&(1, 3)));
        assert!(
            tree.edges.contains(&(4, 2)),
            "shared -> bytes (a deduplicated line)"
        );
        assert!(!tree.edges.contains(&(0, 2)));
        assert!(parse_tree(TREE, "nope").is_err());
        Ok(())
    }

    #[test]
    fn the_document_names_versions_sources_licenses_and_package_urls() -> Result<()> {
        let tree = parse_tree(TREE, "podset-operator")?;
        let checksums = lock_checksums(
            "version = 4\n\n[[package]]\nname = \"kube\"\nversion = \"5.0.0\"\nsource = \"registry+https://github.com/rust-lang/crates.io-index\"\nchecksum = \"abc\"\n",
        );
        let package = Package {
            version: "0.1.0".into(),
            source: "https://example.org/repo".into(),
        };
        let subject = Subject {
            name: "podset-operator",
            package: &package,
            platform: Platform::AMD64,
            binary_digest: "sha256:00ff",
            epoch: 0,
        };
        let doc: Value = serde_json::from_slice(&spdx(&subject, &tree, &checksums)?)?;
        assert_eq!(doc["spdxVersion"], "SPDX-2.3");
        assert_eq!(doc["creationInfo"]["created"], "1970-01-01T00:00:00Z");
        let packages = doc["packages"].as_array().context("packages")?;
        let kube = packages
            .iter()
            .find(|p| p["name"] == "kube")
            .context("kube")?;
        assert_eq!(kube["versionInfo"], "5.0.0");
        assert_eq!(
            kube["externalRefs"][0]["referenceLocator"],
            "pkg:cargo/kube@5.0.0"
        );
        assert_eq!(kube["checksums"][0]["checksumValue"], "abc");
        assert_eq!(
            kube["downloadLocation"],
            "https://crates.io/api/v1/crates/kube/5.0.0/download"
        );
        let old = packages
            .iter()
            .find(|p| p["name"] == "old")
            .context("old")?;
        assert_eq!(old["licenseDeclared"], "MIT OR Apache-2.0");
        let shared = packages
            .iter()
            .find(|p| p["name"] == "shared")
            .context("shared")?;
        assert!(
            shared.get("externalRefs").is_none(),
            "no crates.io package URL for our own crates"
        );
        assert_eq!(packages[0]["primaryPackagePurpose"], "APPLICATION");
        assert_eq!(packages[0]["checksums"][0]["checksumValue"], "00ff");
        let relationships = doc["relationships"].as_array().context("relationships")?;
        assert_eq!(relationships[0]["relationshipType"], "DESCRIBES");
        assert!(
            relationships
                .iter()
                .any(|r| r["relationshipType"] == "DEPENDS_ON"
                    && r["spdxElementId"] == packages[0]["SPDXID"]
                    && r["relatedSpdxElement"] == kube["SPDXID"])
        );
        Ok(())
    }
}
