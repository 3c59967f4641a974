//! What every measurement family shares: the synthetic cluster, our nftables proxier on a
//! netlink socket, and timing an external tool inside a namespace (I/O).

use std::process::Command;
use std::time::{Duration, Instant};

use kube_nlproxy::config::DetectLocal;
use kube_nlproxy::kernel::nft::netlink::NetlinkNftables;
use kube_nlproxy::model::fixtures::synthetic_state;
use kube_nlproxy::model::ProxyState;
use kube_nlproxy::modes::nftables::NftablesProxier;
use kube_nlproxy::proxy::{LocalDetector, ProxierConfig};
use netlink_tests::bounded::{OutputWithin, TEST_LIMIT};
use netlink_tests::ns::NetNs;

use crate::args::EPS;

/// The proxier configuration of every in-process row: pod traffic is 10.244.0.0/16.
pub fn cfg() -> ProxierConfig {
    ProxierConfig {
        local_detector: LocalDetector::Cidrs(vec!["10.244.0.0/16".parse().unwrap()]),
        ..Default::default()
    }
}

/// The synthetic cluster of `services` Services × [`EPS`] endpoints.
pub fn state(services: usize) -> ProxyState {
    synthetic_state(services, EPS)
}

/// Our nftables proxier on a netlink socket of the calling thread's namespace.
pub fn netlink_proxier() -> NftablesProxier<NetlinkNftables> {
    NftablesProxier::new(
        NetlinkNftables::open().unwrap(),
        cfg(),
        DetectLocal::ClusterCidr(vec![]),
    )
}

/// Whether an executable named `tool` is in a directory of `PATH`.
pub fn on_path(tool: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            std::fs::metadata(d.join(tool))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// Times `cmd` (with stdin from `input`) inside `ns`.
pub fn timed(ns: &NetNs, cmd: &[&str], input: &str) -> Duration {
    let path = std::env::temp_dir().join(format!("kbench-{}.in", ns.name));
    std::fs::write(&path, input).unwrap();
    let t0 = Instant::now();
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .args(cmd)
        .stdin(std::fs::File::open(&path).unwrap())
        .output_within(TEST_LIMIT)
        .unwrap();
    let d = t0.elapsed();
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    d
}

/// The median of `times` (sorted here).
pub fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// Stops a daemon we started: SIGTERM, then waits for it (at most 30 s).
pub fn stop(child: &mut std::process::Child, what: &str) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = netlink_tests::bounded::wait_within(child, Duration::from_secs(30), what);
}
