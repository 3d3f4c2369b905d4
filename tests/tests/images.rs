//! `cargo xtask image`: the image it writes is valid for real tools (skopeo,
//! umoci, a registry), runs the binary as the non-root user, is the same
//! bytes when built twice, and survives a push and a pull unchanged; its SBOM
//! (an SPDX document of the crates linked into each platform's binary) is found
//! by oras as a referrer of the image, in the layout and in the registry.
//!
//! Only `podset-operator` is built here (release builds are slow); every
//! binary goes through the same code. The image is built for linux/amd64 and
//! linux/arm64 (the default); the arm64 binary runs under qemu. Needs
//! `skopeo`, `umoci`, `docker-registry` and `qemu-aarch64-static` (Debian
//! packages; `.ci/run` installs them).

use anyhow::{Context, Result, bail, ensure};
use e2e::{repo_root, target_dir, unique_suffix};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

const NAME: &str = "podset-operator";

/// One image build at a time: the tests share `target/images/<name>/`.
static BUILDS: Mutex<()> = Mutex::new(());

fn serialized() -> MutexGuard<'static, ()> {
    BUILDS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn need(program: &str, package: &str) -> Result<()> {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()));
    ensure!(
        found,
        "{program} is not installed (Debian: apt-get install {package}; `.ci/run` does it)"
    );
    Ok(())
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `cargo xtask image podset-operator --tag <tag> [extra...]`.
fn xtask_image(tag: &str, extra: &[&str]) -> Result<String> {
    run(xtask::support::cmd::cargo()
        .current_dir(repo_root())
        .args([
            "run", "--quiet", "-p", "xtask", "--", "image", NAME, "--tag", tag,
        ])
        .args(extra))
}

fn layout() -> PathBuf {
    target_dir().join("images").join(NAME)
}

/// The manifest digest the layout's `index.json` names for `tag`.
fn layout_digest(layout: &Path, tag: &str) -> Result<String> {
    let index: Value = serde_json::from_slice(&std::fs::read(layout.join("index.json"))?)?;
    index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .and_then(|m| m["digest"].as_str())
        .map(str::to_owned)
        .with_context(|| format!("no manifest tagged {tag} in {}", layout.display()))
}

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("e2e-images-{what}-{}", unique_suffix()));
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // umoci's rootless unpack leaves read-only directories behind.
        let _ = Command::new("chmod")
            .args(["-R", "u+rwX"])
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn image_is_valid_for_skopeo_and_umoci() -> Result<()> {
    need("skopeo", "skopeo")?;
    need("umoci", "umoci")?;
    let _one = serialized();
    let tag = format!("e2e-{}", unique_suffix());
    let printed = xtask_image(&tag, &[])?;
    let digest = layout_digest(&layout(), &tag)?;
    ensure!(
        printed.contains(&digest) && printed.contains(" MB"),
        "the command should print the digest and size: {printed}"
    );
    ensure!(
        target_dir()
            .join("images")
            .join(format!("{NAME}.oci.tar"))
            .is_file(),
        "no OCI archive written"
    );

    let oci = format!("oci:{}:{tag}", layout().display());
    let inspect: Value =
        serde_json::from_str(&run(Command::new("skopeo").args(["inspect", &oci]))?)?;
    assert_eq!(inspect["Digest"], digest.as_str());
    assert_eq!(inspect["Os"], "linux");
    assert_eq!(inspect["Labels"]["org.opencontainers.image.title"], NAME);
    let config: Value = serde_json::from_str(&run(
        Command::new("skopeo").args(["inspect", "--config", &oci])
    )?)?;
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!([format!("/usr/local/bin/{NAME}")])
    );
    let env = config["config"]["Env"].to_string();
    assert!(
        env.contains("SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"),
        "{env}"
    );

    let scratch = Scratch::new("unpack")?;
    let bundle = scratch.0.join("bundle");
    // umoci unpacks one manifest, not an index (the tag would be ambiguous):
    // skopeo picks this machine's platform from the index first.
    let host = scratch.0.join("host");
    run(Command::new("skopeo").args([
        "copy",
        "--quiet",
        &oci,
        &format!("oci:{}:{tag}", host.display()),
    ]))?;
    run(Command::new("umoci")
        .args(["unpack", "--rootless", "--image"])
        .arg(format!("{}:{tag}", host.display()))
        .arg(&bundle))?;
    let rootfs = bundle.join("rootfs");
    let binary = rootfs.join("usr/local/bin").join(NAME);
    ensure!(binary.is_file(), "{} missing", binary.display());
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd"))?;
    assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
    let group = std::fs::read_to_string(rootfs.join("etc/group"))?;
    assert!(group.contains("nonroot:x:65532:"), "{group}");
    let bundled = std::fs::read(rootfs.join("etc/ssl/certs/ca-certificates.crt"))?;
    assert_eq!(
        bundled,
        std::fs::read("/etc/ssl/certs/ca-certificates.crt")?,
        "the CA bundle is the build machine's"
    );
    // The runtime spec umoci derives from the config runs as 65532.
    let spec: Value = serde_json::from_slice(&std::fs::read(bundle.join("config.json"))?)?;
    assert_eq!(spec["process"]["user"]["uid"], 65532);
    assert_eq!(spec["process"]["user"]["gid"], 65532);
    // Static: the binary from the image starts on its own (here: prints its CRD).
    let crd = run(Command::new(&binary).arg("crd"))?;
    assert!(crd.contains("CustomResourceDefinition"), "{crd}");
    Ok(())
}

