//! A one-endpoint change repeated at scale, in a fresh network namespace of its own (root),
//! for `perf record -p` once "full done" is printed: where a partial sync's time goes
//! (issue #18: at 45k × 1 the kernel's commit walks every chain, about 3 ms of 8).
//! `cargo run --release --example change_profile --features testing [SERVICES ENDPOINTS ROUNDS [unshared]]`
#![allow(unsafe_code, clippy::disallowed_methods)] // a probe: unshare(2)
use kube_nlproxy::kernel::nft::netlink::NetlinkNftables;
use kube_nlproxy::model::fixtures::synthetic_state;
use kube_nlproxy::modes::nftables::NftablesProxier;
use kube_nlproxy::proxy::{DetectLocal, ProxierConfig};
use kube_nlproxy::source::kube::Stores;
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
    // builds them (no allocation in common, so every comparison looks inside). Otherwise
    // the states come from the API source's stores: sharing what did not change, naming
    // what did.
    let unshared = args.get(3).map(String::as_str) == Some("unshared");
    let changed = base.endpoints.keys().nth(n / 2).unwrap().clone();
    let mut stores = Stores::listed_from(&base);
    let first = if unshared {
        Arc::new(base.clone())
    } else {
        Arc::new(stores.publish("node1", &mut Vec::new()))
    };
    let mut next = |round: usize| {
        let ip = format!("10.250.0.{}", 1 + round % 2).parse().unwrap();
        if unshared {
            let mut st = synthetic_state(n, eps);
            std::sync::Arc::make_mut(st.endpoints.get_mut(&changed).unwrap())[0].ip = ip;
            return Arc::new(st);
        }
        let mut eps = base.endpoints_of(&changed).to_vec();
        eps[0].ip = ip;
        stores.set_endpoints(&changed, eps);
        Arc::new(stores.publish("node1", &mut Vec::new()))
    };
    let mut p = NftablesProxier::new(
        NetlinkNftables::open().unwrap(),
        ProxierConfig::default(),
        DetectLocal::ClusterCidr(vec![]),
    );
    p.sync_shared(&first).unwrap();
    eprintln!("full done; pid {}", std::process::id());
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut took = std::time::Duration::ZERO;
    let mut kernel = std::time::Duration::ZERO;
    let stime = || {
        // SAFETY: getrusage(2) fills the zeroed struct we pass.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
        std::time::Duration::new(ru.ru_stime.tv_sec as u64, ru.ru_stime.tv_usec as u32 * 1000)
    };
    // With PROFILE_HOLD set, each state stays alive until after the next sync's timing: a
    // sync also frees the state it replaces, after its commit.
    let hold = std::env::var_os("PROFILE_HOLD").is_some();
    let mut held = None;
    for r in 0..rounds {
        let st = next(r); // not timed: the source's work

        let (t0, k0) = (Instant::now(), stime());
        p.sync_shared(&st).unwrap();
        took += t0.elapsed();
        kernel += stime() - k0;
        if hold {
            held = Some(st);
        }
    }
    drop(held);
    eprintln!(
        "per change: {:?} (in the kernel: {:?})",
        took / rounds as u32,
        kernel / rounds as u32
    );
}
