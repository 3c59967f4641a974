//! The container images the real nodes run, written as OCI image-layout tarballs (no
//! registry: each node's containerd imports them under the names pods ask for, and
//! `IfNotPresent` never pulls). Built from the Go binaries `netlink-tests/upstream/build.sh`
//! caches and from the build machine's Debian files, under the exact names upstream's e2e
//! suite uses (`test/utils/image/manifest.go` at v1.37.2).
//!
//! Substitutes, and why each is faithful where the suite looks:
//! - agnhost: the agnhost binary upstream's image runs, with what its Alpine image adds that
//!   the specs exec: a POSIX shell (dash: busybox's shell would run busybox's `nc`, which has
//!   no `-v -t`), busybox's applets for the rest of the userland, Debian's `curl`, `wget`
//!   (busybox-static's `wget` applet segfaults in a container here), `nc` (netcat-openbsd),
//!   `socat`, `ip` and `bash`.
//! - busybox: busybox's applets, `wget` again Debian's.
//! - nginx: the Endpoints and EndpointSlice specs only need a running container with ports;
//!   agnhost's `netexec` serves HTTP on 80 as nginx would.
//! - distroless-iptables and upstream's kube-proxy image: Debian's iptables (nft and legacy),
//!   nft, conntrack and ipset with their libraries, and a shell; kube-proxy added for the
//!   latter (upstream's is built on distroless-iptables).
//! - pause: a static C program that sleeps until signalled, as upstream's pause.
//!
//! I/O: reads binaries and libraries, runs `ldd` and `gcc`, writes tarballs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use xtask::oci::{Content, Entry, Image};

use crate::bounded::{OutputWithin, TEST_LIMIT};

pub const PAUSE: &str = "registry.k8s.io/pause:3.10.2";
pub const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.66.1";
pub const BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2";
pub const NGINX: &str = "registry.k8s.io/e2e-test-images/nginx:1.27.0-2";
pub const REGRESSION_74839: &str = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.5";
pub const DISTROLESS_IPTABLES: &str = "registry.k8s.io/build-image/distroless-iptables:v0.9.9";
pub const KUBE_PROXY: &str = "registry.k8s.io/kube-proxy:v1.37.2";
pub const COREDNS: &str = "registry.k8s.io/coredns/coredns:v1.15.0";

/// Bumped when an image's contents change, so a cached tarball is not reused (r2: agnhost
/// holds the fake registry's pause image).
const IMAGES_RECIPE: &str = "r2";

const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A root filesystem being assembled: files by image path, libraries pulled in by `ldd`.
#[derive(Default)]
pub struct RootFs {
    entries: BTreeMap<String, Entry>,
}

impl RootFs {
    pub fn file(&mut self, path: &str, mode: u32, content: Content) -> &mut Self {
        self.entries.insert(
            path.into(),
            Entry::File {
                path: path.into(),
                mode,
                content,
            },
        );
        self
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.entries.insert(
            path.into(),
            Entry::Symlink {
                path: path.into(),
                target: target.into(),
            },
        );
        self
    }

    pub fn dir(&mut self, path: &str, mode: u32) -> &mut Self {
        self.entries.insert(
            path.into(),
            Entry::Dir {
                path: path.into(),
                mode,
            },
        );
        self
    }

    /// A host binary at `image_path`, with every shared library `ldd` names at the path it
    /// has on the host (the loader included).
    pub fn host_binary(&mut self, host: &str, image_path: &str) -> &mut Self {
        let real = std::fs::canonicalize(host)
            .unwrap_or_else(|e| panic!("{host}: {e} (does .ci/run install its package?)"));
        self.file(image_path, 0o755, Content::From(real.clone()));
        self.libraries_of(&real);
        self
    }

    /// Every shared library of `binary`, at its host path.
    pub fn libraries_of(&mut self, binary: &Path) -> &mut Self {
        for lib in ldd(binary) {
            let content = Content::From(
                std::fs::canonicalize(&lib).unwrap_or_else(|e| panic!("{}: {e}", lib.display())),
            );
            let p = lib.to_string_lossy().into_owned();
            self.entries.entry(p.clone()).or_insert(Entry::File {
                path: p,
                mode: 0o755,
                content,
            });
        }
        self
    }

