//! OCI image-layout tarballs written reproducibly: the same entries and config give the same
//! bytes, so the same digest. One layer; every entry owned by 0:0 with one fixed mtime; paths
//! sorted; gzip without a timestamp; JSON with sorted keys. The tarball holds the OCI layout
//! (`oci-layout`, `index.json`, `blobs/sha256/…`) that `ctr images import`, `podman load`,
//! `skopeo copy oci-archive:` and `crane push` read, plus Docker's `manifest.json` over the
//! same blobs, which `docker load` reads (the shape `docker save` writes since Docker 25).
//!
//! I/O: reads the files an entry names and writes the tarball or a root filesystem directory.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// What a regular file of the image holds.
#[derive(Clone, Debug)]
pub enum Content {
    Bytes(Vec<u8>),
    /// A file of the build machine, read when the image is written.
    From(PathBuf),
}

/// One path of the image's file tree. Paths are absolute (`/usr/local/bin/kube-proxy`);
/// parent directories that no entry names are added with mode 0755.
#[derive(Clone, Debug)]
pub enum Entry {
    Dir {
        path: String,
        mode: u32,
    },
    File {
        path: String,
        mode: u32,
        content: Content,
    },
    Symlink {
        path: String,
        target: String,
    },
}

impl Entry {
    pub fn path(&self) -> &str {
        match self {
            Entry::Dir { path, .. } | Entry::File { path, .. } | Entry::Symlink { path, .. } => {
                path
            }
        }
    }
}

/// An image: its reference, its file tree and the config a runtime starts it with.
#[derive(Clone, Debug)]
pub struct Image {
    /// Full reference, `HOST/PATH:TAG` (`localhost/kube-nlproxy:v0.1.0`): the name
    /// `ctr images import` and `docker load` give the image.
    pub reference: String,
    pub entries: Vec<Entry>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `uid:gid` the process runs as unless the pod says otherwise.
    pub user: String,
    pub env: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// Seconds since the epoch: every entry's mtime and the config's `created`
    /// (`SOURCE_DATE_EPOCH` in the build tools' convention).
    pub epoch: u64,
    /// gzip the layer (the release image); test images skip it to save seconds.
    pub gzip: bool,
    /// The platform, as OCI and GOARCH name it (`amd64`, `arm64`) ...
    pub architecture: String,
    /// ... and its variant (`v8` for arm64), if any.
    pub variant: Option<String>,
}

/// What was written.
#[derive(Clone, Debug)]
pub struct Written {
    /// The manifest's digest: the image's digest in a registry it is pushed to as is.
    pub digest: String,
    /// Bytes of the tarball.
    pub archive_size: u64,
    /// Bytes of the layer as stored (compressed when `gzip`).
    pub layer_size: u64,
    /// Bytes of the files' contents once unpacked.
    pub unpacked_size: u64,
}

const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const MEDIA_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

fn sha256_hex(data: &[u8]) -> String {
    let d = Sha256::digest(data);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The entries sorted by path with every missing parent directory added. Two entries for
/// one path are an error: which one wins would depend on the caller's order.
pub fn normalized_entries(entries: &[Entry]) -> io::Result<Vec<Entry>> {
    let mut by_path: BTreeMap<String, Entry> = BTreeMap::new();
    for e in entries {
        let p = e.path();
        if !p.starts_with('/') || p.len() < 2 || p.ends_with('/') || p.contains("//") {
            return Err(io::Error::other(format!(
                "image entry {p:?}: the path must be absolute, without a trailing or double slash"
            )));
        }
        if p.split('/').any(|c| c == ".." || c == ".") {
            return Err(io::Error::other(format!(
                "image entry {p:?}: the path must not contain . or .."
            )));
        }
        if by_path.insert(p.to_string(), e.clone()).is_some() {
            return Err(io::Error::other(format!(
                "image entry {p:?} is given twice"
            )));
        }
    }
    let mut parents = BTreeSet::new();
    for p in by_path.keys() {
        let mut cur = p.as_str();
        while let Some(i) = cur.rfind('/') {
            cur = &cur[..i];
            if cur.is_empty() {
                break;
            }
            parents.insert(cur.to_string());
        }
    }
    for p in parents {
        match by_path.get(&p) {
            None => {
                by_path.insert(
                    p.clone(),
                    Entry::Dir {
                        path: p,
                        mode: 0o755,
                    },
                );
            }
            Some(Entry::Dir { .. }) => {}
            Some(_) => {
                return Err(io::Error::other(format!(
                    "image entry {p:?} is not a directory but has entries below it"
                )))
            }
        }
    }
    Ok(by_path.into_values().collect())
}

fn read_content(c: &Content) -> io::Result<Vec<u8>> {
    match c {
        Content::Bytes(b) => Ok(b.clone()),
        Content::From(p) => std::fs::read(p)
            .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", p.display()))),
    }
}

fn tar_header(kind: tar::EntryType, mode: u32, size: u64, epoch: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(epoch);
    h.set_uid(0);
    h.set_gid(0);
    // Empty owner names: the numeric ids are what a runtime uses.
    let _ = h.set_username("");
    let _ = h.set_groupname("");
    h
}

/// `entries` as a reproducible gzip-compressed tarball (paths relative, sorted, 0:0, every
/// time `epoch`): what the release ships deploy/ in.
pub fn tar_gz(entries: &[Entry], epoch: u64) -> io::Result<Vec<u8>> {
    let (tar, _) = layer_tar(entries, epoch)?;
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::default());
    gz.write_all(&tar)?;
    gz.finish()
}

