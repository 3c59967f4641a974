//! `cargo xtask release`: the one directory an operator adopts kube-nlproxy from, without
//! our source. For each platform (linux/amd64, linux/arm64): the statically linked binary,
//! its image as an OCI archive (`docker load`, `ctr images import`) and its SPDX SBOM; the
//! OCI image **index** over both (`skopeo copy --all`, `crane push`); deploy/ as a tarball;
//! LICENSE; release notes from CHANGELOG.md's section with every digest; `SHA256SUMS` over
//! all of it (`sha256sum -c SHA256SUMS`).
//!
//! Pure: the notes, the sums and the file names. I/O: [`write_release`] writes the files.

use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::image::Arch;
use crate::oci::{self, Content, Entry, Image};

/// One platform's part of a release, built.
pub struct PlatformBuild {
    pub arch: Arch,
    /// The statically linked binary.
    pub binary: PathBuf,
    /// The image around it (its docs hold the SBOM and notices).
    pub image: Image,
    /// The SPDX SBOM and the third-party notices the image carries.
    pub sbom: Vec<u8>,
    pub notices: Vec<u8>,
}

/// What [`write_release`] wrote, for the summary and the tests.
pub struct Release {
    pub dir: PathBuf,
    /// The image index's digest (the multi-platform image's digest in a registry).
    pub index_digest: String,
    /// (platform, its manifest's digest).
    pub platform_digests: Vec<(Arch, String)>,
    /// Every file written, SHA256SUMS last.
    pub files: Vec<String>,
}

/// `kube-nlproxy-vVERSION-linux-ARCH` and the names beside it.
pub fn binary_name(version: &str, arch: Arch) -> String {
    format!("kube-nlproxy-v{version}-linux-{}", arch.name())
}

pub fn platform_archive_name(version: &str, arch: Arch) -> String {
    format!("{}.oci.tar", binary_name(version, arch))
}

pub fn index_archive_name(version: &str) -> String {
    format!("kube-nlproxy-v{version}.oci.tar")
}

pub fn deploy_archive_name(version: &str) -> String {
    format!("kube-nlproxy-v{version}-deploy.tar.gz")
}

/// The body of CHANGELOG.md's `## VERSION` section (a heading such as `## 0.1.0` or
/// `## 0.1.0 (unreleased)`), without its heading, up to the next `## `.
pub fn changelog_section(changelog: &str, version: &str) -> Result<String, String> {
    let mut lines = changelog.lines();
    let found = lines.by_ref().any(|l| {
        l.strip_prefix("## ")
            .and_then(|h| h.split_whitespace().next())
            .is_some_and(|v| v == version)
    });
    if !found {
        return Err(format!(
            "CHANGELOG.md has no \"## {version}\" section: write the release's changes there first"
        ));
    }
    let body: Vec<&str> = lines.take_while(|l| !l.starts_with("## ")).collect();
    Ok(body.join("\n").trim().to_string())
}

/// The upstream kube-proxy release `version` tracks: the second column of CHANGELOG.md's
/// versioning table row `| VERSION | vX.Y.Z | … |`.
pub fn tracked_upstream(changelog: &str, version: &str) -> Result<String, String> {
    changelog
        .lines()
        .find_map(|l| {
            let mut cells = l.strip_prefix('|')?.split('|').map(str::trim);
            (cells.next()? == version).then(|| cells.next().map(str::to_string))?
        })
        .filter(|t| t.starts_with('v'))
        .ok_or_else(|| {
            format!("CHANGELOG.md's versioning table has no row for {version} naming the kube-proxy release it tracks")
        })
}

/// `sha256sum`'s output for `files` (name, content), sorted by name: `HEX  NAME` lines.
pub fn sha256sums(files: &[(String, Vec<u8>)]) -> String {
    let mut lines: Vec<String> = files
        .iter()
        .map(|(name, data)| {
            let d = Sha256::digest(data);
            let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
            format!("{hex}  {name}\n")
        })
        .collect();
    lines.sort_by(|a, b| a[66..].cmp(&b[66..]));
    lines.concat()
}

/// What the notes say about one release.
pub struct NotesInput<'a> {
    pub version: &'a str,
    /// The upstream kube-proxy release this one tracks (`v1.37.2`).
    pub tracks: &'a str,
    /// The git commit it was built from ("" when unknown).
    pub revision: &'a str,
    pub changes: &'a str,
    pub index_digest: &'a str,
    pub platform_digests: &'a [(Arch, String)],
}

