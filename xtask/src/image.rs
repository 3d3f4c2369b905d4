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

mod elf;
pub mod system;
mod tar;

use crate::cmd;
use crate::crds;
use crate::paths;
use anyhow::{Context, Result, bail};
use flate2::{Compression, GzBuilder};
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The applications (not operators) that also ship as images.
pub const APPS: [&str; 2] = ["lolcow-web", "pulsar-consumer"];

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

/// Every binary that can be packed.
pub fn known() -> Vec<&'static str> {
    crds::OPERATORS.into_iter().chain(APPS).collect()
}

/// What `cargo metadata` says about a package.
struct Package {
    version: String,
    source: String,
}

fn package(name: &str) -> Result<Package> {
    let out = cmd::output(
        Command::new(env!("CARGO"))
            .current_dir(paths::repo_root())
            .args([
                "metadata",
                "--no-deps",
                "--format-version",
                "1",
                "--offline",
            ]),
    )?;
    let meta: Value = serde_json::from_str(&out).context("parsing `cargo metadata`")?;
    let pkg = meta["packages"]
        .as_array()
        .and_then(|all| all.iter().find(|p| p["name"] == name))
        .with_context(|| format!("no package {name} in the workspace"))?;
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
    println!("image: building {name} (release, static, {triple})");
    // With an explicit --target, RUSTFLAGS reach only the target's code, not
    // build scripts or proc-macros (which must stay dynamic).
    // Every image binary in one build: their dependencies are compiled once,
    // with one set of features, and the next image's build is a no-op.
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .current_dir(paths::repo_root())
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .args(["build", "--release", "--target", triple]);
    for package in known() {
        cargo.args(["-p", package]);
    }
    cmd::run(&mut cargo)?;
    checked_static(paths::target_dir().join(triple).join("release").join(name))
}

/// Cross-compiles the static release binary `name` (that package alone) for
/// `platform` and returns its path. Installs the Rust target and Debian's
/// cross C compiler and libc when missing.
pub fn build_cross_binary(name: &str, platform: Platform) -> Result<PathBuf> {
    let triple = platform.triple();
    let (linker, packages) = platform.cross_toolchain();
    crate::deps::ensure_debian(&packages)?;
    ensure_rust_target(triple)?;
    println!("image: building {name} (release, static, {triple}, with {linker})");
    let upper = triple.to_uppercase().replace('-', "_");
    let lower = triple.replace('-', "_");
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .current_dir(paths::repo_root())
        .env(format!("CARGO_TARGET_{upper}_LINKER"), linker)
        .env(format!("CC_{lower}"), linker)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .args(["build", "--release", "--target", triple, "-p", name]);
    cmd::run(&mut cargo)?;
    checked_static(paths::target_dir().join(triple).join("release").join(name))
}

/// `rustup target add <triple>` unless it is installed.
fn ensure_rust_target(triple: &str) -> Result<()> {
    let installed = cmd::output(Command::new("rustup").args(["target", "list", "--installed"]))
        .context("listing the installed Rust targets (rustup)")?;
    if installed.lines().any(|l| l.trim() == triple) {
        return Ok(());
    }
    println!("deps: rustup target add {triple}");
    cmd::run(Command::new("rustup").args(["target", "add", triple]))
}

