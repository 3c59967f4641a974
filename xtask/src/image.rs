//! kube-nlproxy's release image: what it holds and how its binary is built.
//!
//! One static binary (glibc linked statically, `crt-static`: no loader, no shared library,
//! nothing else executable; name lookups through `/etc/hosts` and DNS still work, glibc ≥ 2.34
//! has both inside libc) at `/kube-nlproxy`, and `/usr/local/bin/kube-proxy` pointing at it,
//! the path kubeadm's DaemonSet runs. It runs as root (`0:0`), as `deploy/daemonset.yaml`
//! says: nftables, ctnetlink and IPVS need CAP_NET_ADMIN in the node's network namespace.
//!
//! I/O: runs cargo and reads the binary.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::oci::{Content, Entry, Image};

/// The registry-less name `deploy/` uses; `kustomize edit set image` or the README's push
/// commands point it elsewhere.
pub const IMAGE_NAME: &str = "localhost/kube-nlproxy";
/// A platform the release is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::Amd64, Arch::Arm64];

    /// The Rust target (explicit, so that `crt-static` applies to the binary and not to
    /// build scripts or proc macros).
    pub fn target(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// The name OCI, Go (GOARCH), Debian and `kubernetes.io/arch` give it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The OCI platform's `variant` (arm64 images say v8, as `docker buildx` writes them).
    pub fn variant(self) -> Option<&'static str> {
        match self {
            Arch::Amd64 => None,
            Arch::Arm64 => Some("v8"),
        }
    }

    /// ELF's `e_machine` for binaries of this platform.
    pub fn elf_machine(self) -> u16 {
        match self {
            Arch::Amd64 => 62,  // EM_X86_64
            Arch::Arm64 => 183, // EM_AARCH64
        }
    }

    /// `amd64` or `arm64`; anything else is an error naming the value.
    pub fn parse(s: &str) -> Result<Arch, String> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| format!("unknown architecture {s:?}: amd64 or arm64"))
    }

    /// The platform of the machine running this.
    pub fn host() -> Arch {
        if cfg!(target_arch = "aarch64") {
            Arch::Arm64
        } else {
            Arch::Amd64
        }
    }

    /// The C cross toolchain cargo needs for a build on another platform: the linker and
    /// the C compiler of crates with C parts (Debian's `gcc-aarch64-linux-gnu`).
    fn cross_env(self) -> Vec<(String, String)> {
        if self == Arch::host() {
            return Vec::new();
        }
        let gnu = match self {
            Arch::Amd64 => "x86_64-linux-gnu",
            Arch::Arm64 => "aarch64-linux-gnu",
        };
        let upper = self.target().to_uppercase().replace('-', "_");
        let lower = self.target().replace('-', "_");
        vec![
            (format!("CARGO_TARGET_{upper}_LINKER"), format!("{gnu}-gcc")),
            (format!("CC_{lower}"), format!("{gnu}-gcc")),
            (format!("AR_{lower}"), format!("{gnu}-ar")),
        ]
    }
}

/// The amd64 target (the image `cargo xtask image` builds).
pub const TARGET: &str = "x86_64-unknown-linux-gnu";
/// The cargo profile of the image (Cargo.toml `[profile.image]`).
pub const PROFILE: &str = "image";

/// The workspace root (the parent of `xtask/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits inside the workspace")
        .to_path_buf()
}

/// `version = "…"` of kube-nlproxy's `[package]` in the workspace's Cargo.toml.
pub fn package_version(cargo_toml: &str) -> Option<String> {
    package_field(cargo_toml, "version")
}

/// A string field of the `[package]` section (`key = "…"`).
pub fn package_field(cargo_toml: &str, key: &str) -> Option<String> {
    let mut in_package = false;
    for line in cargo_toml.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
            continue;
        }
        if !in_package {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        if k.trim() == key {
            return Some(v.trim().trim_matches('"').to_string());
        }
    }
    None
}

/// `localhost/kube-nlproxy:vX.Y.Z` for the workspace's version.
pub fn default_reference() -> io::Result<String> {
    let toml = std::fs::read_to_string(workspace_root().join("Cargo.toml"))?;
    let v = package_version(&toml)
        .ok_or_else(|| io::Error::other("Cargo.toml: no version in [package]"))?;
    Ok(format!("{IMAGE_NAME}:v{v}"))
}

