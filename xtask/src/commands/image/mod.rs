//! `cargo xtask image <name> [--platform linux/amd64,linux/arm64] [--push
//! <registry>] [--tag <tag>]`: an OCI image of one binary of the workspace,
//! built without Docker, for linux/amd64 and linux/arm64 by default.
//!
//! With several platforms the image is an OCI image index listing one
//! manifest (config + layer) per platform; its digest is the image's digest.
//! With one platform it is that platform's manifest alone. The platforms
//! other than the build machine's are cross-compiled (Debian's cross C
//! compiler and libc, installed when missing).
//!
//! The binary is a fully static release build (glibc with `+crt-static`; TLS
//! is rustls, so nothing else is needed at run time). The image has one layer
//! on an empty base: the binary at `/usr/local/bin/<name>`, the build
//! machine's CA bundle, and `/etc/passwd` + `/etc/group` naming the non-root
//! user 65532 it runs as. The layer tar, its gzip stream and the JSON
//! documents are written here, deterministically: the same binary and CA
//! bundle always give the same manifest digest (timestamps are 0, or
//! `SOURCE_DATE_EPOCH` when set).
//!
//! Output: the OCI image layout `target/images/<name>/` and the same as one
//! archive, `target/images/<name>.oci.tar` (what `skopeo`, `umoci`,
//! `podman load` and `ctr import` read). `--push` copies it to a registry with
//! `skopeo`.
//!
//! Beside each platform's manifest the layout holds its SBOM (`sbom`): an SPDX 2.3
//! document of the crates linked into that binary, as an OCI 1.1 artifact whose
//! `subject` is the manifest, listed (untagged) in `index.json`. `oras discover` finds
//! it there; `--push` copies it after the image with oras (built from its Go module),
//! so the registry serves it as a referrer of the image (or, on a registry without the
//! referrers API, under the fallback tag `sha256-<digest>`).

mod elf;
mod oci;
mod sbom;
pub mod system;
mod tar;
use oci::*;
use xtask::say;

use anyhow::{Context, Result, bail};
use flate2::{Compression, GzBuilder};
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use xtask::support::cmd;
use xtask::support::operators::OPERATORS;
use xtask::support::paths;

/// Where the CA bundle comes from (Debian's `ca-certificates`) and goes to.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The user the image runs as (the conventional distroless `nonroot`).
const USER: &str = "65532:65532";

const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// An OS/architecture pair of an image (`linux/amd64`, `linux/arm64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Platform {
    /// The OCI architecture name.
    pub arch: Arch,
}

/// The architectures images are built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// x86-64.
    Amd64,
    /// 64-bit ARM.
    Arm64,
}

impl Platform {
    /// linux/amd64.
    pub const AMD64: Platform = Platform { arch: Arch::Amd64 };
    /// linux/arm64.
    pub const ARM64: Platform = Platform { arch: Arch::Arm64 };

    /// The build machine's platform.
    pub fn host() -> Result<Platform> {
        match std::env::consts::ARCH {
            "x86_64" => Ok(Platform::AMD64),
            "aarch64" => Ok(Platform::ARM64),
            other => bail!("images: unsupported architecture {other}"),
        }
    }