/// Fails unless `binary` is statically linked; returns its path.
fn checked_static(binary: PathBuf) -> Result<PathBuf> {
    let bytes = std::fs::read(&binary).with_context(|| format!("reading {}", binary.display()))?;
    match elf::linking(&bytes)? {
        elf::Linking::Static { pie } => {
            let how = if pie { "static-pie" } else { "static" };
            println!(
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

/// The root filesystem of the image.
fn rootfs(name: &str, binary: &[u8], ca_bundle: Vec<u8>) -> Vec<tar::Entry> {
    use tar::Entry;
    let passwd = "root:x:0:0:root:/root:/sbin/nologin\n\
                  nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n";
    let group = "root:x:0:\nnonroot:x:65532:\n";
    vec![
        Entry::dir("etc", 0o755),
        Entry::file("etc/group", 0o644, group.as_bytes().to_vec()),
        Entry::file("etc/passwd", 0o644, passwd.as_bytes().to_vec()),
        Entry::dir("etc/ssl", 0o755),
        Entry::dir("etc/ssl/certs", 0o755),
        Entry::file("etc/ssl/certs/ca-certificates.crt", 0o644, ca_bundle),
        Entry::dir("home", 0o755),
        Entry::dir("home/nonroot", 0o755),
        Entry::dir("tmp", 0o1777),
        Entry::dir("usr", 0o755),
        Entry::dir("usr/local", 0o755),
        Entry::dir("usr/local/bin", 0o755),
        Entry::file(&format!("usr/local/bin/{name}"), 0o755, binary.to_vec()),
    ]
}

fn gzip(data: &[u8]) -> Result<Vec<u8>> {
    // No file name, mtime 0 and a fixed OS byte: the stream depends on the
    // data only.
    let mut gz = GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::with_capacity(data.len() / 2), Compression::best());
    gz.write_all(data)?;
    Ok(gz.finish()?)
}

fn descriptor(media_type: &str, blob: &[u8]) -> Value {
    json!({"mediaType": media_type, "digest": sha256(blob), "size": blob.len()})
}

/// The blobs and documents of one image, in memory.
struct Layout {
    /// Every blob; the last is the manifest (or the image index).
    blobs: Vec<Vec<u8>>,
    /// The digest of the last blob: the image's.
    manifest_digest: String,
    /// The layout's `index.json`.
    index: Vec<u8>,
    /// Compressed layer plus config per platform (`linux/amd64`, bytes).
    sizes: Vec<(String, u64)>,
}

/// Assembles the image of `binary` (pure: same inputs, same bytes).
fn assemble(
    name: &str,
    platform: Platform,
    tag: &str,
    pkg: &Package,
    binary: &[u8],
    ca_bundle: Vec<u8>,
    epoch: u64,
) -> Result<Layout> {
    let spec = Spec {
        title: name.to_owned(),
        entries: rootfs(name, binary, ca_bundle),
        entrypoint: vec![format!("/usr/local/bin/{name}")],
        cmd: Vec::new(),
        user: Some(USER.to_owned()),
        env: vec![
            "PATH=/usr/local/bin".to_owned(),
            format!("SSL_CERT_FILE={CA_BUNDLE}"),
            "SSL_CERT_DIR=/etc/ssl/certs".to_owned(),
        ],
        source: pkg.source.clone(),
        version: pkg.version.clone(),
        created_by: format!("cargo xtask image {name}"),
    };
    assemble_spec(spec, platform, tag, epoch)
}

/// Everything an image is made of: its one layer's files and its config.
pub struct Spec {
    /// `org.opencontainers.image.title`.
    pub title: String,
    /// The files of the layer.
    pub entries: Vec<tar::Entry>,
    /// The image's entrypoint.
    pub entrypoint: Vec<String>,
    /// The image's default arguments.
    pub cmd: Vec<String>,
    /// The user it runs as (`uid:gid`), if not root.
    pub user: Option<String>,
    /// `NAME=value` environment.
    pub env: Vec<String>,
    /// `org.opencontainers.image.source`.
    pub source: String,
    /// `org.opencontainers.image.version`.
    pub version: String,
    /// The history entry's `created_by`.
    pub created_by: String,
}

/// Assembles an image from its spec for one platform (pure: same inputs,
/// same bytes).
fn assemble_spec(spec: Spec, platform: Platform, tag: &str, epoch: u64) -> Result<Layout> {
    let arch = platform.arch();
    let layer_tar = tar::archive(spec.entries, epoch)?;
    let diff_id = sha256(&layer_tar);
    let layer = gzip(&layer_tar)?;
    let created = rfc3339(epoch);
    let mut image_config = json!({
        "Entrypoint": spec.entrypoint,
        "Env": spec.env,
        "WorkingDir": "/",
        "Labels": {
            "org.opencontainers.image.title": spec.title,
            "org.opencontainers.image.source": spec.source,
            "org.opencontainers.image.version": spec.version,
            "org.opencontainers.image.licenses": "Apache-2.0",
        },
    });
    if let Some(user) = spec.user {
        image_config["User"] = json!(user);
    }
    if !spec.cmd.is_empty() {
        image_config["Cmd"] = json!(spec.cmd);
    }
    let config = json!({
        "created": created,
        "architecture": arch,
        "os": "linux",
        "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": spec.created_by}],
    });
    let config = serde_json::to_vec(&config)?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": descriptor(MEDIA_CONFIG, &config),
        "layers": [descriptor(MEDIA_LAYER, &layer)],
    }))?;
    let manifest_digest = sha256(&manifest);
    let mut manifest_desc = descriptor(MEDIA_MANIFEST, &manifest);
    manifest_desc["annotations"] = json!({"org.opencontainers.image.ref.name": tag});
    manifest_desc["platform"] = json!({"architecture": arch, "os": "linux"});
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [manifest_desc],
    }))?;
    let size = (layer.len() + config.len()) as u64;
    Ok(Layout {
        blobs: vec![layer, config, manifest],
        manifest_digest,
        index,
        sizes: vec![(platform.to_string(), size)],
    })
}

