//! `cargo xtask image`: builds kube-nlproxy's image as an OCI image-layout tarball, without
//! Docker or a registry. `cargo xtask release`: the release directory, every platform.
//! `cargo xtask fuzz`: every libFuzzer target of `fuzz/` for a bounded time.

use std::path::PathBuf;
use std::process::ExitCode;

use xtask::image::{self, Arch};
use xtask::{fuzz, oci, release};

const USAGE: &str =
    "usage: cargo xtask image [--out FILE] [--rootfs DIR] [--binary FILE] [--reference REF]

Builds the release image of kube-nlproxy (cargo profile `image`, statically linked) and writes
it as an OCI image-layout tarball (also loadable by `docker load`).

  --out FILE        the tarball (default: target/kube-nlproxy-vVERSION.oci.tar)
  --rootfs DIR      also write the image's file tree into the empty directory DIR
                    (what deploy/Dockerfile copies into its final stage)
  --binary FILE     use this statically linked binary instead of building one
  --reference REF   the image's name (default: localhost/kube-nlproxy:vVERSION, as deploy/ names it)

SOURCE_DATE_EPOCH sets every file's time and the image's creation time (default 0): the same
binary and epoch give the same digest.

Load it:  ctr -n k8s.io images import FILE | docker load -i FILE | podman load -i FILE
Push it:  crane push FILE REGISTRY/kube-nlproxy:vVERSION
          skopeo copy oci-archive:FILE docker://REGISTRY/kube-nlproxy:vVERSION

usage: cargo xtask release [--out DIR] [--arch amd64,arm64] [--binary ARCH=FILE]...

Writes the release directory (--out DIR: empty or new; by default
target/kube-nlproxy-vVERSION-release/, replaced):
per platform the static binary, its image archive, SBOM and notices; the OCI image index
over all platforms; deploy/ as a tarball; LICENSE; RELEASE_NOTES.md from CHANGELOG.md's
section; SHA256SUMS. An arm64 build on an amd64 machine needs `rustup target add
aarch64-unknown-linux-gnu` and Debian's gcc-aarch64-linux-gnu and libc6-dev-arm64-cross.

  --arch LIST         the platforms (default amd64,arm64)
  --binary ARCH=FILE  use this statically linked binary for ARCH instead of building one

usage: cargo xtask fuzz [--seconds N] [--jobs J] [--only NAME,...] [--build-only]

Builds fuzz/'s libFuzzer targets with coverage instrumentation (no cargo-fuzz or nightly
needed) and runs each for N seconds (default 60) over
target/fuzz/corpus/NAME and fuzz/regressions/NAME; prints executions and coverage per
target, J targets at a time (default 1). Fails on the first input that panics, hangs (10 s) or passes 2 GiB of memory: it is
left in target/fuzz/artifacts/NAME/ (copy it into fuzz/regressions/NAME/ with the fix).
--build-only builds the targets and runs none (CI builds them beside the tests).";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> Result<(), String> {
    let Some((task, rest)) = args.split_first() else {
        return Err(format!("no task given\n{USAGE}"));
    };
    match task.as_str() {
        "image" => image_task(rest),
        "release" => release_task(rest),
        "fuzz" => fuzz_task(rest),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown task {other:?}\n{USAGE}")),
    }
}

fn image_task(args: &[String]) -> Result<(), String> {
    let mut out = None;
    let mut rootfs = None;
    let mut binary = None;
    let mut reference = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("flag needs an argument: {flag}"))
        };
        match a.as_str() {
            "--out" => out = Some(PathBuf::from(value(a)?)),
            "--rootfs" => rootfs = Some(PathBuf::from(value(a)?)),
            "--binary" => binary = Some(PathBuf::from(value(a)?)),
            "--reference" => reference = Some(value(a)?),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown flag: {other}\n{USAGE}")),
        }
    }
    let reference = match reference {
        Some(r) => r,
        None => image::default_reference().map_err(|e| e.to_string())?,
    };
    let epoch = source_date_epoch()?;
    let provenance = image::Provenance::of_checkout().map_err(|e| e.to_string())?;
    let built = build_platform(Arch::Amd64, binary, &reference, epoch, &provenance)?;
    let img = built.image;
    let tag = reference
        .rsplit_once(':')
        .map(|(_, t)| t)
        .unwrap_or("latest");
    let out = out.unwrap_or_else(|| {
        image::workspace_root()
            .join("target")
            .join(format!("kube-nlproxy-{tag}.oci.tar"))
    });
    let w = oci::write_archive(&img, &out).map_err(|e| e.to_string())?;
    if let Some(dir) = rootfs {
        oci::write_rootfs(&img, &dir).map_err(|e| e.to_string())?;
        println!("root filesystem written to {}", dir.display());
    }
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "image {reference}\n  digest {}\n  size {:.1} MiB compressed layer, {:.1} MiB unpacked, archive {:.1} MiB\n  written to {}",
        w.digest,
        mib(w.layer_size),
        mib(w.unpacked_size),
        mib(w.archive_size),
        out.display()
    );
    Ok(())
}