    /// busybox and a link for each of its applets in /bin, except `skip`.
    pub fn busybox(&mut self, skip: &[&str]) -> &mut Self {
        let out = Command::new("/bin/busybox")
            .arg("--list")
            .output_within(TEST_LIMIT)
            .expect("busybox --list (package busybox-static)");
        assert!(out.status.success(), "busybox --list failed");
        self.file(
            "/bin/busybox",
            0o755,
            Content::From(PathBuf::from("/bin/busybox")),
        );
        for applet in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if applet != "busybox" && !skip.contains(&applet) {
                self.symlink(&format!("/bin/{applet}"), "/bin/busybox");
            }
        }
        self
    }

    /// A root shell environment: `/etc/passwd` and `/etc/group` with root and the users
    /// upstream's images define.
    pub fn etc(&mut self) -> &mut Self {
        self.file(
            "/etc/passwd",
            0o644,
            Content::Bytes(
                b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\nuser-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"
                    .to_vec(),
            ),
        )
        .file(
            "/etc/group",
            0o644,
            Content::Bytes(
                b"root:x:0:\nnogroup:x:65534:\nuser-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"
                    .to_vec(),
            ),
        )
        .dir("/tmp", 0o1777)
        .dir("/root", 0o700)
    }

    pub fn into_image(self, reference: &str, entrypoint: &[&str], cmd: &[&str]) -> Image {
        Image {
            reference: reference.into(),
            entries: self.entries.into_values().collect(),
            entrypoint: entrypoint.iter().map(|s| s.to_string()).collect(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            user: "0:0".into(),
            env: vec![PATH_ENV.into()],
            labels: BTreeMap::new(),
            epoch: 0,
            gzip: false,
            architecture: xtask::image::Arch::host().name().into(),
            variant: None,
        }
    }
}

/// The shared libraries `ldd` resolves for `binary` (none for a static one).
fn ldd(binary: &Path) -> BTreeSet<PathBuf> {
    let out = Command::new("ldd")
        .arg(binary)
        .output_within(TEST_LIMIT)
        .expect("ldd");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut libs = BTreeSet::new();
    for line in text.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.insert(PathBuf::from(p));
        }
    }
    libs
}

/// The Debian userland of upstream's distroless-iptables image: iptables in both backends,
/// nft, conntrack, ipset, with the xtables extensions they load.
fn iptables_userland(fs: &mut RootFs) {
    fs.busybox(&["sh"]);
    fs.host_binary("/usr/bin/dash", "/bin/dash")
        .symlink("/bin/sh", "/bin/dash");
    fs.host_binary("/usr/sbin/xtables-nft-multi", "/usr/sbin/xtables-nft-multi")
        .host_binary(
            "/usr/sbin/xtables-legacy-multi",
            "/usr/sbin/xtables-legacy-multi",
        )
        .host_binary("/usr/sbin/nft", "/usr/sbin/nft")
        .host_binary("/usr/sbin/conntrack", "/usr/sbin/conntrack")
        .host_binary("/usr/sbin/ipset", "/usr/sbin/ipset");
    for fam in ["iptables", "ip6tables"] {
        for suffix in ["", "-save", "-restore"] {
            fs.symlink(
                &format!("/usr/sbin/{fam}{suffix}"),
                "/usr/sbin/xtables-nft-multi",
            )
            .symlink(
                &format!("/usr/sbin/{fam}-nft{suffix}"),
                "/usr/sbin/xtables-nft-multi",
            )
            .symlink(
                &format!("/usr/sbin/{fam}-legacy{suffix}"),
                "/usr/sbin/xtables-legacy-multi",
            );
        }
    }
    let ext = Path::new("/usr/lib/x86_64-linux-gnu/xtables");
    let mut mods: Vec<PathBuf> = std::fs::read_dir(ext)
        .unwrap_or_else(|e| panic!("{}: {e} (package iptables)", ext.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "so"))
        .collect();
    mods.sort();
    for m in mods {
        let p = m.to_string_lossy().into_owned();
        fs.file(&p, 0o644, Content::From(m.clone()));
        fs.libraries_of(&m);
    }
    fs.etc();
}

/// A static pause: sleeps until SIGINT or SIGTERM, reaps children (it is PID 1 of a pod).
const PAUSE_C: &str = r#"#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  signal(SIGINT, quit); signal(SIGTERM, quit); signal(SIGCHLD, reap);
  for (;;) pause();
}
"#;

