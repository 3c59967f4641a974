//! What the release binary is made of, for the image's SBOM (SPDX 2.3 JSON) and its
//! third-party notices: every crate linked into `kube-nlproxy` for a target (its normal,
//! non-proc-macro dependencies as `cargo tree` resolves them for that platform, described by
//! `cargo metadata`, with Cargo.lock's checksums), and the C runtime linked statically with
//! it (glibc's `libc.a` and GCC's `libgcc`, at the versions of the Debian packages that
//! supplied them). The parsing and rendering are pure ([`tree_crates`], [`linked_crates`],
//! [`c_runtime`], [`spdx`], [`notices`]); [`collect`] runs `cargo tree` and `cargo metadata`
//! and reads the licence files from cargo's registry and Debian's doc directories.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

/// One thing linked into the binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component {
    pub name: String,
    pub version: String,
    /// An SPDX licence expression (Cargo's old `A/B` written `A OR B`).
    pub license: String,
    /// Where its source is fetched from.
    pub download: String,
    /// Cargo.lock's sha256 of the crate file, where there is one.
    pub sha256: Option<String>,
    /// A package URL (`pkg:cargo/…`, `pkg:deb/debian/…`).
    pub purl: String,
    /// The directory holding its licence files (a crate's source, a Debian package's doc
    /// directory), where known.
    pub source_dir: Option<PathBuf>,
    /// Licence texts its licence files refer to rather than include (Debian's
    /// common-licenses).
    pub licence_files: Vec<PathBuf>,
}

/// An SPDX expression from Cargo's `license` field: `/` was Cargo's old spelling of OR.
pub fn spdx_expression(cargo_license: &str) -> String {
    if cargo_license.contains('/') {
        cargo_license
            .split('/')
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" OR ")
    } else {
        cargo_license.trim().to_string()
    }
}

/// Cargo.lock's checksums by (name, version).
pub fn lock_checksums(lock: &str) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    let (mut name, mut version) = (None::<String>, None::<String>);
    let value = |l: &str| {
        l.split_once('=')
            .map(|(_, v)| v.trim().trim_matches('"').to_string())
    };
    for line in lock.lines() {
        let line = line.trim();
        if line == "[[package]]" {
            (name, version) = (None, None);
        } else if line.starts_with("name =") {
            name = value(line);
        } else if line.starts_with("version =") {
            version = value(line);
        } else if line.starts_with("checksum =") {
            if let (Some(n), Some(v), Some(c)) = (&name, &version, value(line)) {
                out.insert((n.clone(), v.clone()), c);
            }
        }
    }
    out
}

/// The crates `cargo tree -e normal,no-proc-macro --prefix none --format {p}` lists, as
/// (name, version): what is linked into the binary with the features that build enables.
/// (`cargo metadata`'s graph unifies the features of the whole workspace, so it also holds
/// crates that only the tests' features pull in.)
pub fn tree_crates(tree: &str) -> BTreeSet<(String, String)> {
    tree.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next()?;
            let version = words.next()?.strip_prefix('v')?;
            Some((name.to_string(), version.to_string()))
        })
        .collect()
}