    /// The OCI architecture (`amd64`, `arm64`).
    pub fn arch(self) -> &'static str {
        match self.arch {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The Rust target triple (gnu; linked with a static C runtime).
    pub fn triple(self) -> &'static str {
        match self.arch {
            Arch::Amd64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// The cross C compiler (linker) for this platform and the Debian
    /// packages of it and of its libc.
    fn cross_toolchain(self) -> (&'static str, [(&'static str, &'static str); 2]) {
        match self.arch {
            Arch::Amd64 => (
                "x86_64-linux-gnu-gcc",
                [
                    ("x86_64-linux-gnu-gcc", "gcc-x86-64-linux-gnu"),
                    ("/usr/x86_64-linux-gnu/lib/libc.a", "libc6-dev-amd64-cross"),
                ],
            ),
            Arch::Arm64 => (
                "aarch64-linux-gnu-gcc",
                [
                    ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
                    ("/usr/aarch64-linux-gnu/lib/libc.a", "libc6-dev-arm64-cross"),
                ],
            ),
        }
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "linux/{}", self.arch())
    }
}

impl std::str::FromStr for Platform {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Platform> {
        match s.trim() {
            "linux/amd64" => Ok(Platform::AMD64),
            "linux/arm64" | "linux/arm64/v8" => Ok(Platform::ARM64),
            other => bail!("unsupported platform {other:?}: linux/amd64 or linux/arm64"),
        }
    }
}

/// Options of `cargo xtask image`.
#[derive(clap::Args)]
pub struct ImageArgs {
    /// The binary (= package) to pack: an operator, `lolcow-web` or `pulsar-consumer`.
    pub name: String,
    /// The platforms, comma-separated: `linux/amd64`, `linux/arm64`.
    #[arg(long, value_delimiter = ',', default_value = "linux/amd64,linux/arm64")]
    pub platform: Vec<Platform>,
    /// Push to this registry (`host:port`) as `<registry>/<name>:<tag>`.
    #[arg(long, value_name = "REGISTRY")]
    pub push: Option<String>,
    /// The tag (default: the package version).
    #[arg(long)]
    pub tag: Option<String>,
}

/// An image written to `target/images/`.
pub struct Image {
    /// The binary's name.
    pub name: String,
    /// The tag recorded in the layout's `index.json`.
    pub tag: String,
    /// `sha256:...` of the image index (several platforms) or of the
    /// manifest (one): the image's identity.
    pub digest: String,
    /// The OCI image layout directory.
    pub layout: PathBuf,
    /// The same layout as one tar file.
    pub archive: PathBuf,
    /// The platforms and their compressed layer plus config, in bytes (what
    /// a pull of that platform downloads).
    pub platforms: Vec<(String, u64)>,
    /// `sha256:...` of each SBOM artifact in the layout (one per platform).
    pub sboms: Vec<String>,
}

impl Image {
    /// The `oci:` transport reference of skopeo for this image.
    pub fn oci_ref(&self) -> String {
        format!("oci:{}:{}", self.layout.display(), self.tag)
    }
}

/// `cargo xtask image ...`.
pub fn run(args: &ImageArgs) -> Result<()> {
    let image = build_for(&args.name, args.tag.as_deref(), &args.platform)?;
    if let Some(registry) = &args.push {
        push(&image, registry)?;
    }
    Ok(())
}

/// Every binary that can be packed: the operators and the workload apps they run
/// (`xtask::support::operators`).
pub fn known() -> Vec<&'static str> {
    OPERATORS
        .into_iter()
        .chain(xtask::support::operators::workload_apps())
        .collect()
}

/// What `cargo metadata` says about a package.
struct Package {
    version: String,
    source: String,
}

fn package(name: &str) -> Result<Package> {
    let pkg = cmd::workspace_package(name)?;
    let version = pkg["version"].as_str().unwrap_or("0.0.0").to_owned();
    // The source: the package's `repository`, else the git remote, else the
    // package's folder in this repository.
    let source = match pkg["repository"].as_str() {
        Some(repo) => repo.to_owned(),
        None => git_origin().unwrap_or_else(|| {
            let manifest = PathBuf::from(pkg["manifest_path"].as_str().unwrap_or_default());
            let dir = manifest.parent().unwrap_or(&manifest);
            dir.strip_prefix(paths::repo_root())
                .unwrap_or(dir)
                .display()
                .to_string()
        }),
    };
    Ok(Package { version, source })
}

fn git_origin() -> Option<String> {
    cmd::output(
        Command::new("git")
            .current_dir(paths::repo_root())
            .args(["remote", "get-url", "origin"]),
    )
    .ok()
    .map(|s| s.trim().to_owned())
    .filter(|s| !s.is_empty())
}

/// Builds the static release binary for the build machine and returns its
/// path.
pub fn build_binary(name: &str) -> Result<PathBuf> {
    let triple = Platform::host()?.triple();
    // The workspace's own build needs (protoc), for `deploy` and `bench` on a fresh machine
    // as much as for `test` and `demo`.
    xtask::support::machine_packages::ensure_debian(&xtask::support::machine_packages::BUILD)?;
    say!("image: building {name} (release, static, {triple})");
    cmd::run(&mut binaries_build()?)?;
    checked_static(paths::target_dir().join(triple).join("release").join(name))
}