fn build_pause(dir: &Path) -> PathBuf {
    let src = dir.join("pause.c");
    let bin = dir.join("pause");
    std::fs::write(&src, PAUSE_C).unwrap();
    let out = Command::new("gcc")
        .args(["-static", "-Os", "-o"])
        .arg(&bin)
        .arg(&src)
        .output_within(TEST_LIMIT)
        .expect("gcc");
    assert!(
        out.status.success(),
        "gcc pause.c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

/// The files upstream's agnhost image holds under `/var/registry` for `fake-registry-server`
/// (its Dockerfile runs `fakeregistryserver/prepare_registry.sh` over `images.txt`:
/// `pause 3.10.2 testing`): the pause image's manifest and blobs at the nested digest paths
/// the server reads (`sha256/ab/abcd.../data`) and the tag file `testing` holding the
/// manifest's digest. The spec "LocalhostNodePorts should let a node pull an image from a
/// registry exposed via localhost NodePort" pulls `localhost:PORT/pause:testing` from it.
fn fake_registry(fs: &mut RootFs, pause: &Image) {
    let image = xtask::oci::registry_image(pause).expect("the pause image's registry blobs");
    let nested = |base: &str, hex: &str| format!("{base}/sha256/{}/{hex}/data", &hex[..2]);
    let root = "/var/registry/pause";
    let manifest_hex = image.manifest_digest.trim_start_matches("sha256:");
    fs.file(
        &format!("{root}/manifests/testing"),
        0o644,
        Content::Bytes(image.manifest_digest.clone().into_bytes()),
    )
    .file(
        &nested(&format!("{root}/manifests"), manifest_hex),
        0o644,
        Content::Bytes(image.manifest),
    );
    for (hex, data) in image.blobs {
        fs.file(
            &nested(&format!("{root}/blobs"), &hex),
            0o644,
            Content::Bytes(data),
        );
    }
}

/// Writes every test image into `dir` (skipping those already there) and returns the
/// tarballs.
pub fn build_all(bins: &super::Binaries, dir: &Path) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    let b = |n: &str| bins.node.join(n);
    let mut out = Vec::new();
    let mut write = |name: &str, make: &dyn Fn() -> Image| {
        let path = dir.join(format!("{name}-{IMAGES_RECIPE}.oci.tar"));
        if !path.exists() {
            xtask::oci::write_archive(&make(), &path)
                .unwrap_or_else(|e| panic!("writing image {name}: {e}"));
        }
        out.push(path);
    };
    let pause = || {
        let mut fs = RootFs::default();
        fs.file("/pause", 0o755, Content::From(build_pause(dir)));
        fs.into_image(PAUSE, &["/pause"], &[])
    };
    write("pause", &pause);
    let agnhost_fs = || {
        let mut fs = RootFs::default();
        fake_registry(&mut fs, &pause());
        fs.busybox(&["sh", "nc", "wget", "ip", "bash"]);
        fs.host_binary("/usr/bin/dash", "/bin/dash")
            .symlink("/bin/sh", "/bin/dash")
            .host_binary("/usr/bin/bash", "/bin/bash")
            .host_binary("/usr/bin/curl", "/usr/bin/curl")
            .host_binary("/usr/bin/wget", "/usr/bin/wget")
            .host_binary("/usr/bin/nc.openbsd", "/usr/bin/nc")
            .host_binary("/usr/bin/socat", "/usr/bin/socat")
            .host_binary("/usr/sbin/ip", "/sbin/ip")
            .file("/agnhost", 0o755, Content::From(b("agnhost")))
            .symlink("/agnhost-2", "agnhost")
            .dir("/uploads", 0o755);
        let porter = bins.k8s_module.join("test/images/agnhost/porter");
        fs.file(
            "/localhost.crt",
            0o644,
            Content::From(porter.join("localhost.crt")),
        )
        .file(
            "/localhost.key",
            0o644,
            Content::From(porter.join("localhost.key")),
        );
        fs.etc();
        fs
    };
    write("agnhost", &|| {
        agnhost_fs().into_image(AGNHOST, &["/agnhost"], &["pause"])
    });
    write("nginx", &|| {
        agnhost_fs().into_image(NGINX, &["/agnhost", "netexec", "--http-port=80"], &[])
    });
    write("busybox", &|| {
        let mut fs = RootFs::default();
        fs.busybox(&["wget"]);
        fs.host_binary("/usr/bin/wget", "/bin/wget");
        fs.etc();
        fs.into_image(BUSYBOX, &[], &["sh"])
    });
    write("regression-issue-74839", &|| {
        let mut fs = RootFs::default();
        fs.file(
            "/regression-issue-74839",
            0o755,
            Content::From(b("regression-issue-74839")),
        );
        fs.into_image(REGRESSION_74839, &["/regression-issue-74839"], &[])
    });
    write("distroless-iptables", &|| {
        let mut fs = RootFs::default();
        iptables_userland(&mut fs);
        fs.into_image(DISTROLESS_IPTABLES, &[], &["sh"])
    });
    write("kube-proxy", &|| {
        let mut fs = RootFs::default();
        iptables_userland(&mut fs);
        fs.file(
            "/usr/local/bin/kube-proxy",
            0o755,
            Content::From(b("kube-proxy")),
        );
        fs.libraries_of(&b("kube-proxy"));
        fs.into_image(KUBE_PROXY, &["/usr/local/bin/kube-proxy"], &[])
    });
    write("coredns", &|| {
        let mut fs = RootFs::default();
        fs.file("/coredns", 0o755, Content::From(b("coredns")));
        fs.etc();
        fs.into_image(COREDNS, &["/coredns"], &[])
    });
    out
}