/// The components for the `linked` crates ([`tree_crates`]), each described from `cargo
/// metadata`'s package list: `root` first, then the others sorted by name and version.
pub fn linked_crates(
    metadata: &Value,
    root: &str,
    linked: &BTreeSet<(String, String)>,
    checksums: &BTreeMap<(String, String), String>,
) -> Result<Vec<Component>, String> {
    let packages: BTreeMap<(&str, &str), &Value> = metadata["packages"]
        .as_array()
        .ok_or("cargo metadata: no packages")?
        .iter()
        .filter_map(|p| Some(((p["name"].as_str()?, p["version"].as_str()?), p)))
        .collect();
    if !linked.iter().any(|(n, _)| n == root) {
        return Err(format!("cargo tree: no {root} in its output"));
    }
    let mut out: Vec<Component> = linked
        .iter()
        .map(|(name, version)| {
            let p = packages
                .get(&(name.as_str(), version.as_str()))
                .ok_or_else(|| format!("cargo metadata: no package {name} {version}"))?;
            let s = |k: &str| p[k].as_str().unwrap_or_default().to_string();
            let (name, version) = (s("name"), s("version"));
            let registry = p["source"]
                .as_str()
                .is_some_and(|src| src.contains("crates.io-index"));
            let license = match p["license"].as_str() {
                Some(l) => spdx_expression(l),
                None => return Err(format!("crate {name} {version} declares no licence")),
            };
            Ok(Component {
                download: if registry {
                    format!("https://crates.io/api/v1/crates/{name}/{version}/download")
                } else {
                    "NOASSERTION".into()
                },
                sha256: checksums.get(&(name.clone(), version.clone())).cloned(),
                purl: format!("pkg:cargo/{name}@{version}"),
                source_dir: p["manifest_path"]
                    .as_str()
                    .and_then(|m| Path::new(m).parent())
                    .map(Path::to_path_buf),
                licence_files: Vec::new(),
                license,
                name,
                version,
            })
        })
        .collect::<Result<_, String>>()?;
    out.sort_by(|a, b| {
        (a.name != root, &a.name, &a.version).cmp(&(b.name != root, &b.name, &b.version))
    });
    Ok(out)
}

/// The C runtime a statically linked `-gnu` binary carries: glibc and libgcc, at the
/// versions of the Debian packages that hold their static archives for `arch` (dpkg's
/// architecture name; `libc6-dev` natively, `libc6-dev-arm64-cross` for a cross build).
pub fn c_runtime(dpkg_status: &str, arch: &str, native: bool) -> Result<Vec<Component>, String> {
    // (package, version) of every installed package.
    let installed: Vec<(&str, &str)> = dpkg_status
        .split("\n\n")
        .filter_map(|stanza| {
            let field = |k: &str| {
                stanza
                    .lines()
                    .find_map(|l| l.strip_prefix(k)?.strip_prefix(": "))
                    .map(str::trim)
            };
            let ok = field("Status").is_some_and(|s| s.ends_with(" installed"));
            ok.then(|| Some((field("Package")?, field("Version")?)))
                .flatten()
        })
        .collect();
    let suffix = if native {
        String::new()
    } else {
        format!("-{arch}-cross")
    };
    let libc = format!("libc6-dev{suffix}");
    // GCC's runtime comes with the compiler's version: libgcc-12-dev, libgcc-14-dev, ...
    let gcc_major = |p: &str| {
        p.strip_prefix("libgcc-")?
            .strip_suffix(&format!("-dev{suffix}"))
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            .map(str::to_string)
    };
    // (the component's name, its licence, the common-licenses file its copyright cites)
    let deb = |package: &str,
               version: &str,
               (name, license, common): (&str, &str, &str),
               source_package: &str| {
        Component {
            name: name.into(),
            download: format!(
                "https://snapshot.debian.org/package/{source_package}/{}/",
                version.replace('+', "%2B")
            ),
            purl: format!("pkg:deb/debian/{package}@{version}?arch={arch}"),
            version: version.into(),
            license: license.into(),
            sha256: None,
            source_dir: Some(PathBuf::from(format!("/usr/share/doc/{package}"))),
            licence_files: vec![PathBuf::from(format!(
                "/usr/share/common-licenses/{common}"
            ))],
        }
    };
    let missing = |what: &str, name: &str| {
        format!("the Debian package {what} is not installed: it supplies the static {name}")
    };
    let (_, libc_version) = installed
        .iter()
        .find(|(p, _)| *p == libc)
        .ok_or_else(|| missing(&libc, "glibc"))?;
    let (gcc_package, gcc_version, major) = installed
        .iter()
        .find_map(|(p, v)| Some((*p, *v, gcc_major(p)?)))
        .ok_or_else(|| missing(&format!("libgcc-N-dev{suffix}"), "libgcc"))?;
    Ok(vec![
        deb(
            &libc,
            libc_version,
            ("glibc", "LGPL-2.1-or-later", "LGPL-2.1"),
            "glibc",
        ),
        deb(
            gcc_package,
            gcc_version,
            ("libgcc", "GPL-3.0-or-later WITH GCC-exception-3.1", "GPL-3"),
            &format!("gcc-{major}"),
        ),
    ])
}