/// Builds the binary for `arch` with the image profile, statically linked, with the
/// checkout's and cargo's paths remapped so that another clone builds the same bytes.
/// Returns its path.
pub fn build_binary(arch: Arch) -> io::Result<PathBuf> {
    let root = workspace_root();
    let cargo_home = std::env::var("CARGO_HOME")
        .unwrap_or_else(|_| format!("{}/.cargo", std::env::var("HOME").unwrap_or_default()));
    let flags = format!(
        "-C target-feature=+crt-static --remap-path-prefix={}=/src --remap-path-prefix={cargo_home}=/cargo",
        root.display()
    );
    let target = arch.target();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let rustflags = format!(
        "CARGO_TARGET_{}_RUSTFLAGS",
        target.to_uppercase().replace('-', "_")
    );
    #[allow(clippy::disallowed_methods)] // a build task runs cargo
    let status = Command::new(cargo)
        .current_dir(&root)
        .args([
            "build",
            "--locked",
            "--profile",
            PROFILE,
            "--target",
            target,
        ])
        .args(["-p", "kube-nlproxy", "--bin", "kube-nlproxy"])
        .env(rustflags, flags)
        .envs(arch.cross_env())
        .status()?;
    if !status.success() {
        let hint = if arch == Arch::host() {
            String::new()
        } else {
            format!(
                " (a {} build needs `rustup target add {target}` and Debian's gcc-aarch64-linux-gnu and libc6-dev-arm64-cross)",
                arch.name()
            )
        };
        return Err(io::Error::other(format!(
            "cargo build of the {} image binary: {status}{hint}",
            arch.name()
        )));
    }
    Ok(target_dir(&root)
        .join(target)
        .join(PROFILE)
        .join("kube-nlproxy"))
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// The ELF file's `e_machine` (62 x86-64, 183 AArch64).
pub fn elf_machine(elf: &[u8]) -> Result<u16, String> {
    if elf.get(..4) != Some(b"\x7fELF") {
        return Err("not an ELF file".into());
    }
    elf.get(0x12..0x14)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .ok_or_else(|| "truncated ELF header".into())
}

/// Whether an ELF file asks for a program interpreter (a dynamic loader), which the image
/// does not have: such a binary would fail to start with "no such file or directory".
pub fn elf_needs_interpreter(elf: &[u8]) -> Result<bool, String> {
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    if elf.get(..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let short = || "truncated ELF header".to_string();
    let phoff = u64_at(0x20).ok_or_else(short)? as usize;
    let phentsize = u16_at(0x36).ok_or_else(short)? as usize;
    let phnum = u16_at(0x38).ok_or_else(short)? as usize;
    const PT_INTERP: u32 = 3;
    for i in 0..phnum {
        let p_type = u32_at(phoff + i * phentsize).ok_or_else(short)?;
        if p_type == PT_INTERP {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Where and from what the image was built: its OCI labels beyond title and licence.
#[derive(Debug, Clone, Default)]
pub struct Provenance {
    /// `org.opencontainers.image.source`: the repository's URL (Cargo.toml's `repository`,
    /// or `--source`); the label is left out when unknown.
    pub source: Option<String>,
    /// `org.opencontainers.image.revision`: the git commit (empty: left out).
    pub revision: String,
}

impl Provenance {
    /// The checkout's: its commit as build.rs reads it, Cargo.toml's repository.
    pub fn of_checkout() -> io::Result<Provenance> {
        let root = workspace_root();
        let toml = std::fs::read_to_string(root.join("Cargo.toml"))?;
        Ok(Provenance {
            source: package_field(&toml, "repository"),
            revision: crate::git_commit::git_commit(&root, &mut |_| {}),
        })
    }
}

/// Where the image keeps its licence, third-party notices and SBOM.
pub const DOC_DIR: &str = "/usr/share/doc/kube-nlproxy";

/// The files of [`DOC_DIR`]: the project's LICENSE, the third-party notices and the SPDX
/// SBOM of what `bom` says the binary holds.
pub fn doc_files(
    bom: &crate::sbom::Bom,
    licence: &[u8],
    epoch: u64,
    provenance: &Provenance,
) -> Vec<(String, Vec<u8>)> {
    let mut components = bom.components.clone();
    if let (Some(main), Some(source)) = (components.first_mut(), &provenance.source) {
        main.download = source.clone();
    }
    let version = components
        .first()
        .map(|c| c.version.clone())
        .unwrap_or_default();
    let revision = if provenance.revision.is_empty() {
        "unknown-revision"
    } else {
        &provenance.revision
    };
    let namespace = format!("https://spdx.org/spdxdocs/kube-nlproxy-{version}-{revision}");
    let doc = crate::sbom::spdx(&components, &crate::oci::rfc3339(epoch), &namespace);
    let mut sbom = serde_json::to_vec_pretty(&doc).expect("JSON values serialise");
    sbom.push(b'\n');
    vec![
        ("LICENSE".into(), licence.to_vec()),
        (
            "THIRD_PARTY_NOTICES".into(),
            crate::sbom::notices(&components, &bom.texts).into_bytes(),
        ),
        ("sbom.spdx.json".into(), sbom),
    ]
}

/// The release image around `binary`, with `docs` (name, content) in [`DOC_DIR`].
pub fn release_image(
    binary: &Path,
    arch: Arch,
    reference: &str,
    epoch: u64,
    provenance: &Provenance,
    docs: Vec<(String, Vec<u8>)>,
) -> io::Result<Image> {
    let elf = std::fs::read(binary)
        .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", binary.display())))?;
    match elf_needs_interpreter(&elf) {
        Ok(false) => {}
        Ok(true) => {
            return Err(io::Error::other(format!(
                "{} is dynamically linked; the image has no loader (build it with `cargo xtask image`, which links statically)",
                binary.display()
            )))
        }
        Err(e) => return Err(io::Error::other(format!("{}: {e}", binary.display()))),
    }
    let machine = elf_machine(&elf).map_err(io::Error::other)?;
    if machine != arch.elf_machine() {
        return Err(io::Error::other(format!(
            "{} is not an {} binary (ELF machine {machine}, want {})",
            binary.display(),
            arch.name(),
            arch.elf_machine()
        )));
    }
    let version = reference.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
    let mut labels: BTreeMap<String, String> = [
        ("title", "kube-nlproxy"),
        (
            "description",
            "A Kubernetes service proxy that programs the kernel only through netlink",
        ),
        ("licenses", "Apache-2.0"),
        ("version", version),
    ]
    .into_iter()
    .map(|(k, v)| (format!("org.opencontainers.image.{k}"), v.to_string()))
    .collect();
    labels.insert(
        "org.opencontainers.image.created".into(),
        crate::oci::rfc3339(epoch),
    );
    if !provenance.revision.is_empty() {
        labels.insert(
            "org.opencontainers.image.revision".into(),
            provenance.revision.clone(),
        );
    }
    if let Some(source) = &provenance.source {
        labels.insert("org.opencontainers.image.source".into(), source.clone());
    }
    Ok(Image {
        reference: reference.to_string(),
        entries: vec![
            Entry::File {
                path: "/kube-nlproxy".into(),
                mode: 0o755,
                content: Content::Bytes(elf),
            },
            Entry::Symlink {
                path: "/usr/local/bin/kube-proxy".into(),
                target: "/kube-nlproxy".into(),
            },
        ]
        .into_iter()
        .chain(docs.into_iter().map(|(name, content)| Entry::File {
            path: format!("{DOC_DIR}/{name}"),
            mode: 0o644,
            content: Content::Bytes(content),
        }))
        .collect(),
        entrypoint: vec!["/kube-nlproxy".into()],
        cmd: vec![],
        user: "0:0".into(),
        env: vec![],
        labels,
        epoch,
        gzip: true,
        architecture: arch.name().into(),
        variant: arch.variant().map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_is_read_from_the_package_section() {
        let toml = "[workspace]\nversion = \"9\"\n[package]\nname = \"x\"\nversion = \"0.1.0\"\n[dependencies]\nversion = \"2\"\n";
        assert_eq!(package_version(toml).as_deref(), Some("0.1.0"));
        assert_eq!(package_version("[package]\nname = \"x\"\n"), None);
    }

    #[test]
    fn the_interpreter_check_reads_program_headers() {
        // This test binary itself: built for the host, dynamically linked.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(elf_needs_interpreter(&me), Ok(true));
        assert!(elf_needs_interpreter(b"#!/bin/sh\n").is_err());
        assert!(elf_needs_interpreter(&me[..40]).is_err());
    }

    #[test]
    fn a_binary_of_another_architecture_is_refused() {
        // A static AArch64 ELF header (no program headers, so no interpreter).
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x12..0x14].copy_from_slice(&Arch::Arm64.elf_machine().to_le_bytes());
        let path = std::env::temp_dir().join(format!("xtask-arm64-elf-{}", std::process::id()));
        std::fs::write(&path, &elf).unwrap();
        let image = |arch| {
            release_image(
                &path,
                arch,
                "localhost/kube-nlproxy:v0.1.0",
                0,
                &Provenance::default(),
                vec![],
            )
        };
        let err = image(Arch::Amd64).unwrap_err().to_string();
        assert!(
            err.contains("is not an amd64 binary (ELF machine 183, want 62)"),
            "{err}"
        );
        let ok = image(Arch::Arm64).unwrap();
        assert_eq!(
            (ok.architecture.as_str(), ok.variant.as_deref()),
            ("arm64", Some("v8"))
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_dynamically_linked_binary_is_refused() {
        let me = std::env::current_exe().unwrap();
        let err = release_image(
            &me,
            Arch::host(),
            "localhost/kube-nlproxy:v0.1.0",
            0,
            &Provenance::default(),
            vec![],
        )
        .unwrap_err();
        assert!(err.to_string().contains("dynamically linked"), "{err}");
    }
}