/// RELEASE_NOTES.md: the changes, then what each file is and how to load and push the
/// image by digest.
pub fn release_notes(n: &NotesInput) -> String {
    let v = n.version;
    let mut s = format!("# kube-nlproxy v{v}\n\nTracks kube-proxy {}.", n.tracks);
    if !n.revision.is_empty() {
        s.push_str(&format!(" Built from commit {}.", n.revision));
    }
    s.push_str(&format!("\n\n## Changes\n\n{}\n\n## Image\n\n", n.changes));
    s.push_str(&format!(
        "`{}`: the OCI image index, digest `{}`, for these platforms:\n\n",
        index_archive_name(v),
        n.index_digest
    ));
    s.push_str("| platform | manifest digest | archive for `docker load` / `ctr images import` |\n|---|---|---|\n");
    for (arch, digest) in n.platform_digests {
        s.push_str(&format!(
            "| linux/{} | `{digest}` | `{}` |\n",
            arch.name(),
            platform_archive_name(v, *arch)
        ));
    }
    s.push_str(&format!(
        "\nPush every platform at once, then refer to the image by its tag or by the index's digest:\n\n\
```sh\n\
skopeo copy --all oci-archive:{index} docker://REGISTRY/kube-nlproxy:v{v}\n\
# or: crane push {index} REGISTRY/kube-nlproxy:v{v}\n\
```\n\n\
Install: unpack `{deploy}` (deploy/ and the kustomization beside it), point the image at the \
registry with `kustomize edit set image localhost/kube-nlproxy=REGISTRY/kube-nlproxy:v{v}` in \
`deploy/images/`, and follow README's Install section from `kubectl apply -k .`.\n\n\
## Files\n\n\
- `{bin_amd64}`, `{bin_arm64}`: the statically linked binaries (what each image holds).\n\
- `sbom-linux-ARCH.spdx.json`, `THIRD_PARTY_NOTICES-linux-ARCH`: every crate and the C \
runtime each binary links, with versions and licences (also in each image under \
`/usr/share/doc/kube-nlproxy/`).\n\
- `LICENSE`: Apache-2.0.\n\
- `SHA256SUMS`: check everything with `sha256sum -c SHA256SUMS`.\n",
        index = index_archive_name(v),
        deploy = deploy_archive_name(v),
        bin_amd64 = binary_name(v, Arch::Amd64),
        bin_arm64 = binary_name(v, Arch::Arm64),
    ));
    s
}

/// The files under `dir` (recursively, sorted) as image entries under `/deploy/…`.
pub fn tree_entries(root: &Path, dir: &str) -> io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut stack = vec![root.join(dir)];
    while let Some(d) = stack.pop() {
        for e in
            std::fs::read_dir(&d).map_err(|e| io::Error::other(format!("{}: {e}", d.display())))?
        {
            let e = e?;
            let p = e.path();
            if e.file_type()?.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).map_err(io::Error::other)?;
                out.push(Entry::File {
                    path: format!("/{}", rel.display()),
                    mode: 0o644,
                    content: Content::From(p.clone()),
                });
            }
        }
    }
    out.sort_by(|a, b| a.path().cmp(b.path()));
    Ok(out)
}

/// The release notes from the index's digest and each platform's manifest digest.
pub type Notes<'a> = &'a dyn Fn(&str, &[(Arch, String)]) -> String;

