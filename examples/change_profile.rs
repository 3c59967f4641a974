//! A one-endpoint change repeated at scale, in a fresh network namespace of its own (root),
//! for `perf record -p` once "full done" is printed: where a partial sync's time goes
//! (issue #18: at 45k × 1 the kernel's commit walks every chain, about 5 ms).
//! `cargo run --release --example change_profile --features testing [SERVICES ENDPOINTS ROUNDS]`
#![allow(unsafe_code, clippy::disallowed_methods)] // a probe: unshare(2)
use kube_nlproxy::kernel::nft::netlink::NetlinkNftables;
use kube_nlproxy::model::fixtures::synthetic_state;
use kube_nlproxy::modes::nftables::NftablesProxier;
use kube_nlproxy::proxy::{DetectLocal, ProxierConfig};
use std::sync::Arc;
use std::time::Instant;
fn main() {
    let arg = |i: usize, d: usize| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(d)
    };
    let (n, eps, rounds) = (arg(1, 45_000), arg(2, 1), arg(3, 200));
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
    let base = synthetic_state(n, eps);
    let with_ep = |ip: &str| {
        let mut st = base.clone();
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