/// The blob `digest` of the OCI layout.
fn blob(layout: &Path, digest: &str) -> Result<PathBuf> {
    let hex = digest
        .strip_prefix("sha256:")
        .with_context(|| format!("not a sha256 digest: {digest}"))?;
    Ok(layout.join("blobs/sha256").join(hex))
}

fn json_blob(layout: &Path, digest: &str) -> Result<Value> {
    Ok(serde_json::from_slice(&std::fs::read(blob(
        layout, digest,
    )?)?)?)
}

/// The binary of the image's `arch` manifest, extracted from its layer into `dir`.
fn binary_of(layout: &Path, index: &Value, arch: &str, dir: &Path) -> Result<PathBuf> {
    let manifest = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["platform"]["architecture"] == arch)
        .and_then(|m| m["digest"].as_str())
        .with_context(|| format!("no {arch} manifest in {index}"))?;
    let manifest = json_blob(layout, manifest)?;
    let layer = manifest["layers"][0]["digest"]
        .as_str()
        .with_context(|| format!("no layer in {manifest}"))?;
    let out = dir.join(arch);
    std::fs::create_dir_all(&out)?;
    let member = format!("usr/local/bin/{NAME}");
    run(Command::new("tar")
        .arg("-xzf")
        .arg(blob(layout, layer)?)
        .arg("-C")
        .arg(&out)
        .arg(&member))?;
    Ok(out.join(member))
}

/// The ELF machine of an executable (`e_machine`).
fn elf_machine(binary: &Path) -> Result<u16> {
    let bytes = std::fs::read(binary)?;
    ensure!(
        bytes.starts_with(b"\x7fELF"),
        "{} is not ELF",
        binary.display()
    );
    let m = bytes.get(18..20).context("truncated ELF")?;
    Ok(u16::from_le_bytes([m[0], m[1]]))
}