fn fuzz_task(args: &[String]) -> Result<(), String> {
    let mut seconds = 60u64;
    let mut jobs = 1usize;
    let mut only: Option<Vec<String>> = None;
    let mut build_only = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("flag needs an argument: {flag}"))
        };
        match a.as_str() {
            "--seconds" => {
                let v = value(a)?;
                seconds = v
                    .parse()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| format!("--seconds {v:?}: want a positive number"))?;
            }
            "--jobs" => {
                let v = value(a)?;
                jobs = v
                    .parse()
                    .ok()
                    .filter(|j| (1..=64).contains(j))
                    .ok_or_else(|| format!("--jobs {v:?}: want 1 to 64"))?;
            }
            "--only" => only = Some(value(a)?.split(',').map(str::to_string).collect()),
            "--build-only" => build_only = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown flag: {other}\n{USAGE}")),
        }
    }
    let root = image::workspace_root();
    let mut targets: Vec<String> = std::fs::read_dir(root.join("fuzz/fuzz_targets"))
        .map_err(|e| format!("fuzz/fuzz_targets: {e}"))?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".rs").map(str::to_string)
        })
        .collect();
    targets.sort();
    if let Some(only) = &only {
        if let Some(unknown) = only.iter().find(|o| !targets.contains(o)) {
            return Err(format!(
                "--only: no target {unknown:?} (targets: {})",
                targets.join(", ")
            ));
        }
        targets.retain(|t| only.contains(t));
    }
    let bin_dir = fuzz::build(&root)?;
    if build_only {
        println!("fuzz targets built in {}", bin_dir.display());
        return Ok(());
    }
    let (stats, failures) = fuzz::run_all(&root, &bin_dir, &targets, seconds, jobs);
    print!("{}", fuzz::render(&stats));
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n\n"))
    }
}

/// SOURCE_DATE_EPOCH, or 0.
fn source_date_epoch() -> Result<u64, String> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => v
            .parse()
            .map_err(|_| format!("SOURCE_DATE_EPOCH={v:?}: not a number of seconds")),
        Err(_) => Ok(0),
    }
}

/// One platform's binary (built unless given), SBOM, notices and image.
fn build_platform(
    arch: Arch,
    binary: Option<PathBuf>,
    reference: &str,
    epoch: u64,
    provenance: &image::Provenance,
) -> Result<release::PlatformBuild, String> {
    let binary = match binary {
        Some(b) => b,
        None => image::build_binary(arch).map_err(|e| e.to_string())?,
    };
    let root = image::workspace_root();
    let bom = xtask::sbom::collect(&root, arch.target()).map_err(|e| e.to_string())?;
    let licence = std::fs::read(root.join("LICENSE")).map_err(|e| format!("LICENSE: {e}"))?;
    let docs = image::doc_files(&bom, &licence, epoch, provenance);
    let doc = |name: &str| {
        docs.iter()
            .find(|(n, _)| n == name)
            .map(|(_, d)| d.clone())
            .unwrap_or_default()
    };
    let (sbom, notices) = (doc("sbom.spdx.json"), doc("THIRD_PARTY_NOTICES"));
    let image = image::release_image(&binary, arch, reference, epoch, provenance, docs)
        .map_err(|e| e.to_string())?;
    Ok(release::PlatformBuild {
        arch,
        binary,
        image,
        sbom,
        notices,
    })
}

fn release_task(args: &[String]) -> Result<(), String> {
    let mut out = None;
    let mut arches = Arch::ALL.to_vec();
    let mut binaries: Vec<(Arch, PathBuf)> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("flag needs an argument: {flag}"))
        };
        match a.as_str() {
            "--out" => out = Some(PathBuf::from(value(a)?)),
            "--arch" => {
                arches = value(a)?
                    .split(',')
                    .map(Arch::parse)
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("--arch: {e}"))?;
            }
            "--binary" => {
                let v = value(a)?;
                let (arch, file) = v
                    .split_once('=')
                    .ok_or_else(|| format!("--binary {v:?}: want ARCH=FILE"))?;
                binaries.push((
                    Arch::parse(arch).map_err(|e| format!("--binary: {e}"))?,
                    file.into(),
                ));
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown flag: {other}\n{USAGE}")),
        }
    }
    let root = image::workspace_root();
    let toml = std::fs::read_to_string(root.join("Cargo.toml")).map_err(|e| e.to_string())?;
    let version = image::package_version(&toml).ok_or("Cargo.toml: no version in [package]")?;
    let changelog = std::fs::read_to_string(root.join("CHANGELOG.md"))
        .map_err(|e| format!("CHANGELOG.md: {e}"))?;
    let changes = release::changelog_section(&changelog, &version)?;
    let tracks = release::tracked_upstream(&changelog, &version)?;
    let reference = image::default_reference().map_err(|e| e.to_string())?;
    let epoch = source_date_epoch()?;
    let provenance = image::Provenance::of_checkout().map_err(|e| e.to_string())?;
    let mut platforms = Vec::new();
    for arch in arches {
        let binary = binaries
            .iter()
            .find(|(a, _)| *a == arch)
            .map(|(_, f)| f.clone());
        platforms.push(build_platform(
            arch,
            binary,
            &reference,
            epoch,
            &provenance,
        )?);
    }
    let dir = match out {
        Some(d) => d,
        None => {
            // The default directory is ours: an earlier release of this checkout is replaced.
            let d = root
                .join("target")
                .join(format!("kube-nlproxy-v{version}-release"));
            if d.join("SHA256SUMS").exists() {
                std::fs::remove_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
            }
            d
        }
    };
    let notes = |index_digest: &str, digests: &[(Arch, String)]| {
        release::release_notes(&release::NotesInput {
            version: &version,
            tracks: &tracks,
            revision: &provenance.revision,
            changes: &changes,
            index_digest,
            platform_digests: digests,
        })
    };
    let r = release::write_release(&dir, &root, &version, &notes, &platforms)
        .map_err(|e| e.to_string())?;
    println!("release v{version} written to {}", r.dir.display());
    println!("  image index {}", r.index_digest);
    for (arch, digest) in &r.platform_digests {
        println!("  linux/{} {digest}", arch.name());
    }
    for f in &r.files {
        println!("  {f}");
    }
    Ok(())
}