/// The `cargo build` of [`build_binary`]: every image binary for the build machine, static.
/// `cargo xtask test` runs the same command in the background (`test::Prebuild`), so the
/// deploys of its tests find the binaries built.
pub fn binaries_build() -> Result<Command> {
    let triple = Platform::host()?.triple();
    // With an explicit --target, RUSTFLAGS reach only the target's code, not
    // build scripts or proc-macros (which must stay dynamic).
    // Every image binary in one build: their dependencies are compiled once,
    // with one set of features, and the next image's build is a no-op.
    // `cargo xtask` (cargo run) and a test's `cargo test` set the crate's variables,
    // running ./target/debug/xtask does not: without them, all reuse one build.
    let mut cargo = cmd::cargo();
    cargo
        .current_dir(paths::repo_root())
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .args(["build", "--release", "--target", triple]);
    for package in known() {
        cargo.args(["-p", package]);
    }
    Ok(cargo)
}

/// Cross-compiles the static release binary `name` (that package alone) for
/// `platform` and returns its path. Installs the Rust target and Debian's
/// cross C compiler and libc when missing.
pub fn build_cross_binary(name: &str, platform: Platform) -> Result<PathBuf> {
    let triple = platform.triple();
    ensure_cross_toolchain(platform)?;
    say!(
        "image: building {name} (release, static, {triple}, with {})",
        platform.cross_toolchain().0
    );
    cmd::run(&mut cross_binary_build(name, platform))?;
    checked_static(paths::target_dir().join(triple).join("release").join(name))
}

/// What cross-compiling for `platform` needs: the workspace's build needs and Debian's
/// cross C compiler and libc (one `apt-get install`), and the Rust target.
pub fn ensure_cross_toolchain(platform: Platform) -> Result<()> {
    let (_, packages) = platform.cross_toolchain();
    xtask::support::machine_packages::ensure_debian(
        &[
            xtask::support::machine_packages::BUILD.as_slice(),
            &packages,
        ]
        .concat(),
    )?;
    ensure_rust_target(platform.triple())
}

/// The `cargo build` of [`build_cross_binary`], once [`ensure_cross_toolchain`] holds.
pub fn cross_binary_build(name: &str, platform: Platform) -> Command {
    let triple = platform.triple();
    let (linker, _) = platform.cross_toolchain();
    let upper = triple.to_uppercase().replace('-', "_");
    let lower = triple.replace('-', "_");
    let mut cargo = cmd::cargo();
    cargo
        .current_dir(paths::repo_root())
        .env(format!("CARGO_TARGET_{upper}_LINKER"), linker)
        .env(format!("CC_{lower}"), linker)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .args(["build", "--release", "--target", triple, "-p", name]);
    cargo
}

/// `rustup target add <triple>` unless it is installed.
fn ensure_rust_target(triple: &str) -> Result<()> {
    let installed = cmd::output(Command::new("rustup").args(["target", "list", "--installed"]))
        .context("listing the installed Rust targets (rustup)")?;
    if installed.lines().any(|l| l.trim() == triple) {
        return Ok(());
    }
    say!("deps: rustup target add {triple}");
    cmd::run(Command::new("rustup").args(["target", "add", triple]))
}

/// Fails unless `binary` is statically linked; returns its path.
fn checked_static(binary: PathBuf) -> Result<PathBuf> {
    let bytes = std::fs::read(&binary).with_context(|| format!("reading {}", binary.display()))?;
    match elf::linking(&bytes)? {
        elf::Linking::Static { pie } => {
            let how = if pie { "static-pie" } else { "static" };
            say!(
                "image: {} is {how} ({:.1} MB)",
                binary.display(),
                mb(bytes.len() as u64)
            );
        }
        elf::Linking::Dynamic(what) => bail!(
            "{} is dynamically linked ({what}); it would not start on an empty base image",
            binary.display()
        ),
    }
    Ok(binary)
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1_000_000.0
}