/// The layer as an uncompressed tar and the unpacked size of its files.
fn layer_tar(entries: &[Entry], epoch: u64) -> io::Result<(Vec<u8>, u64)> {
    let mut b = tar::Builder::new(Vec::new());
    let mut unpacked = 0u64;
    for e in normalized_entries(entries)? {
        let rel = &e.path()[1..];
        match &e {
            Entry::Dir { mode, .. } => {
                let mut h = tar_header(tar::EntryType::Directory, *mode, 0, epoch);
                b.append_data(&mut h, format!("{rel}/"), io::empty())?;
            }
            Entry::File { mode, content, .. } => {
                let data = read_content(content)?;
                unpacked += data.len() as u64;
                let mut h = tar_header(tar::EntryType::Regular, *mode, data.len() as u64, epoch);
                b.append_data(&mut h, rel, data.as_slice())?;
            }
            Entry::Symlink { target, .. } => {
                let mut h = tar_header(tar::EntryType::Symlink, 0o777, 0, epoch);
                b.append_link(&mut h, rel, target)?;
            }
        }
    }
    Ok((b.into_inner()?, unpacked))
}

/// RFC 3339 UTC time of `epoch` seconds (Howard Hinnant's days-to-civil algorithm).
pub fn rfc3339(epoch: u64) -> String {
    let days = (epoch / 86_400) as i64;
    let secs = epoch % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// The tag of `reference` (`v0.1.0` of `localhost/kube-nlproxy:v0.1.0`).
fn tag_of(reference: &str) -> io::Result<&str> {
    let last = reference.rsplit('/').next().unwrap_or(reference);
    match last.split_once(':') {
        Some((_, tag)) if !tag.is_empty() => Ok(tag),
        _ => Err(io::Error::other(format!(
            "image reference {reference:?} has no tag"
        ))),
    }
}

/// The blobs of an image, by digest, and the index and Docker manifest over them.
struct Layout {
    blobs: Vec<(String, Vec<u8>)>,
    index: Vec<u8>,
    docker_manifest: Vec<u8>,
    /// Bytes of the manifest blob (its digest is `written.digest`).
    manifest_size: usize,
    written: Written,
}

fn build_layout(image: &Image) -> io::Result<Layout> {
    let tag = tag_of(&image.reference)?;
    let (tar, unpacked_size) = layer_tar(&image.entries, image.epoch)?;
    let diff_id = sha256_hex(&tar);
    let (layer, layer_media) = if image.gzip {
        let mut gz = flate2::GzBuilder::new()
            .mtime(0)
            .write(Vec::new(), flate2::Compression::default());
        gz.write_all(&tar)?;
        (gz.finish()?, MEDIA_LAYER_GZIP)
    } else {
        (tar, MEDIA_LAYER)
    };
    let layer_digest = sha256_hex(&layer);
    let created = rfc3339(image.epoch);
    let mut config = serde_json::json!({
        "architecture": image.architecture,
        "os": "linux",
        "created": created,
        "config": {
            "User": image.user,
            "Env": image.env,
            "Entrypoint": image.entrypoint,
            "Labels": image.labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
        "history": [{"created": created, "created_by": "cargo xtask image"}],
    });
    if !image.cmd.is_empty() {
        config["config"]["Cmd"] = serde_json::json!(image.cmd);
    }
    if let Some(v) = &image.variant {
        config["variant"] = serde_json::json!(v);
    }
    let config = serde_json::to_vec(&config)?;
    let config_digest = sha256_hex(&config);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {
            "mediaType": MEDIA_CONFIG,
            "digest": format!("sha256:{config_digest}"),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": layer_media,
            "digest": format!("sha256:{layer_digest}"),
            "size": layer.len(),
        }],
    }))?;
    let manifest_digest = sha256_hex(&manifest);
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [{
            "mediaType": MEDIA_MANIFEST,
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest.len(),
            "annotations": {
                "io.containerd.image.name": image.reference,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    }))?;
    let docker_manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": format!("blobs/sha256/{config_digest}"),
        "RepoTags": [image.reference],
        "Layers": [format!("blobs/sha256/{layer_digest}")],
    }]))?;
    let layer_size = layer.len() as u64;
    let manifest_size = manifest.len();
    let mut blobs = vec![
        (config_digest, config),
        (layer_digest, layer),
        (manifest_digest.clone(), manifest),
    ];
    blobs.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Layout {
        blobs,
        index,
        docker_manifest,
        manifest_size,
        written: Written {
            digest: format!("sha256:{manifest_digest}"),
            archive_size: 0,
            layer_size,
            unpacked_size,
        },
    })
}

