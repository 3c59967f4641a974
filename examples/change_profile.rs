//! A one-endpoint change repeated at scale, in a fresh network namespace of its own (root),
//! for `perf record -p` once "full done" is printed: where a partial sync's time goes
//! (issue #18: at 45k × 1 the kernel's commit walks every chain, about 3 ms of 8).
//! `cargo run --release --example change_profile --features testing [SERVICES ENDPOINTS ROUNDS [unshared]]`
#![allow(unsafe_code, clippy::disallowed_methods)] // a probe: unshare(2)
use kube_nlproxy::kernel::nft::netlink::NetlinkNftables;
use kube_nlproxy::model::fixtures::synthetic_state;
use kube_nlproxy::modes::nftables::NftablesProxier;
use kube_nlproxy::proxy::{DetectLocal, ProxierConfig};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: usize| args.get(i).map_or(default, |a| a.parse().expect(a));
    let (n, eps, rounds) = (num(0, 45_000), num(1, 1), num(2, 200));
    // SAFETY: unshare(2) of the network namespace, before any socket is opened.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
    let base = synthetic_state(n, eps);
    // `unshared` as the fourth argument: each state built anew, as the manifest source
    // builds them (no allocation in common, so every comparison looks inside).
    let unshared = args.get(3).map(String::as_str) == Some("unshared");
    let with_ep = |ip: &str| {
        let mut st = if unshared {
            synthetic_state(n, eps)
        } else {
            base.clone()
        };
        let k = st.endpoints.keys().nth(n / 2).unwrap().clone();
        std::sync::Arc::make_mut(st.endpoints.get_mut(&k).unwrap())[0].ip = ip.parse().unwrap();
        Arc::new(st)
    };
    let (x, y) = (with_ep("10.250.0.1"), with_ep("10.250.0.2"));
    let mut p = NftablesProxier::new(
        NetlinkNftables::open().unwrap(),
        ProxierConfig::default(),
        DetectLocal::ClusterCidr(vec![]),
    );
    p.sync_shared(&Arc::new(base.clone())).unwrap();
    eprintln!("full done; pid {}", std::process::id());
    std::thread::sleep(std::time::Duration::from_millis(500));
    let t0 = Instant::now();
    for r in 0..rounds {
        let st = if r % 2 == 0 { &x } else { &y };
        p.sync_shared(st).unwrap();
    }
    eprintln!("per change: {:?}", t0.elapsed() / rounds as u32);
}
