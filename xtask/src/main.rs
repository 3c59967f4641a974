//! `cargo xtask image`: builds kube-nlproxy's release image as an OCI image-layout tarball,
//! without Docker or a registry.

use std::path::PathBuf;
use std::process::ExitCode;

use xtask::{image, oci};

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
          skopeo copy oci-archive:FILE docker://REGISTRY/kube-nlproxy:vVERSION";

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
    let epoch = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => v
            .parse()
            .map_err(|_| format!("SOURCE_DATE_EPOCH={v:?}: not a number of seconds"))?,
        Err(_) => 0,
    };
    let binary = match binary {
        Some(b) => b,
        None => image::build_binary().map_err(|e| e.to_string())?,
    };
    let provenance = image::Provenance::of_checkout().map_err(|e| e.to_string())?;
    let root = image::workspace_root();
    let bom = xtask::sbom::collect(&root, image::TARGET).map_err(|e| e.to_string())?;
    let licence = std::fs::read(root.join("LICENSE")).map_err(|e| format!("LICENSE: {e}"))?;
    let docs = image::doc_files(&bom, &licence, epoch, &provenance);
    let img = image::release_image(&binary, &reference, epoch, &provenance, docs)
        .map_err(|e| e.to_string())?;
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
