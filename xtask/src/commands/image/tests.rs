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

#[test]
fn an_sbom_refers_to_its_platforms_manifest_and_is_listed_in_the_layout() -> Result<()> {
    let mut amd = assemble("x", Platform::AMD64, "t", &pkg(), b"amd", b"ca".to_vec(), 0)?;
    let mut arm = assemble("x", Platform::ARM64, "t", &pkg(), b"arm", b"ca".to_vec(), 0)?;
    let amd_manifest = sha256(amd.blobs.last().context("no manifest")?);
    attach(
        &mut amd,
        "application/spdx+json",
        "x.spdx.json",
        b"{\"a\":1}".to_vec(),
        0,
    )?;
    attach(
        &mut arm,
        "application/spdx+json",
        "x.spdx.json",
        b"{\"b\":2}".to_vec(),
        0,
    )?;
    // Attaching leaves the image as it was: same digest, the manifest still last.
    assert_eq!(amd.manifest_digest, amd_manifest);
    let artifact: Value = serde_json::from_slice(&amd.referrers[0].manifest)?;
    assert_eq!(artifact["artifactType"], "application/spdx+json");
    assert_eq!(artifact["subject"]["digest"], json!(amd_manifest));
    assert_eq!(
        artifact["config"]["mediaType"],
        "application/vnd.oci.empty.v1+json"
    );
    assert_eq!(artifact["layers"][0]["digest"], json!(sha256(b"{\"a\":1}")));
    let l = assemble_index(vec![(Platform::AMD64, amd), (Platform::ARM64, arm)], "t")?;
    let top: Value = serde_json::from_slice(&l.index)?;
    let manifests = top["manifests"].as_array().context("no manifests")?;
    assert_eq!(manifests.len(), 3, "the index, then one SBOM per platform");
    assert_eq!(manifests[0]["digest"], json!(l.manifest_digest));
    for (m, referrer) in manifests[1..].iter().zip(&l.referrers) {
        assert_eq!(m["artifactType"], "application/spdx+json");
        assert_eq!(m["digest"], json!(referrer.digest()));
        assert!(
            m["annotations"].is_null(),
            "untagged: the tag names the image"
        );
    }
    // Every blob of the artifacts is written, once.
    let entries = layout_entries(&l);
    for referrer in &l.referrers {
        for blob in referrer.blobs.iter().chain([&referrer.manifest]) {
            let path = blob_path(&sha256(blob));
            assert_eq!(
                entries.iter().filter(|e| e.path == path).count(),
                1,
                "{path}"
            );
        }
    }
    Ok(())
}

#[test]
fn registries_on_this_machine_are_plain_http() {
    assert_eq!(
        repository_of("127.0.0.1:15000/op:0.1.0"),
        "127.0.0.1:15000/op"
    );
    assert_eq!(
        repository_of("reg.example:5000/a/op@sha256:ab"),
        "reg.example:5000/a/op"
    );
    assert!(is_loopback("127.0.0.1:15000/op"));
    assert!(is_loopback("localhost:5000/op"));
    assert!(!is_loopback("ghcr.io/o/op"));
}