/// An image as a registry stores it: the manifest, its digest, and the config and layer
/// blobs by hex digest (what a fake registry serves under `/v2/NAME/manifests/` and
/// `/v2/NAME/blobs/`).
pub struct RegistryImage {
    pub manifest_digest: String,
    pub manifest: Vec<u8>,
    pub blobs: Vec<(String, Vec<u8>)>,
}

/// `image` as [`RegistryImage`]: the same bytes [`write_archive`] writes.
pub fn registry_image(image: &Image) -> io::Result<RegistryImage> {
    let layout = build_layout(image)?;
    let manifest_hex = layout
        .written
        .digest
        .strip_prefix("sha256:")
        .unwrap_or(&layout.written.digest)
        .to_string();
    let mut manifest = Vec::new();
    let mut blobs = Vec::new();
    for (digest, data) in layout.blobs {
        if digest == manifest_hex {
            manifest = data;
        } else {
            blobs.push((digest, data));
        }
    }
    Ok(RegistryImage {
        manifest_digest: layout.written.digest,
        manifest,
        blobs,
    })
}

/// Writes `image` as an OCI image-layout tarball at `out` (through a temporary file beside
/// it, renamed into place, so a reader never sees half an image).
pub fn write_archive(image: &Image, out: &Path) -> io::Result<Written> {
    let layout = build_layout(image)?;
    let archive_size = write_layout_tar(
        out,
        image.epoch,
        &layout.blobs,
        &layout.index,
        Some(&layout.docker_manifest),
    )?;
    Ok(Written {
        archive_size,
        ..layout.written
    })
}

