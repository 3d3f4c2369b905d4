//! `cargo xtask image <name> [--push <registry>] [--tag <tag>]`: an OCI image
//! of one binary of the workspace, built without Docker.
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

/// Options of `cargo xtask image`.
#[derive(clap::Args)]
pub struct ImageArgs {
    /// The binary (= package) to pack: an operator, `lolcow-web` or `pulsar-consumer`.
    pub name: String,
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
    /// `sha256:...` of the manifest: the image's identity.
    pub digest: String,
    /// The OCI image layout directory.
    pub layout: PathBuf,
    /// The same layout as one tar file.
    pub archive: PathBuf,
    /// Compressed layer plus config, in bytes (what a pull downloads).
    pub size: u64,
}

impl Image {
    /// The `oci:` transport reference of skopeo for this image.
    pub fn oci_ref(&self) -> String {
        format!("oci:{}:{}", self.layout.display(), self.tag)
    }
}

/// `cargo xtask image ...`.
pub fn run(args: &ImageArgs) -> Result<()> {
    let image = build(&args.name, args.tag.as_deref())?;
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

/// The Rust target triple and OCI architecture of this machine.
fn platform() -> Result<(String, &'static str)> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => bail!("images: unsupported architecture {other}"),
    };
    Ok((
        format!("{}-unknown-linux-gnu", std::env::consts::ARCH),
        arch,
    ))
}

/// Builds the static release binary and returns its path.
pub fn build_binary(name: &str) -> Result<PathBuf> {
    let (triple, _) = platform()?;
    println!("image: building {name} (release, static, {triple})");
    // With an explicit --target, RUSTFLAGS reach only the target's code, not
    // build scripts or proc-macros (which must stay dynamic).
    // Every image binary in one build: their dependencies are compiled once,
    // with one set of features, and the next image's build is a no-op.
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .current_dir(paths::repo_root())
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .args(["build", "--release", "--target", &triple]);
    for package in known() {
        cargo.args(["-p", package]);
    }
    cmd::run(&mut cargo)?;
    let binary = paths::target_dir().join(&triple).join("release").join(name);
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
    blobs: Vec<Vec<u8>>,
    manifest_digest: String,
    index: Vec<u8>,
    size: u64,
}

/// Assembles the image of `binary` (pure: same inputs, same bytes).
fn assemble(
    name: &str,
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
    assemble_spec(spec, tag, epoch)
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

/// Assembles an image from its spec (pure: same inputs, same bytes).
fn assemble_spec(spec: Spec, tag: &str, epoch: u64) -> Result<Layout> {
    let (_, arch) = platform()?;
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
        size,
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
    for blob in &layout.blobs {
        entries.push(Entry::file(&blob_path(&sha256(blob)), 0o644, blob.clone()));
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

/// Builds the binary and writes its image under `target/images/`.
pub fn build(name: &str, tag: Option<&str>) -> Result<Image> {
    if !known().contains(&name) {
        bail!("unknown image {name:?}; one of: {}", known().join(", "));
    }
    let pkg = package(name)?;
    let tag = tag.unwrap_or(&pkg.version).to_owned();
    check_tag(&tag)?;
    let binary = build_binary(name)?;
    let binary = std::fs::read(&binary)?;
    let ca_bundle = std::fs::read(CA_BUNDLE).with_context(|| {
        format!("reading {CA_BUNDLE}: install the CA bundle first (Debian: apt-get install ca-certificates)")
    })?;
    let layout = assemble(name, &tag, &pkg, &binary, ca_bundle, source_date_epoch()?)?;
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
        size: layout.size,
    };
    println!(
        "image: {}:{} {} ({:.2} MB: compressed layer + config)",
        image.name,
        image.tag,
        image.digest,
        mb(image.size)
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
        let a = assemble("x", "t", &pkg(), b"binary", b"ca".to_vec(), 0)?;
        let b = assemble("x", "other-tag", &pkg(), b"binary", b"ca".to_vec(), 0)?;
        assert_eq!(a.manifest_digest, b.manifest_digest);
        assert_eq!(a.blobs, b.blobs);
        let c = assemble("x", "t", &pkg(), b"binary2", b"ca".to_vec(), 0)?;
        assert_ne!(a.manifest_digest, c.manifest_digest);
        Ok(())
    }

    #[test]
    fn config_runs_the_binary_as_nonroot() -> Result<()> {
        let l = assemble("op", "t", &pkg(), b"bin", b"ca".to_vec(), 0)?;
        let config: Value = serde_json::from_slice(&l.blobs[1])?;
        assert_eq!(config["config"]["User"], "65532:65532");
        assert_eq!(config["config"]["Entrypoint"], json!(["/usr/local/bin/op"]));
        assert_eq!(config["created"], "1970-01-01T00:00:00Z");
        let manifest: Value = serde_json::from_slice(&l.blobs[2])?;
        assert_eq!(manifest["config"]["digest"], json!(sha256(&l.blobs[1])));
        assert_eq!(manifest["layers"][0]["digest"], json!(sha256(&l.blobs[0])));
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