fn sha256(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// `SOURCE_DATE_EPOCH` when set, else 0: the time of every file and of `created`.
fn source_date_epoch() -> Result<u64> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds")),
        _ => Ok(0),
    }
}

/// RFC 3339 (UTC) for seconds since the epoch.
fn rfc3339(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The directory images are written to.
pub fn images_dir() -> PathBuf {
    paths::target_dir().join("images")
}

/// Builds the binary and writes its image, for the build machine's platform
/// alone, under `target/images/` (what `cargo xtask deploy` runs locally).
pub fn build(name: &str, tag: Option<&str>) -> Result<Image> {
    build_for(name, tag, &[Platform::host()?])
}

/// Builds the binary for each of `platforms` and writes the image under
/// `target/images/`: an image index over them (several platforms) or the
/// platform's manifest (one).
pub fn build_for(name: &str, tag: Option<&str>, platforms: &[Platform]) -> Result<Image> {
    let mut wanted: Vec<Platform> = Vec::new();
    for p in platforms {
        if !wanted.contains(p) {
            wanted.push(*p);
        }
    }
    if wanted.is_empty() {
        bail!("no platform to build for");
    }
    if !known().contains(&name) {
        bail!("unknown image {name:?}; one of: {}", known().join(", "));
    }
    let pkg = package(name)?;
    let tag = tag.unwrap_or(&pkg.version).to_owned();
    check_tag(&tag)?;
    let ca_bundle = std::fs::read(CA_BUNDLE).with_context(|| {
        format!("reading {CA_BUNDLE}: install the CA bundle first (Debian: apt-get install ca-certificates)")
    })?;
    let host = Platform::host()?;
    let epoch = source_date_epoch()?;
    let lock = std::fs::read_to_string(paths::repo_root().join("Cargo.lock"))
        .context("reading Cargo.lock")?;
    let checksums = sbom::lock_checksums(&lock);
    let mut images = Vec::new();
    for platform in wanted {
        // The host's build makes every image binary together; a cross build, this one.
        let (binary, built_with) = if platform == host {
            (build_binary(name)?, known())
        } else {
            (build_cross_binary(name, platform)?, vec![name])
        };
        let binary = std::fs::read(&binary)?;
        let mut image = assemble(
            name,
            platform,
            &tag,
            &pkg,
            &binary,
            ca_bundle.clone(),
            epoch,
        )?;
        let tree = sbom::linked_crates(name, platform.triple(), &built_with)?;
        let subject = sbom::Subject {
            name,
            package: &pkg,
            platform,
            binary_digest: &sha256(&binary),
            epoch,
        };
        let document = sbom::spdx(&subject, &tree, &checksums)?;
        say!(
            "image: SBOM of {name} {platform}: {} crates (SPDX 2.3)",
            tree.crates.len()
        );
        attach(
            &mut image,
            sbom::MEDIA_TYPE,
            &format!("{name}.spdx.json"),
            document,
            epoch,
        )?;
        images.push((platform, image));
    }
    let layout = if images.len() == 1 {
        images.remove(0).1
    } else {
        assemble_index(images, &tag)?
    };
    write_image(name, &tag, &layout)
}

/// Writes an assembled image under `target/images/<name>` (and `.oci.tar`).
fn write_image(name: &str, tag: &str, layout: &Layout) -> Result<Image> {
    let dir = images_dir().join(name);
    write_layout_dir(&dir, layout)?;
    let archive = images_dir().join(format!("{name}.oci.tar"));
    let tar = tar::archive(layout_entries(layout), source_date_epoch()?)?;
    let tmp = archive.with_extension("tar.tmp");
    std::fs::write(&tmp, tar)?;
    std::fs::rename(&tmp, &archive)?;
    let image = Image {
        name: name.to_owned(),
        tag: tag.to_owned(),
        digest: layout.manifest_digest.clone(),
        layout: dir,
        archive,
        platforms: layout.sizes.clone(),
        sboms: layout.referrers.iter().map(Referrer::digest).collect(),
    };
    let sizes: Vec<String> = image
        .platforms
        .iter()
        .map(|(platform, size)| format!("{platform} {:.2} MB", mb(*size)))
        .collect();
    say!(
        "image: {}:{} {} ({}: compressed layer + config)",
        image.name,
        image.tag,
        image.digest,
        sizes.join(", ")
    );
    say!("image: layout  {}", image.layout.display());
    say!("image: archive {}", image.archive.display());
    Ok(image)
}

/// Tags follow the registry rules: `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
pub(crate) fn check_tag(tag: &str) -> Result<()> {
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && !tag.starts_with(['.', '-'])
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !ok {
        bail!("{tag:?} is not a valid image tag");
    }
    Ok(())
}

/// Copies the image to `<registry>/<name>:<tag>` with skopeo and returns the
/// pushed reference, pinned by digest.
pub fn push(image: &Image, registry: &str) -> Result<String> {
    let registry = registry.trim_end_matches('/');
    push_to(image, &format!("{registry}/{}:{}", image.name, image.tag))
}

/// Copies the image to `dest` (`host:port/repository:tag`) with skopeo and
/// returns the pushed reference, pinned by digest.
pub fn push_to(image: &Image, dest: &str) -> Result<String> {
    xtask::support::machine_packages::ensure_debian(&[("skopeo", "skopeo")])?;
    let digest_file = images_dir().join(format!("{}.pushed-digest", image.name));
    cmd::run(Command::new("skopeo").args([
        "copy",
        "--quiet",
        // Every platform of the index, not just the host's: without it skopeo copies
        // the host's manifest alone and the registry's digest is not the index's.
        "--all",
        "--preserve-digests",
        "--dest-tls-verify=false",
        "--digestfile",
        &digest_file.to_string_lossy(),
        &image.oci_ref(),
        &format!("docker://{dest}"),
    ]))?;
    let pushed = std::fs::read_to_string(&digest_file)?.trim().to_owned();
    let _ = std::fs::remove_file(&digest_file);
    if pushed != image.digest {
        bail!(
            "the registry stored {pushed}, not the local manifest {}",
            image.digest
        );
    }
    let reference = format!("{dest}@{pushed}");
    say!("image: pushed {reference}");
    push_sboms(image, dest)?;
    Ok(reference)
}

/// Copies the image's SBOM artifacts to the repository of `dest` with oras, after the
/// image (their subjects must be there): skopeo copies an image, not its referrers.
/// Without Go to build oras it says so and goes on: the image itself is pushed.
fn push_sboms(image: &Image, dest: &str) -> Result<()> {
    if image.sboms.is_empty() {
        return Ok(());
    }
    let oras = match crate::commands::tool::oras() {
        Ok(oras) => oras,
        Err(e) => {
            say!("image: warning: the SBOM is not pushed ({e:#})");
            return Ok(());
        }
    };
    let repository = repository_of(dest);
    for sbom in &image.sboms {
        let mut copy = Command::new(&oras);
        copy.args(["copy", "--from-oci-layout"])
            .arg(format!("{}@{sbom}", image.layout.display()))
            // No tag: oras pushes it by digest.
            .arg(&repository);
        if is_loopback(&repository) {
            copy.arg("--to-plain-http");
        }
        cmd::output(&mut copy)
            .with_context(|| format!("pushing the SBOM {sbom} to {repository}"))?;
        say!("image: pushed its SBOM {repository}@{sbom}");
    }
    Ok(())
}

/// `host:port/path` of `host:port/path:tag` (or `@digest`).
fn repository_of(reference: &str) -> String {
    let rest = reference.split_once('@').map_or(reference, |(r, _)| r);
    let slash = rest.rfind('/').map_or(0, |i| i + 1);
    match rest[slash..].rfind(':') {
        Some(colon) => rest[..slash + colon].to_owned(),
        None => rest.to_owned(),
    }
}

/// Whether the registry of `repository` is on this machine (plain HTTP, as the local
/// cluster's and the tests' registries serve).
fn is_loopback(repository: &str) -> bool {
    let host = repository.split('/').next().unwrap_or_default();
    let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
    host == "localhost" || host.starts_with("127.") || host == "[::1]"
}

#[cfg(test)]
mod tests;