#[test]
fn image_index_has_amd64_and_arm64_and_the_arm64_binary_runs() -> Result<()> {
    need("skopeo", "skopeo")?;
    need("qemu-aarch64-static", "qemu-user-static")?;
    let _one = serialized();
    let tag = format!("e2e-{}", unique_suffix());
    let printed = xtask_image(&tag, &["--platform", "linux/amd64,linux/arm64"])?;
    ensure!(
        printed.contains("linux/amd64") && printed.contains("linux/arm64"),
        "the command should print both platforms' sizes: {printed}"
    );
    let digest = layout_digest(&layout(), &tag)?;

    // skopeo reads the index the layout names for the tag, byte for byte.
    let oci = format!("oci:{}:{tag}", layout().display());
    let raw = run(Command::new("skopeo").args(["inspect", "--raw", &oci]))?;
    let index: Value = serde_json::from_str(&raw)?;
    assert_eq!(
        index["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let platforms: Vec<(String, String)> = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
            (
                m["platform"]["os"].as_str().unwrap_or_default().to_owned(),
                m["platform"]["architecture"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    assert_eq!(
        platforms,
        [
            ("linux".to_owned(), "amd64".to_owned()),
            ("linux".to_owned(), "arm64".to_owned())
        ]
    );
    let sum = run(Command::new("sha256sum").arg(blob(&layout(), &digest)?))?;
    assert_eq!(
        std::fs::read_to_string(blob(&layout(), &digest)?)?,
        raw,
        "skopeo --raw is the index blob"
    );
    assert!(
        sum.starts_with(digest.trim_start_matches("sha256:")),
        "{sum}"
    );
    // Each manifest's config names its platform.
    for m in index["manifests"].as_array().into_iter().flatten() {
        let manifest = json_blob(&layout(), m["digest"].as_str().unwrap_or_default())?;
        let config = json_blob(
            &layout(),
            manifest["config"]["digest"].as_str().unwrap_or_default(),
        )?;
        assert_eq!(config["architecture"], m["platform"]["architecture"]);
        assert_eq!(config["os"], "linux");
        assert_eq!(config["config"]["User"], "65532:65532");
    }

    // The arm64 binary is an aarch64 executable, runs under qemu and prints
    // exactly the CRD the amd64 one prints.
    let scratch = Scratch::new("arches")?;
    let amd64 = binary_of(&layout(), &index, "amd64", &scratch.0)?;
    let arm64 = binary_of(&layout(), &index, "arm64", &scratch.0)?;
    assert_eq!(elf_machine(&amd64)?, 62, "EM_X86_64");
    assert_eq!(elf_machine(&arm64)?, 183, "EM_AARCH64");
    let crd_amd64 = run(Command::new(&amd64).arg("crd"))?;
    let crd_arm64 = run(Command::new("qemu-aarch64-static").arg(&arm64).arg("crd"))?;
    assert!(
        crd_amd64.contains("CustomResourceDefinition"),
        "{crd_amd64}"
    );
    assert_eq!(crd_arm64, crd_amd64, "the arm64 binary prints the same CRD");
    Ok(())
}

#[test]
fn one_platform_is_a_plain_manifest() -> Result<()> {
    need("skopeo", "skopeo")?;
    let _one = serialized();
    let tag = format!("e2e-{}", unique_suffix());
    xtask_image(&tag, &["--platform", "linux/amd64"])?;
    let digest = layout_digest(&layout(), &tag)?;
    let oci = format!("oci:{}:{tag}", layout().display());
    let raw: Value = serde_json::from_str(&run(
        Command::new("skopeo").args(["inspect", "--raw", &oci])
    )?)?;
    assert_eq!(
        raw["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    let inspect: Value =
        serde_json::from_str(&run(Command::new("skopeo").args(["inspect", &oci]))?)?;
    assert_eq!(inspect["Digest"], digest.as_str());
    assert_eq!(inspect["Architecture"], "amd64");
    Ok(())
}

#[test]
fn building_twice_gives_the_same_digest() -> Result<()> {
    let _one = serialized();
    let tag = format!("e2e-{}", unique_suffix());
    let archive = target_dir().join("images").join(format!("{NAME}.oci.tar"));
    xtask_image(&tag, &[])?;
    let first = layout_digest(&layout(), &tag)?;
    let first_archive = std::fs::read(&archive)?;
    xtask_image(&tag, &[])?;
    let second = layout_digest(&layout(), &tag)?;
    assert_eq!(first, second, "same inputs, same manifest digest");
    assert!(
        first_archive == std::fs::read(&archive)?,
        "the OCI archive differs between two builds"
    );
    Ok(())
}

/// A `docker-registry` on 127.0.0.1, stopped when dropped.
struct Registry {
    child: Child,
    addr: String,
    _scratch: Scratch,
}

impl Registry {
    fn start() -> Result<Registry> {
        need("docker-registry", "docker-registry")?;
        let scratch = Scratch::new("registry")?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = format!("127.0.0.1:{port}");
        let config = scratch.0.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                scratch.0.join("storage").display()
            ),
        )?;
        let log = std::fs::File::create(scratch.0.join("registry.log"))?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting docker-registry")?;
        let mut registry = Registry {
            child,
            addr,
            _scratch: scratch,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if registry.answers() {
                return Ok(registry);
            }
            if let Some(status) = registry.child.try_wait()? {
                let log = std::fs::read_to_string(registry._scratch.0.join("registry.log"))
                    .unwrap_or_default();
                bail!("docker-registry exited ({status}):\n{log}");
            }
            if Instant::now() >= deadline {
                bail!(
                    "docker-registry did not answer on {} within 30s",
                    registry.addr
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Whether `GET /v2/` answers 200.
    fn answers(&self) -> bool {
        let Ok(mut conn) = TcpStream::connect(&self.addr) else {
            return false;
        };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        let request = format!("GET /v2/ HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr);
        if conn.write_all(request.as_bytes()).is_err() {
            return false;
        }
        let mut response = String::new();
        let _ = conn.read_to_string(&mut response);
        response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn push_to_a_registry_keeps_the_digest() -> Result<()> {
    need("skopeo", "skopeo")?;
    let registry = Registry::start()?;
    let _one = serialized();
    let tag = format!("e2e-{}", unique_suffix());
    let printed = xtask_image(&tag, &["--push", &registry.addr])?;
    let digest = layout_digest(&layout(), &tag)?;
    let reference = format!("{}/{NAME}:{tag}", registry.addr);
    ensure!(
        printed.contains(&format!("{reference}@{digest}")),
        "the push should print {reference}@{digest}: {printed}"
    );

    let remote = format!("docker://{reference}");
    let inspect: Value = serde_json::from_str(&run(Command::new("skopeo").args([
        "inspect",
        "--tls-verify=false",
        &remote,
    ]))?)?;
    assert_eq!(inspect["Digest"], digest.as_str(), "registry digest");

    let scratch = Scratch::new("pull")?;
    let pulled = scratch.0.join("pulled");
    run(Command::new("skopeo").args([
        "copy",
        "--quiet",
        // The whole index, both platforms, as pushed.
        "--all",
        "--src-tls-verify=false",
        &remote,
        &format!("oci:{}:{tag}", pulled.display()),
    ]))?;
    assert_eq!(
        layout_digest(&pulled, &tag)?,
        digest,
        "pulled back unchanged"
    );

    Ok(())
}

/// The SBOM artifact oras finds for the image (`target`: oras' flags, then the
/// reference), and its document, pulled with oras.
fn sbom_of(oras: &Path, target: &[&str]) -> Result<(String, Value)> {
    let (flags, reference) = target.split_at(target.len() - 1);
    let discovered: Value = serde_json::from_str(&run(Command::new(oras)
        .arg("discover")
        .args(flags)
        .args(["--format", "json"])
        .arg(reference[0]))?)?;
    let sboms: Vec<&Value> = discovered["referrers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["artifactType"] == "application/spdx+json")
        .collect();
    ensure!(sboms.len() == 1, "one SBOM referrer expected: {discovered}");
    let digest = sboms[0]["digest"].as_str().context("no digest")?.to_owned();
    let scratch = Scratch::new("sbom")?;
    let repository = reference[0]
        .rsplit_once(':')
        .map_or(reference[0], |(r, _)| r);
    run(Command::new(oras)
        .arg("pull")
        .args(flags)
        .arg(format!("{repository}@{digest}"))
        .arg("-o")
        .arg(&scratch.0))?;
    let document =
        serde_json::from_slice(&std::fs::read(scratch.0.join(format!("{NAME}.spdx.json")))?)?;
    Ok((digest, document))
}

/// The version `Cargo.lock` pins for `name` (the workspace links one).
fn lock_version(name: &str) -> Result<String> {
    let lock = std::fs::read_to_string(repo_root().join("Cargo.lock"))?;
    let versions: Vec<&str> = lock
        .split("[[package]]")
        .filter(|b| b.lines().any(|l| l.trim() == format!("name = \"{name}\"")))
        .filter_map(|b| {
            b.lines()
                .find_map(|l| l.trim().strip_prefix("version = \""))
        })
        .map(|v| v.trim_end_matches('"'))
        .collect();
    ensure!(versions.len() == 1, "Cargo.lock has {name} {versions:?}");
    Ok(versions[0].to_owned())
}

/// This machine's image platform (`amd64`, `arm64`).
fn host_arch() -> Result<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Ok("amd64"),
        "aarch64" => Ok("arm64"),
        other => bail!("no image platform for {other}"),
    }
}

/// The host's image only (the cross build is the other tests'): its SBOM lists the
/// crates linked into the binary at Cargo.lock's versions, oras finds it as a referrer
/// of the image in the layout, and after a push in the registry, the same bytes.
#[test]
fn the_sbom_lists_the_linked_crates_and_goes_along_with_a_push() -> Result<()> {
    need("skopeo", "skopeo")?;
    let registry = Registry::start()?;
    let _one = serialized();
    let tag = format!("e2e-{}", unique_suffix());
    let arch = host_arch()?;
    let platform = format!("linux/{arch}");
    xtask_image(&tag, &["--platform", &platform, "--push", &registry.addr])?;
    let oras = e2e::tools::oras()?;
    let (digest, document) = sbom_of(
        &oras,
        &["--oci-layout", &format!("{}:{tag}", layout().display())],
    )?;
    assert_eq!(document["spdxVersion"], "SPDX-2.3");
    let packages = document["packages"].as_array().context("no packages")?;
    let find = |name: &str| packages.iter().find(|p| p["name"] == name);
    assert_eq!(packages[0]["name"], NAME, "the binary's crate comes first");
    for name in ["kube", "tokio", "k8s-openapi", "rustls"] {
        let version = lock_version(name)?;
        let package = find(name).with_context(|| format!("{name} is not in the SBOM"))?;
        assert_eq!(package["versionInfo"], version.as_str(), "{name}");
        assert_eq!(
            package["externalRefs"][0]["referenceLocator"],
            format!("pkg:cargo/{name}@{version}").as_str()
        );
        assert!(
            package["checksums"][0]["checksumValue"].is_string(),
            "{name} has no checksum"
        );
        assert_ne!(
            package["licenseDeclared"], "NOASSERTION",
            "{name} has no license"
        );
    }
    // Macros and build scripts' crates run at build time: they are not linked.
    for absent in ["kube-derive", "serde_derive", "tokio-macros", "cc"] {
        assert!(find(absent).is_none(), "{absent} is listed but not linked");
    }
    // Another binary's crates are not this one's.
    assert!(
        find("lolcow-web").is_none() && find("pulsar").is_none(),
        "crates of other binaries"
    );

    // The registry serves it as a referrer of the image, the same bytes.
    let reference = format!("{}/{NAME}:{tag}", registry.addr);
    let (pushed, pulled) = sbom_of(&oras, &["--plain-http", &reference])?;
    assert_eq!(pushed, digest, "the registry's SBOM digest");
    assert_eq!(pulled, document, "the registry's SBOM");
    Ok(())
}