/// Writes one OCI image-layout tarball holding an image **index** over `images`, one per
/// platform (what `docker buildx --platform linux/amd64,linux/arm64 --output type=oci`
/// writes): `index.json` names the index, tagged as `reference`; the index lists each
/// platform's manifest. `crane push`, `skopeo copy --all` and `ctr images import
/// --all-platforms` read it; `docker load` takes one platform's archive instead
/// ([`write_archive`]), so this one has no Docker `manifest.json`. The returned digest is
/// the index's: the digest the multi-platform image has in a registry.
pub fn write_index_archive(images: &[Image], reference: &str, out: &Path) -> io::Result<Written> {
    let tag = tag_of(reference)?;
    let Some(first) = images.first() else {
        return Err(io::Error::other("an image index needs at least one image"));
    };
    let mut blobs: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut manifests = Vec::new();
    let mut platforms = BTreeSet::new();
    let (mut layer_size, mut unpacked_size) = (0, 0);
    for image in images {
        let platform = (image.architecture.clone(), image.variant.clone());
        if !platforms.insert(platform) {
            return Err(io::Error::other(format!(
                "two images for the platform linux/{} in one index",
                image.architecture
            )));
        }
        if image.epoch != first.epoch {
            return Err(io::Error::other(
                "the images of one index must share one epoch (SOURCE_DATE_EPOCH)",
            ));
        }
        let layout = build_layout(image)?;
        let mut platform = serde_json::json!({
            "architecture": image.architecture,
            "os": "linux",
        });
        if let Some(v) = &image.variant {
            platform["variant"] = serde_json::json!(v);
        }
        manifests.push(serde_json::json!({
            "mediaType": MEDIA_MANIFEST,
            "digest": layout.written.digest,
            "size": layout.manifest_size,
            "platform": platform,
        }));
        layer_size += layout.written.layer_size;
        unpacked_size += layout.written.unpacked_size;
        blobs.extend(layout.blobs);
    }
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": manifests,
    }))?;
    let index_digest = sha256_hex(&index);
    let top = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [{
            "mediaType": MEDIA_INDEX,
            "digest": format!("sha256:{index_digest}"),
            "size": index.len(),
            "annotations": {
                "io.containerd.image.name": reference,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    }))?;
    blobs.insert(index_digest.clone(), index);
    let blobs: Vec<(String, Vec<u8>)> = blobs.into_iter().collect();
    let archive_size = write_layout_tar(out, first.epoch, &blobs, &top, None)?;
    Ok(Written {
        digest: format!("sha256:{index_digest}"),
        archive_size,
        layer_size,
        unpacked_size,
    })
}

/// The tarball of an OCI image layout: `blobs` (sorted by digest), `index.json`, Docker's
/// `manifest.json` when given, `oci-layout`; written through a temporary file. Returns its
/// size.
fn write_layout_tar(
    out: &Path,
    epoch: u64,
    blobs: &[(String, Vec<u8>)],
    index: &[u8],
    docker_manifest: Option<&[u8]>,
) -> io::Result<u64> {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |path: &str, kind: tar::EntryType, data: &[u8]| -> io::Result<()> {
        let mode = if kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        };
        let mut h = tar_header(kind, mode, data.len() as u64, epoch);
        b.append_data(&mut h, path, data)
    };
    add("blobs/", tar::EntryType::Directory, &[])?;
    add("blobs/sha256/", tar::EntryType::Directory, &[])?;
    for (digest, data) in blobs {
        add(
            &format!("blobs/sha256/{digest}"),
            tar::EntryType::Regular,
            data,
        )?;
    }
    add("index.json", tar::EntryType::Regular, index)?;
    if let Some(m) = docker_manifest {
        add("manifest.json", tar::EntryType::Regular, m)?;
    }
    add(
        "oci-layout",
        tar::EntryType::Regular,
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    let bytes = b.into_inner()?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, &bytes)?;
    std::fs::rename(&tmp, out)?;
    Ok(bytes.len() as u64)
}