/// Joins single-platform images into one image index (pure: same inputs,
/// same bytes). The index blob lists each manifest with its platform; the
/// layout's `index.json` names the index, tagged `tag`; the index's digest
/// is the image's.
fn assemble_index(images: Vec<(Platform, Layout)>, tag: &str) -> Result<Layout> {
    let mut manifests = Vec::new();
    let mut blobs: Vec<Vec<u8>> = Vec::new();
    let mut sizes = Vec::new();
    for (platform, image) in images {
        let manifest = image.blobs.last().context("an image without a manifest")?;
        let mut desc = descriptor(MEDIA_MANIFEST, manifest);
        desc["platform"] = json!({"architecture": platform.arch(), "os": "linux"});
        manifests.push(desc);
        for blob in image.blobs {
            if !blobs.contains(&blob) {
                blobs.push(blob);
            }
        }
        sizes.extend(image.sizes);
    }
    let index_blob = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": manifests,
    }))?;
    let digest = sha256(&index_blob);
    let mut desc = descriptor(MEDIA_INDEX, &index_blob);
    desc["annotations"] = json!({"org.opencontainers.image.ref.name": tag});
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [desc],
    }))?;
    blobs.push(index_blob);
    Ok(Layout {
        blobs,
        manifest_digest: digest,
        index,
        sizes,
    })
}

fn blob_path(digest: &str) -> String {
    format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))
}