/// An SPDX id from a name and version (letters, digits, `.` and `-` only).
fn spdx_id(c: &Component) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|ch| {
                if ch.is_ascii_alphanumeric() || ch == '.' {
                    ch
                } else {
                    '-'
                }
            })
            .collect()
    };
    format!("SPDXRef-Package-{}-{}", clean(&c.name), clean(&c.version))
}

/// The SPDX 2.3 document: `components[0]` is the binary, which CONTAINS the others
/// (statically linked). `created` is RFC 3339; `namespace` is the document's unique URI.
pub fn spdx(components: &[Component], created: &str, namespace: &str) -> Value {
    let packages: Vec<Value> = components
        .iter()
        .map(|c| {
            let mut p = json!({
                "SPDXID": spdx_id(c),
                "name": c.name,
                "versionInfo": c.version,
                "downloadLocation": c.download,
                "filesAnalyzed": false,
                "licenseConcluded": "NOASSERTION",
                "licenseDeclared": c.license,
                "copyrightText": "NOASSERTION",
                "externalRefs": [{
                    "referenceCategory": "PACKAGE-MANAGER",
                    "referenceType": "purl",
                    "referenceLocator": c.purl,
                }],
            });
            if let Some(sum) = &c.sha256 {
                p["checksums"] = json!([{"algorithm": "SHA256", "checksumValue": sum}]);
            }
            p
        })
        .collect();
    let mut relationships = Vec::new();
    if let Some((main, rest)) = components.split_first() {
        relationships.push(json!({
            "spdxElementId": "SPDXRef-DOCUMENT",
            "relationshipType": "DESCRIBES",
            "relatedSpdxElement": spdx_id(main),
        }));
        for c in rest {
            relationships.push(json!({
                "spdxElementId": spdx_id(main),
                "relationshipType": "CONTAINS",
                "relatedSpdxElement": spdx_id(c),
            }));
        }
    }
    let name = components
        .first()
        .map(|c| format!("{}-{}", c.name, c.version))
        .unwrap_or_default();
    json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": name,
        "documentNamespace": namespace,
        "creationInfo": {"created": created, "creators": ["Tool: kube-nlproxy-xtask"]},
        "packages": packages,
        "relationships": relationships,
    })
}

/// Whether a file in a crate's source is one of its licence or notice files.
pub fn is_licence_file(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    [
        "LICENSE",
        "LICENCE",
        "COPYING",
        "NOTICE",
        "COPYRIGHT",
        "UNLICENSE",
    ]
    .iter()
    .any(|p| upper.starts_with(p))
}

/// The third-party notices: each component with its licence, then the texts its source
/// ships (`texts`: file name and content per component, by SPDX id order of `components`).
pub fn notices(components: &[Component], texts: &[Vec<(String, String)>]) -> String {
    let mut s = String::new();
    let Some((main, rest)) = components.split_first() else {
        return s;
    };
    s.push_str(&format!(
        "{} {} ({}) contains the following third-party software, statically linked.\n\
         Each is listed with its declared licence, then the licence and notice files its\n\
         source distributes. Versions and checksums: sbom.spdx.json beside this file.\n\n",
        main.name, main.version, main.license
    ));
    for c in rest {
        s.push_str(&format!("- {} {}: {}\n", c.name, c.version, c.license));
    }
    if let Some(glibc) = rest.iter().find(|c| c.name == "glibc") {
        s.push_str(&format!(
            "\nRelinking with another GNU C Library (LGPL-2.1 section 6). glibc {} is linked\n\
             statically. The complete source of {} {} is available under {}, and its build\n\
             is reproducible: from that source at the commit this image's\n\
             org.opencontainers.image.revision label names, `cargo xtask release` builds the\n\
             same binary; to relink against a modified glibc, install its static archives in\n\
             place of the Debian package named above ({}) and run the same command (the\n\
             `image` cargo profile, `-C target-feature=+crt-static`). docs/release.md says\n\
             how.\n",
            glibc.version, main.name, main.version, main.license, glibc.purl
        ));
    }
    for (c, files) in rest.iter().zip(texts.iter().skip(1)) {
        s.push_str(&format!("\n{}\n{} {}\n", "=".repeat(78), c.name, c.version));
        if files.is_empty() {
            s.push_str(&format!(
                "(no licence file in its source; declared licence: {}; source: {})\n",
                c.license, c.download
            ));
        }
        for (file, text) in files {
            s.push_str(&format!("--- {file}\n{}\n", text.trim_end()));
        }
    }
    s
}

