//! The OCI image layout: the root filesystem, blobs, manifests, the index and the layout directory.

use super::*;

/// The root filesystem of the image.
pub(super) fn rootfs(name: &str, binary: &[u8], ca_bundle: Vec<u8>) -> Vec<tar::Entry> {
    use tar::Entry;
    let passwd = "root:x:0:0:root:/root:/sbin/nologin\n\
                  nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n";
    let group = "root:x:0:\nnonroot:x:65532:\n";
    let mut entries = tar::skeleton(
        passwd,
        group,
        &[
            "etc/ssl",
            "etc/ssl/certs",
            "home",
            "home/nonroot",
            "usr",
            "usr/local",
            "usr/local/bin",
        ],
    );
    entries.push(Entry::file(
        "etc/ssl/certs/ca-certificates.crt",
        0o644,
        ca_bundle,
    ));
    entries.push(Entry::file(
        &format!("usr/local/bin/{name}"),
        0o755,
        binary.to_vec(),
    ));
    entries
}

pub(super) fn gzip(data: &[u8]) -> Result<Vec<u8>> {
    // No file name, mtime 0 and a fixed OS byte: the stream depends on the
    // data only.
    let mut gz = GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::with_capacity(data.len() / 2), Compression::best());
    gz.write_all(data)?;
    Ok(gz.finish()?)
}

pub(super) fn descriptor(media_type: &str, blob: &[u8]) -> Value {
    json!({"mediaType": media_type, "digest": sha256(blob), "size": blob.len()})
}

/// The blobs and documents of one image, in memory.
pub(super) struct Layout {
    /// Every blob; the last is the manifest (or the image index).
    pub(super) blobs: Vec<Vec<u8>>,
    /// The digest of the last blob: the image's.
    pub(super) manifest_digest: String,
    /// The layout's `index.json`: the image (tagged) and its referrers.
    pub(super) index: Vec<u8>,
    /// Compressed layer plus config per platform (`linux/amd64`, bytes).
    pub(super) sizes: Vec<(String, u64)>,
    /// Artifacts that refer to a manifest of the image (its SBOMs).
    pub(super) referrers: Vec<Referrer>,
}

/// An OCI 1.1 artifact about a manifest of the image: its manifest (whose `subject` is
/// that manifest) and its blobs.
#[derive(Clone)]
pub(super) struct Referrer {
    /// The artifact's manifest.
    pub(super) manifest: Vec<u8>,
    /// Its config (the empty descriptor's `{}`) and its one layer.
    pub(super) blobs: Vec<Vec<u8>>,
    /// Its `artifactType`.
    pub(super) artifact_type: String,
}

impl Referrer {
    /// `sha256:...` of its manifest.
    pub(super) fn digest(&self) -> String {
        sha256(&self.manifest)
    }

    /// Its descriptor in `index.json`.
    fn descriptor(&self) -> Value {
        let mut desc = descriptor(MEDIA_MANIFEST, &self.manifest);
        desc["artifactType"] = json!(self.artifact_type);
        desc
    }
}

/// The OCI 1.1 empty config of artifacts.
const MEDIA_EMPTY: &str = "application/vnd.oci.empty.v1+json";

/// `index.json`: the image's descriptor (tagged), then its referrers' (untagged).
fn index_json(image: Value, referrers: &[Referrer]) -> Result<Vec<u8>> {
    let mut manifests = vec![image];
    manifests.extend(referrers.iter().map(Referrer::descriptor));
    Ok(serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": manifests,
    }))?)
}

/// Stores `document` (of media type `artifact_type`) as an artifact whose subject is
/// the layout's single-platform manifest (pure: same inputs, same bytes).
pub(super) fn attach(
    layout: &mut Layout,
    artifact_type: &str,
    title: &str,
    document: Vec<u8>,
    epoch: u64,
) -> Result<()> {
    let manifest = layout.blobs.last().context("an image without a manifest")?;
    let subject = descriptor(MEDIA_MANIFEST, manifest);
    let empty = b"{}".to_vec();
    let mut layer = descriptor(artifact_type, &document);
    layer["annotations"] = json!({"org.opencontainers.image.title": title});
    let artifact = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "artifactType": artifact_type,
        "config": descriptor(MEDIA_EMPTY, &empty),
        "layers": [layer],
        "subject": subject,
        "annotations": {"org.opencontainers.image.created": rfc3339(epoch)},
    }))?;
    layout.referrers.push(Referrer {
        manifest: artifact,
        blobs: vec![empty, document],
        artifact_type: artifact_type.to_owned(),
    });
    let top: Value = serde_json::from_slice(&layout.index)?;
    let image = top["manifests"][0].clone();
    layout.index = index_json(image, &layout.referrers)?;
    Ok(())
}

/// Assembles the image of `binary` (pure: same inputs, same bytes).
pub(super) fn assemble(
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
pub(super) fn assemble_spec(
    spec: Spec,
    platform: Platform,
    tag: &str,
    epoch: u64,
) -> Result<Layout> {
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
    let index = index_json(manifest_desc, &[])?;
    let size = (layer.len() + config.len()) as u64;
    Ok(Layout {
        blobs: vec![layer, config, manifest],
        manifest_digest,
        index,
        sizes: vec![(platform.to_string(), size)],
        referrers: Vec::new(),
    })
}

/// Joins single-platform images into one image index (pure: same inputs,
/// same bytes). The index blob lists each manifest with its platform; the
/// layout's `index.json` names the index, tagged `tag`; the index's digest
/// is the image's.
pub(super) fn assemble_index(images: Vec<(Platform, Layout)>, tag: &str) -> Result<Layout> {
    let mut manifests = Vec::new();
    let mut blobs: Vec<Vec<u8>> = Vec::new();
    let mut sizes = Vec::new();
    let mut referrers = Vec::new();
    for (platform, image) in images {
        referrers.extend(image.referrers.iter().cloned());
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
    let index = index_json(desc, &referrers)?;
    blobs.push(index_blob);
    Ok(Layout {
        blobs,
        manifest_digest: digest,
        index,
        sizes,
        referrers,
    })
}

pub(super) fn blob_path(digest: &str) -> String {
    format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))
}

/// The layout's files, as archive entries.
pub(super) fn layout_entries(layout: &Layout) -> Vec<tar::Entry> {
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
    let referrers = layout
        .referrers
        .iter()
        .flat_map(|r| r.blobs.iter().chain([&r.manifest]));
    for blob in layout.blobs.iter().chain(referrers) {
        let path = blob_path(&sha256(blob));
        if seen.insert(path.clone()) {
            entries.push(Entry::file(&path, 0o644, blob.clone()));
        }
    }
    entries
}

/// Replaces `dir` with the layout (written beside it, then renamed).
pub(super) fn write_layout_dir(dir: &Path, layout: &Layout) -> Result<()> {
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