/// Writes the release of `version` into `dir` (created; it must be empty or absent):
/// the platforms' files, the index, deploy/ and the kustomization beside it from `root`,
/// LICENSE, the notes, and SHA256SUMS over everything else.
pub fn write_release(
    dir: &Path,
    root: &Path,
    version: &str,
    notes: Notes,
    platforms: &[PlatformBuild],
) -> io::Result<Release> {
    std::fs::create_dir_all(dir)?;
    if std::fs::read_dir(dir)?.next().is_some() {
        return Err(io::Error::other(format!(
            "{} is not empty: a release is written into an empty directory",
            dir.display()
        )));
    }
    let reference = platforms
        .first()
        .map(|p| p.image.reference.clone())
        .ok_or_else(|| io::Error::other("a release needs at least one platform"))?;
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut platform_digests = Vec::new();
    for p in platforms {
        let name = platform_archive_name(version, p.arch);
        let w = oci::write_archive(&p.image, &dir.join(&name))?;
        platform_digests.push((p.arch, w.digest));
        files.push((name.clone(), std::fs::read(dir.join(&name))?));
        let binary = std::fs::read(&p.binary)
            .map_err(|e| io::Error::other(format!("{}: {e}", p.binary.display())))?;
        files.push((binary_name(version, p.arch), binary));
        files.push((
            format!("sbom-linux-{}.spdx.json", p.arch.name()),
            p.sbom.clone(),
        ));
        files.push((
            format!("THIRD_PARTY_NOTICES-linux-{}", p.arch.name()),
            p.notices.clone(),
        ));
    }
    let images: Vec<Image> = platforms.iter().map(|p| p.image.clone()).collect();
    let index_name = index_archive_name(version);
    let index = oci::write_index_archive(&images, &reference, &dir.join(&index_name))?;
    files.push((index_name.clone(), std::fs::read(dir.join(&index_name))?));
    let mut deploy = tree_entries(root, "deploy")?;
    deploy.push(Entry::File {
        path: "/kustomization.yaml".into(),
        mode: 0o644,
        content: Content::From(root.join("kustomization.yaml")),
    });
    let epoch = platforms[0].image.epoch;
    files.push((deploy_archive_name(version), oci::tar_gz(&deploy, epoch)?));
    files.push(("LICENSE".into(), std::fs::read(root.join("LICENSE"))?));
    files.push((
        "RELEASE_NOTES.md".into(),
        notes(&index.digest, &platform_digests).into_bytes(),
    ));
    let sums = sha256sums(&files);
    // The archives are on disk already (written by oci, read back for the sums).
    let archives: Vec<String> = platforms
        .iter()
        .map(|p| platform_archive_name(version, p.arch))
        .chain([index_name])
        .collect();
    for (name, data) in files.iter().filter(|(n, _)| !archives.contains(n)) {
        std::fs::write(dir.join(name), data)?;
    }
    std::fs::write(dir.join("SHA256SUMS"), &sums)?;
    // The binaries keep their execute bit.
    for p in platforms {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(binary_name(version, p.arch));
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    }
    let mut names: Vec<String> = files.into_iter().map(|(n, _)| n).collect();
    names.sort();
    names.push("SHA256SUMS".into());
    Ok(Release {
        dir: dir.to_path_buf(),
        index_digest: index.digest,
        platform_digests,
        files: names,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHANGELOG: &str = "# Changelog\n\n## Versioning\n\ntext\n\n## 0.2.0\n\n- two\n\n## 0.1.0 (unreleased)\n\nThe first.\n\n- one\n";

    #[test]
    fn the_changelog_section_of_the_version_is_the_notes_changes() {
        assert_eq!(
            changelog_section(CHANGELOG, "0.1.0").unwrap(),
            "The first.\n\n- one"
        );
        assert_eq!(changelog_section(CHANGELOG, "0.2.0").unwrap(), "- two");
        let e = changelog_section(CHANGELOG, "0.3.0").unwrap_err();
        assert!(e.contains("\"## 0.3.0\""), "{e}");
        // A heading that only starts with the version is another version.
        assert!(changelog_section(CHANGELOG, "0.1").is_err());
    }

    #[test]
    fn the_tracked_release_is_read_from_the_versioning_table() {
        let t = "| kube-nlproxy | tracks kube-proxy | API |\n|---|---|---|\n| 0.1.0 | v1.37.2 | v1.37.2 |\n";
        assert_eq!(tracked_upstream(t, "0.1.0").unwrap(), "v1.37.2");
        assert!(tracked_upstream(t, "0.2.0").unwrap_err().contains("0.2.0"));
    }

    #[test]
    fn sums_are_sha256sums_lines_sorted_by_name() {
        let sums = sha256sums(&[("b".into(), b"abc".to_vec()), ("a".into(), vec![])]);
        assert_eq!(
            sums,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  a\n\
             ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  b\n"
        );
    }

    #[test]
    fn the_notes_name_every_platform_digest_and_file() {
        let digests = [
            (Arch::Amd64, "sha256:aaa".to_string()),
            (Arch::Arm64, "sha256:bbb".to_string()),
        ];
        let n = release_notes(&NotesInput {
            version: "0.1.0",
            tracks: "v1.37.2",
            revision: "0123abc",
            changes: "- one",
            index_digest: "sha256:iii",
            platform_digests: &digests,
        });
        for want in [
            "# kube-nlproxy v0.1.0",
            "Tracks kube-proxy v1.37.2. Built from commit 0123abc.",
            "- one",
            "digest `sha256:iii`",
            "| linux/amd64 | `sha256:aaa` | `kube-nlproxy-v0.1.0-linux-amd64.oci.tar` |",
            "| linux/arm64 | `sha256:bbb` | `kube-nlproxy-v0.1.0-linux-arm64.oci.tar` |",
            "skopeo copy --all oci-archive:kube-nlproxy-v0.1.0.oci.tar",
            "kube-nlproxy-v0.1.0-deploy.tar.gz",
            "sha256sum -c SHA256SUMS",
        ] {
            assert!(n.contains(want), "{want:?} missing from:\n{n}");
        }
    }
}