/// What [`collect`] found.
pub struct Bom {
    /// The binary first, then every crate and the C runtime.
    pub components: Vec<Component>,
    /// Each component's licence files (name, text), in the same order.
    pub texts: Vec<Vec<(String, String)>>,
}

/// The C runtime's components for a Rust target (`x86_64-unknown-linux-gnu`, ...).
fn runtime_for(target: &str) -> io::Result<Vec<Component>> {
    let (arch, native) = match target.split('-').next() {
        Some("x86_64") => ("amd64", cfg!(target_arch = "x86_64")),
        Some("aarch64") => ("arm64", cfg!(target_arch = "aarch64")),
        other => {
            return Err(io::Error::other(format!(
                "no C runtime known for the target architecture {other:?}"
            )))
        }
    };
    let status = std::fs::read_to_string("/var/lib/dpkg/status").map_err(|e| {
        io::Error::other(format!(
            "/var/lib/dpkg/status: {e} (the SBOM names the Debian packages that supply the static C library)"
        ))
    })?;
    c_runtime(&status, arch, native).map_err(io::Error::other)
}

/// Everything linked into `kube-nlproxy` for `target`, read from the workspace at `root`.
pub fn collect(root: &Path, target: &str) -> io::Result<Bom> {
    let metadata = cargo(
        root,
        &[
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--filter-platform",
            target,
        ],
    )?;
    let metadata: Value = serde_json::from_slice(&metadata)
        .map_err(|e| io::Error::other(format!("cargo metadata's output: {e}")))?;
    let tree = cargo(
        root,
        &[
            "tree",
            "--locked",
            "-p",
            "kube-nlproxy",
            "-e",
            "normal,no-proc-macro",
            "--target",
            target,
            "--prefix",
            "none",
            "--format",
            "{p}",
        ],
    )?;
    let lock = std::fs::read_to_string(root.join("Cargo.lock"))?;
    let linked = tree_crates(&String::from_utf8_lossy(&tree));
    let mut components = linked_crates(&metadata, "kube-nlproxy", &linked, &lock_checksums(&lock))
        .map_err(io::Error::other)?;
    components.extend(runtime_for(target)?);
    let texts = components
        .iter()
        .map(|c| {
            let mut texts = licence_texts(c.source_dir.as_deref())?;
            for f in &c.licence_files {
                let text = std::fs::read_to_string(f)
                    .map_err(|e| io::Error::other(format!("{}: {e}", f.display())))?;
                texts.push((f.display().to_string(), text));
            }
            Ok(texts)
        })
        .collect::<io::Result<_>>()?;
    Ok(Bom { components, texts })
}