/// Writes `image`'s file tree under `dir` (what `deploy/Dockerfile` copies into its final
/// stage), modes as in the layer. `dir` must not exist or be empty.
pub fn write_rootfs(image: &Image, dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    if std::fs::read_dir(dir)?.next().is_some() {
        return Err(io::Error::other(format!(
            "{} is not empty: the root filesystem is written into an empty directory",
            dir.display()
        )));
    }
    for e in normalized_entries(&image.entries)? {
        let p = dir.join(&e.path()[1..]);
        match &e {
            Entry::Dir { mode, .. } => {
                std::fs::create_dir_all(&p)?;
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode))?;
            }
            Entry::File { mode, content, .. } => {
                std::fs::write(&p, read_content(content)?)?;
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode))?;
            }
            Entry::Symlink { target, .. } => std::os::unix::fs::symlink(target, &p)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(gzip: bool) -> Image {
        Image {
            reference: "localhost/demo:v1".into(),
            entries: vec![
                Entry::File {
                    path: "/usr/local/bin/demo".into(),
                    mode: 0o755,
                    content: Content::Bytes(b"#!demo".to_vec()),
                },
                Entry::Symlink {
                    path: "/bin/demo".into(),
                    target: "/usr/local/bin/demo".into(),
                },
            ],
            entrypoint: vec!["/bin/demo".into()],
            cmd: vec![],
            user: "0:0".into(),
            env: vec![],
            labels: BTreeMap::new(),
            epoch: 0,
            gzip,
            architecture: "amd64".into(),
            variant: None,
        }
    }

    fn archive(image: &Image) -> (Written, Vec<u8>) {
        // A directory per call: the tests run in parallel and each removes its own.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("xtask-oci-{}-{n}", std::process::id()));
        let out = dir.join(format!("{}.tar", image.gzip));
        let w = write_archive(image, &out).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        (w, bytes)
    }

    fn members(tar_bytes: &[u8]) -> BTreeMap<String, Vec<u8>> {
        let mut a = tar::Archive::new(tar_bytes);
        let mut out = BTreeMap::new();
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let p = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            io::Read::read_to_end(&mut e, &mut data).unwrap();
            out.insert(p, data);
        }
        out
    }

    #[test]
    fn an_index_archive_lists_each_platforms_manifest_and_holds_every_blob() {
        let amd64 = image(true);
        let mut arm64 = image(true);
        arm64.architecture = "arm64".into();
        arm64.variant = Some("v8".into());
        arm64.entries.push(Entry::Dir {
            path: "/arm".into(),
            mode: 0o755,
        });
        let dir = std::env::temp_dir().join(format!("xtask-oci-index-{}", std::process::id()));
        let out = dir.join("index.tar");
        let w = write_index_archive(&[amd64.clone(), arm64.clone()], "localhost/demo:v1", &out)
            .unwrap();
        let m = members(&std::fs::read(&out).unwrap());
        assert!(
            !m.contains_key("manifest.json"),
            "docker load takes one platform"
        );
        let blob = |digest: &str| -> &[u8] {
            let hex = digest.strip_prefix("sha256:").unwrap();
            let data = &m[&format!("blobs/sha256/{hex}")];
            assert_eq!(sha256_hex(data), hex, "a blob's name is its digest");
            data
        };
        let json = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).unwrap();
        let top = json(&m["index.json"]);
        let entry = &top["manifests"][0];
        assert_eq!(entry["mediaType"], MEDIA_INDEX);
        assert_eq!(
            entry["annotations"]["org.opencontainers.image.ref.name"],
            "v1"
        );
        assert_eq!(entry["digest"], w.digest);
        let index = json(blob(entry["digest"].as_str().unwrap()));
        let listed = index["manifests"].as_array().unwrap();
        assert_eq!(listed.len(), 2);
        for (d, img) in listed.iter().zip([&amd64, &arm64]) {
            // Each platform's manifest is the one its own archive has, config included.
            assert_eq!(d["digest"].as_str(), Some(archive(img).0.digest.as_str()));
            assert_eq!(d["platform"]["architecture"], img.architecture.as_str());
            assert_eq!(d["platform"]["os"], "linux");
            assert_eq!(d["platform"]["variant"].as_str(), img.variant.as_deref());
            let manifest = json(blob(d["digest"].as_str().unwrap()));
            let config = json(blob(manifest["config"]["digest"].as_str().unwrap()));
            assert_eq!(config["architecture"], img.architecture.as_str());
            blob(manifest["layers"][0]["digest"].as_str().unwrap());
        }
        // Refused: one platform twice, no image.
        let twice = write_index_archive(&[amd64.clone(), amd64], "localhost/demo:v1", &out);
        assert!(twice.unwrap_err().to_string().contains("linux/amd64"));
        assert!(write_index_archive(&[], "localhost/demo:v1", &out).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_same_image_gives_the_same_bytes() {
        let (a, bytes_a) = archive(&image(true));
        let (b, bytes_b) = archive(&image(true));
        assert_eq!(a.digest, b.digest);
        assert_eq!(bytes_a, bytes_b);
        let mut changed = image(true);
        changed.epoch = 1;
        assert_ne!(archive(&changed).0.digest, a.digest);
    }

    #[test]
    fn registry_image_holds_the_archives_manifest_and_every_blob_it_names() {
        let img = image(false);
        let (w, bytes) = archive(&img);
        let r = registry_image(&img).unwrap();
        assert_eq!(r.manifest_digest, w.digest);
        assert_eq!(format!("sha256:{}", sha256_hex(&r.manifest)), w.digest);
        let m = members(&bytes);
        let manifest: serde_json::Value = serde_json::from_slice(&r.manifest).unwrap();
        let named: BTreeSet<String> = std::iter::once(&manifest["config"])
            .chain(manifest["layers"].as_array().unwrap())
            .map(|d| d["digest"].as_str().unwrap()["sha256:".len()..].to_string())
            .collect();
        let held: BTreeSet<String> = r.blobs.iter().map(|(d, _)| d.clone()).collect();
        assert_eq!(named, held);
        for (d, data) in &r.blobs {
            assert_eq!(&m[&format!("blobs/sha256/{d}")], data);
        }
    }

    #[test]
    fn index_names_the_image_and_blobs_match_their_digests() {
        let (w, bytes) = archive(&image(true));
        let m = members(&bytes);
        let index: serde_json::Value = serde_json::from_slice(&m["index.json"]).unwrap();
        let desc = &index["manifests"][0];
        assert_eq!(desc["digest"], w.digest);
        assert_eq!(
            desc["annotations"]["io.containerd.image.name"],
            "localhost/demo:v1"
        );
        assert_eq!(
            desc["annotations"]["org.opencontainers.image.ref.name"],
            "v1"
        );
        for (path, data) in &m {
            if let Some(d) = path.strip_prefix("blobs/sha256/").filter(|d| !d.is_empty()) {
                assert_eq!(sha256_hex(data), d, "{path}");
            }
        }
        let manifest: serde_json::Value =
            serde_json::from_slice(&m[&format!("blobs/sha256/{}", &w.digest["sha256:".len()..])])
                .unwrap();
        assert_eq!(manifest["layers"][0]["mediaType"], MEDIA_LAYER_GZIP);
        let docker: serde_json::Value = serde_json::from_slice(&m["manifest.json"]).unwrap();
        assert_eq!(docker[0]["RepoTags"][0], "localhost/demo:v1");
        assert_eq!(
            docker[0]["Layers"][0],
            format!(
                "blobs/sha256/{}",
                &manifest["layers"][0]["digest"].as_str().unwrap()[7..]
            )
        );
    }

    #[test]
    fn layer_holds_the_tree_owned_by_root_with_parents() {
        let (tar, unpacked) = layer_tar(&image(false).entries, 0).unwrap();
        assert_eq!(unpacked, 6);
        let mut a = tar::Archive::new(tar.as_slice());
        let mut seen = Vec::new();
        for e in a.entries().unwrap() {
            let e = e.unwrap();
            let h = e.header();
            assert_eq!(
                (h.uid().unwrap(), h.gid().unwrap(), h.mtime().unwrap()),
                (0, 0, 0)
            );
            seen.push((
                e.path().unwrap().to_string_lossy().into_owned(),
                h.entry_type(),
                h.mode().unwrap(),
            ));
        }
        use tar::EntryType::*;
        assert_eq!(
            seen,
            vec![
                ("bin/".into(), Directory, 0o755),
                ("bin/demo".into(), Symlink, 0o777),
                ("usr/".into(), Directory, 0o755),
                ("usr/local/".into(), Directory, 0o755),
                ("usr/local/bin/".into(), Directory, 0o755),
                ("usr/local/bin/demo".into(), Regular, 0o755),
            ]
        );
    }

    #[test]
    fn bad_entries_are_refused_by_name() {
        let twice = vec![
            Entry::Dir {
                path: "/a".into(),
                mode: 0o755,
            },
            Entry::Dir {
                path: "/a".into(),
                mode: 0o700,
            },
        ];
        assert!(normalized_entries(&twice)
            .unwrap_err()
            .to_string()
            .contains("\"/a\" is given twice"));
        let relative = vec![Entry::Dir {
            path: "a".into(),
            mode: 0o755,
        }];
        assert!(normalized_entries(&relative).is_err());
        let dotdot = vec![Entry::Dir {
            path: "/a/../b".into(),
            mode: 0o755,
        }];
        assert!(normalized_entries(&dotdot).is_err());
        let file_parent = vec![
            Entry::File {
                path: "/a".into(),
                mode: 0o644,
                content: Content::Bytes(vec![]),
            },
            Entry::File {
                path: "/a/b".into(),
                mode: 0o644,
                content: Content::Bytes(vec![]),
            },
        ];
        assert!(normalized_entries(&file_parent).is_err());
        let mut no_tag = image(true);
        no_tag.reference = "localhost:5000/demo".into();
        assert!(build_layout(&no_tag).is_err());
    }

    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_256_000 + 3_723), "2026-12-03T01:02:03Z");
    }
}