/// The layout's files, as archive entries.
fn layout_entries(layout: &Layout) -> Vec<tar::Entry> {
    use tar::Entry;
    let mut entries = vec![
        Entry::file(
            "oci-layout",
            0o644,
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ),
        Entry::file("index.json", 0o644, layout.index.clone()),
        Entry::dir("blobs", 0o755),
        Entry::dir("blobs/sha256", 0o755),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for blob in &layout.blobs {
        let path = blob_path(&sha256(blob));
        if seen.insert(path.clone()) {
            entries.push(Entry::file(&path, 0o644, blob.clone()));
        }
    }
    entries
}

/// Replaces `dir` with the layout (written beside it, then renamed).
fn write_layout_dir(dir: &Path, layout: &Layout) -> Result<()> {
    let parent = dir.parent().context("layout directory has no parent")?;
    std::fs::create_dir_all(parent)?;
    let tmp = parent.join(format!(
        ".{}.tmp",
        dir.file_name().unwrap_or_default().to_string_lossy()
    ));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    for entry in layout_entries(layout) {
        let path = tmp.join(&entry.path);
        match entry.data {
            Some(data) => {
                if let Some(p) = path.parent() {
                    std::fs::create_dir_all(p)?;
                }
                std::fs::write(&path, data)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            None => std::fs::create_dir_all(&path)?,
        }
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::rename(&tmp, dir)?;
    Ok(())
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
    let mut images = Vec::new();
    for platform in wanted {
        let binary = if platform == host {
            build_binary(name)?
        } else {
            build_cross_binary(name, platform)?
        };
        let binary = std::fs::read(&binary)?;
        let image = assemble(
            name,
            platform,
            &tag,
            &pkg,
            &binary,
            ca_bundle.clone(),
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
    };
    let sizes: Vec<String> = image
        .platforms
        .iter()
        .map(|(platform, size)| format!("{platform} {:.2} MB", mb(*size)))
        .collect();
    println!(
        "image: {}:{} {} ({}: compressed layer + config)",
        image.name,
        image.tag,
        image.digest,
        sizes.join(", ")
    );
    println!("image: layout  {}", image.layout.display());
    println!("image: archive {}", image.archive.display());
    Ok(image)
}

/// Tags follow the registry rules: `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn check_tag(tag: &str) -> Result<()> {
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
    crate::deps::ensure_debian(&[("skopeo", "skopeo")])?;
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
    println!("image: pushed {reference}");
    Ok(reference)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkg() -> Package {
        Package {
            version: "0.1.0".into(),
            source: "example".into(),
        }
    }

    #[test]
    fn same_inputs_same_digest() -> Result<()> {
        let a = assemble(
            "x",
            Platform::AMD64,
            "t",
            &pkg(),
            b"binary",
            b"ca".to_vec(),
            0,
        )?;
        let b = assemble(
            "x",
            Platform::AMD64,
            "other-tag",
            &pkg(),
            b"binary",
            b"ca".to_vec(),
            0,
        )?;
        assert_eq!(a.manifest_digest, b.manifest_digest);
        assert_eq!(a.blobs, b.blobs);
        let c = assemble(
            "x",
            Platform::AMD64,
            "t",
            &pkg(),
            b"binary2",
            b"ca".to_vec(),
            0,
        )?;
        assert_ne!(a.manifest_digest, c.manifest_digest);
        Ok(())
    }

    #[test]
    fn config_runs_the_binary_as_nonroot() -> Result<()> {
        let l = assemble(
            "op",
            Platform::AMD64,
            "t",
            &pkg(),
            b"bin",
            b"ca".to_vec(),
            0,
        )?;
        let config: Value = serde_json::from_slice(&l.blobs[1])?;
        assert_eq!(config["config"]["User"], "65532:65532");
        assert_eq!(config["config"]["Entrypoint"], json!(["/usr/local/bin/op"]));
        assert_eq!(config["created"], "1970-01-01T00:00:00Z");
        let manifest: Value = serde_json::from_slice(&l.blobs[2])?;
        assert_eq!(manifest["config"]["digest"], json!(sha256(&l.blobs[1])));
        assert_eq!(manifest["layers"][0]["digest"], json!(sha256(&l.blobs[0])));
        Ok(())
    }

    fn two_platforms(tag: &str) -> Result<Layout> {
        let amd = assemble("x", Platform::AMD64, tag, &pkg(), b"amd", b"ca".to_vec(), 0)?;
        let arm = assemble("x", Platform::ARM64, tag, &pkg(), b"arm", b"ca".to_vec(), 0)?;
        assemble_index(vec![(Platform::AMD64, amd), (Platform::ARM64, arm)], tag)
    }

    #[test]
    fn index_lists_both_platforms() -> Result<()> {
        let l = two_platforms("t")?;
        let index_blob = l.blobs.last().context("no blob")?;
        assert_eq!(l.manifest_digest, sha256(index_blob));
        let index: Value = serde_json::from_slice(index_blob)?;
        assert_eq!(index["mediaType"], MEDIA_INDEX);
        assert_eq!(index["schemaVersion"], 2);
        let manifests = index["manifests"].as_array().context("no manifests")?;
        assert_eq!(manifests.len(), 2);
        for (m, arch) in manifests.iter().zip(["amd64", "arm64"]) {
            assert_eq!(m["mediaType"], MEDIA_MANIFEST);
            assert_eq!(m["platform"], json!({"architecture": arch, "os": "linux"}));
            // The manifest is a blob of the layout, and its config names the
            // same architecture.
            let manifest = l
                .blobs
                .iter()
                .find(|b| json!(sha256(b)) == m["digest"])
                .context("manifest blob missing")?;
            assert_eq!(m["size"], manifest.len());
            let manifest: Value = serde_json::from_slice(manifest)?;
            let config = l
                .blobs
                .iter()
                .find(|b| json!(sha256(b)) == manifest["config"]["digest"])
                .context("config blob missing")?;
            let config: Value = serde_json::from_slice(config)?;
            assert_eq!(config["architecture"], arch);
            assert_eq!(config["os"], "linux");
        }
        // The layout's index.json points at the index, tagged.
        let top: Value = serde_json::from_slice(&l.index)?;
        assert_eq!(top["manifests"].as_array().map(Vec::len), Some(1));
        let desc = &top["manifests"][0];
        assert_eq!(desc["mediaType"], MEDIA_INDEX);
        assert_eq!(desc["digest"], json!(l.manifest_digest));
        assert_eq!(desc["size"], index_blob.len());
        assert_eq!(
            desc["annotations"]["org.opencontainers.image.ref.name"],
            "t"
        );
        assert_eq!(
            l.sizes.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(),
            ["linux/amd64", "linux/arm64"]
        );
        Ok(())
    }

    #[test]
    fn index_digest_is_stable() -> Result<()> {
        let a = two_platforms("t")?;
        let b = two_platforms("other-tag")?;
        assert_eq!(a.manifest_digest, b.manifest_digest);
        assert_eq!(a.blobs, b.blobs);
        assert_eq!(a.index, two_platforms("t")?.index);
        // Another arm64 binary: another index.
        let amd = assemble("x", Platform::AMD64, "t", &pkg(), b"amd", b"ca".to_vec(), 0)?;
        let arm = assemble(
            "x",
            Platform::ARM64,
            "t",
            &pkg(),
            b"arm2",
            b"ca".to_vec(),
            0,
        )?;
        let c = assemble_index(vec![(Platform::AMD64, amd), (Platform::ARM64, arm)], "t")?;
        assert_ne!(a.manifest_digest, c.manifest_digest);
        // Every blob is written once.
        let entries = layout_entries(&a);
        let mut paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        let all = paths.len();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(all, paths.len());
        Ok(())
    }

    #[test]
    fn platforms_parse() -> Result<()> {
        assert_eq!("linux/amd64".parse::<Platform>()?, Platform::AMD64);
        assert_eq!("linux/arm64".parse::<Platform>()?, Platform::ARM64);
        assert!("linux/riscv64".parse::<Platform>().is_err());
        assert!("amd64".parse::<Platform>().is_err());
        assert_eq!(Platform::ARM64.to_string(), "linux/arm64");
        assert_eq!(Platform::ARM64.triple(), "aarch64-unknown-linux-gnu");
        Ok(())
    }

    #[test]
    fn gzip_has_no_timestamp() -> Result<()> {
        let gz = gzip(b"data")?;
        assert_eq!(&gz[..4], &[0x1f, 0x8b, 8, 0]);
        assert_eq!(&gz[4..8], &[0, 0, 0, 0]);
        Ok(())
    }

    #[test]
    fn dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn tags() {
        assert!(check_tag("0.1.0").is_ok());
        assert!(check_tag("dev_1-a").is_ok());
        assert!(check_tag("").is_err());
        assert!(check_tag("-x").is_err());
        assert!(check_tag("a:b").is_err());
    }
}