/// `cargo ARGS` in `root`: its standard output.
fn cargo(root: &Path, args: &[&str]) -> io::Result<Vec<u8>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    #[allow(clippy::disallowed_methods)] // a build task runs cargo
    let out = Command::new(cargo).current_dir(root).args(args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "cargo {}: {}: {}",
            args.first().copied().unwrap_or_default(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(out.stdout)
}

/// The licence and notice files at the top of a source directory, sorted by name.
fn licence_texts(dir: Option<&Path>) -> io::Result<Vec<(String, String)>> {
    let Some(dir) = dir else {
        return Ok(Vec::new());
    };
    let mut files = Vec::new();
    let entries =
        std::fs::read_dir(dir).map_err(|e| io::Error::other(format!("{}: {e}", dir.display())))?;
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if e.file_type()?.is_file() && is_licence_file(&name) {
            let bytes = std::fs::read(e.path())?;
            files.push((name, String::from_utf8_lossy(&bytes).into_owned()));
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_licences_become_spdx_expressions() {
        assert_eq!(spdx_expression("MIT/Apache-2.0"), "MIT OR Apache-2.0");
        assert_eq!(spdx_expression("Unlicense/MIT"), "Unlicense OR MIT");
        assert_eq!(
            spdx_expression("(MIT OR Apache-2.0) AND Unicode-3.0"),
            "(MIT OR Apache-2.0) AND Unicode-3.0"
        );
    }

    #[test]
    fn lock_checksums_are_read_per_package() {
        let lock = "version = 4\n\n[[package]]\nname = \"a\"\nversion = \"1.0.0\"\nsource = \"registry+x\"\nchecksum = \"abc\"\n\n[[package]]\nname = \"local\"\nversion = \"0.1.0\"\n\n[[package]]\nname = \"b\"\nversion = \"2.0.0\"\nchecksum = \"def\"\n";
        let sums = lock_checksums(lock);
        assert_eq!(sums.len(), 2);
        assert_eq!(sums[&("a".into(), "1.0.0".into())], "abc");
        assert_eq!(sums[&("b".into(), "2.0.0".into())], "def");
    }

    fn metadata() -> Value {
        let reg = "registry+https://github.com/rust-lang/crates.io-index";
        let pkg = |name: &str, v: &str, lic: Option<&str>, src: Option<&str>| {
            json!({"name": name, "version": v, "license": lic, "source": src,
                   "manifest_path": format!("/reg/{name}-{v}/Cargo.toml")})
        };
        json!({"packages": [
            pkg("kube-nlproxy", "0.1.0", Some("Apache-2.0"), None),
            pkg("a", "1.0.0", Some("MIT/Apache-2.0"), Some(reg)),
            pkg("b", "2.0.0", Some("MIT"), Some(reg)),
            pkg("only-in-tests", "1.0.0", Some("MIT"), Some(reg)),
        ]})
    }

    /// What `cargo tree --prefix none --format {p}` prints: repeats marked `(*)`, the
    /// workspace package with its path.
    const TREE: &str = "kube-nlproxy v0.1.0 (/work/main)\na v1.0.0\nb v2.0.0\na v1.0.0 (*)\n\n";

    fn linked() -> BTreeSet<(String, String)> {
        tree_crates(TREE)
    }

    #[test]
    fn the_linked_crates_are_cargo_trees_described_by_metadata_root_first() {
        assert_eq!(linked().len(), 3);
        let sums = BTreeMap::from([(("a".to_string(), "1.0.0".to_string()), "abc".to_string())]);
        let c = linked_crates(&metadata(), "kube-nlproxy", &linked(), &sums).unwrap();
        let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
        // A crate cargo metadata knows but the binary does not link is left out.
        assert_eq!(names, ["kube-nlproxy", "a", "b"]);
        assert_eq!(c[1].license, "MIT OR Apache-2.0");
        assert_eq!(c[1].sha256.as_deref(), Some("abc"));
        assert_eq!(c[2].sha256, None);
        assert_eq!(c[1].purl, "pkg:cargo/a@1.0.0");
        assert_eq!(c[0].download, "NOASSERTION");
        assert_eq!(
            c[1].download,
            "https://crates.io/api/v1/crates/a/1.0.0/download"
        );
        assert_eq!(c[1].source_dir, Some(PathBuf::from("/reg/a-1.0.0")));
    }

    #[test]
    fn a_crate_without_a_licence_or_metadata_is_an_error_naming_it() {
        let mut m = metadata();
        m["packages"][2]["license"] = Value::Null;
        let e = linked_crates(&m, "kube-nlproxy", &linked(), &BTreeMap::new()).unwrap_err();
        assert_eq!(e, "crate b 2.0.0 declares no licence");
        let mut more = linked();
        more.insert(("c".into(), "3.0.0".into()));
        let e = linked_crates(&metadata(), "kube-nlproxy", &more, &BTreeMap::new()).unwrap_err();
        assert_eq!(e, "cargo metadata: no package c 3.0.0");
    }

    const DPKG: &str = "Package: libc6-dev\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.36-9+deb12u10\n\nPackage: libgcc-12-dev\nStatus: install ok installed\nVersion: 12.2.0-14+deb12u1\n\nPackage: libc6-dev-arm64-cross\nStatus: deinstall ok config-files\nVersion: 2.36-8cross1\n";

    #[test]
    fn the_c_runtime_is_read_from_the_installed_packages() {
        let c = c_runtime(DPKG, "amd64", true).unwrap();
        assert_eq!(c[0].name, "glibc");
        assert_eq!(c[0].version, "2.36-9+deb12u10");
        assert_eq!(c[0].license, "LGPL-2.1-or-later");
        assert_eq!(
            c[0].purl,
            "pkg:deb/debian/libc6-dev@2.36-9+deb12u10?arch=amd64"
        );
        assert_eq!(
            c[0].download,
            "https://snapshot.debian.org/package/glibc/2.36-9%2Bdeb12u10/"
        );
        assert_eq!(
            c[0].licence_files,
            [PathBuf::from("/usr/share/common-licenses/LGPL-2.1")]
        );
        assert_eq!(
            c[0].source_dir,
            Some(PathBuf::from("/usr/share/doc/libc6-dev"))
        );
        assert_eq!(c[1].name, "libgcc");
        assert_eq!(
            c[1].download,
            "https://snapshot.debian.org/package/gcc-12/12.2.0-14%2Bdeb12u1/"
        );
        // Removed, its configuration kept: not installed.
        let e = c_runtime(DPKG, "arm64", false).unwrap_err();
        assert!(e.contains("libc6-dev-arm64-cross is not installed"), "{e}");
    }

    #[test]
    fn the_spdx_document_says_the_binary_contains_each_component() {
        let sums = BTreeMap::new();
        let mut c = linked_crates(&metadata(), "kube-nlproxy", &linked(), &sums).unwrap();
        c.extend(c_runtime(DPKG, "amd64", true).unwrap());
        let doc = spdx(&c, "1970-01-01T00:00:00Z", "https://example.invalid/spdx/x");
        assert_eq!(doc["spdxVersion"], "SPDX-2.3");
        assert_eq!(doc["name"], "kube-nlproxy-0.1.0");
        assert_eq!(doc["packages"].as_array().unwrap().len(), 5);
        assert_eq!(
            doc["packages"][3]["SPDXID"],
            "SPDXRef-Package-glibc-2.36-9-deb12u10"
        );
        let rel = doc["relationships"].as_array().unwrap();
        assert_eq!(rel[0]["relationshipType"], "DESCRIBES");
        assert_eq!(rel.len(), 5);
        assert!(rel[1..].iter().all(|r| r["relationshipType"] == "CONTAINS"
            && r["spdxElementId"] == "SPDXRef-Package-kube-nlproxy-0.1.0"));
    }

    #[test]
    fn notices_list_every_component_and_its_texts() {
        let c = linked_crates(&metadata(), "kube-nlproxy", &linked(), &BTreeMap::new()).unwrap();
        let texts = vec![
            vec![],
            vec![("LICENSE-MIT".to_string(), "MIT text\n".to_string())],
            vec![],
        ];
        let n = notices(&c, &texts);
        assert!(n.starts_with("kube-nlproxy 0.1.0 (Apache-2.0) contains"));
        assert!(n.contains("- a 1.0.0: MIT OR Apache-2.0\n- b 2.0.0: MIT\n"));
        assert!(n.contains("a 1.0.0\n--- LICENSE-MIT\nMIT text\n"));
        assert!(n.contains("b 2.0.0\n(no licence file in its source; declared licence: MIT"));
        assert!(!n.contains("Relinking"), "no glibc, no relinking section");
        // With glibc linked statically, how to relink it (LGPL-2.1 section 6).
        let mut with_libc = c.clone();
        with_libc.extend(
            c_runtime(
                "Package: libc6-dev\nStatus: install ok installed\nVersion: 2.36-9\n\nPackage: libgcc-12-dev\nStatus: install ok installed\nVersion: 12.2.0-14\n",
                "amd64",
                true,
            )
            .unwrap(),
        );
        let n = notices(&with_libc, &[texts.clone(), vec![vec![], vec![]]].concat());
        assert!(
            n.contains("Relinking with another GNU C Library (LGPL-2.1 section 6). glibc 2.36-9"),
            "{n}"
        );
        assert!(
            n.contains("pkg:deb/debian/libc6-dev@2.36-9?arch=amd64"),
            "{n}"
        );
        assert!(is_licence_file("LICENSE-APACHE") && is_licence_file("COPYING"));
        assert!(!is_licence_file("README.md"));
    }
}
