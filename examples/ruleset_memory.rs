//! Where the nftables mode's memory goes at 10k Services × 10 endpoints (issue #18): the
//! model, and what the proxier keeps after a full sync, as bytes in use by the allocator
//! (glibc `mallinfo2`, after `malloc_trim`), with RSS and peak RSS beside them. Runs in a
//! fresh network namespace of its own (root).
//! `cargo run --release --example ruleset_memory --features testing [SERVICES ENDPOINTS]`
#![allow(unsafe_code, clippy::disallowed_methods)] // a probe: unshare(2), mallinfo2(3)

use std::sync::Arc;

use kube_nlproxy::kernel::nft::netlink::NetlinkNftables;
use kube_nlproxy::model::fixtures::synthetic_state;
use kube_nlproxy::modes::nftables::NftablesProxier;
use kube_nlproxy::proxy::{DetectLocal, ProxierConfig};

fn in_use_mib() -> f64 {
    // SAFETY: both only read or trim the allocator's own state.
    unsafe {
        libc::malloc_trim(0);
        // Heap chunks in use plus blocks mmapped on their own (large tables, such as the
        // element index: `uordblks` alone leaves them out).
        let m = libc::mallinfo2();
        (m.uordblks + m.hblkhd) as f64 / 1048576.0
    }
}

fn rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("VmRSS") || l.starts_with("VmHWM"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join(", ")
}

fn main() {
    let arg = |i: usize, d: usize| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(d)
    };
    let (n, eps) = (arg(1, 10_000), arg(2, 10));
    // SAFETY: unshare(2) of the network namespace, before any socket is opened.
    assert_eq!(
        unsafe { libc::unshare(libc::CLONE_NEWNET) },
        0,
        "needs root"
    );
    let start = in_use_mib();
    let state = Arc::new(synthetic_state(n, eps));
    let model = in_use_mib();
    println!("model ({n} × {eps}): {:.1} MiB ({})", model - start, rss());
    let mut p = NftablesProxier::new(
        NetlinkNftables::open().expect("nftables socket"),
        ProxierConfig::default(),
        DetectLocal::ClusterCidr(vec![]),
    );
    p.sync_shared(&state).expect("full sync");
    let kept = in_use_mib();
    println!(
        "proxier after the full sync (committed ruleset, element index, slots): {:.1} MiB ({})",
        kept - model,
        rss()
    );
    // The API source's stores, as a finished first list leaves them: they share the
    // service ports and endpoint lists with the state, so this is what they add.
    let stores = kube_nlproxy::source::kube::Stores::listed_from(&state);
    let with_stores = in_use_mib();
    println!(
        "API source stores beside that state: {:.1} MiB ({})",
        with_stores - kept,
        rss()
    );
    let mut warnings = Vec::new();
    let published = stores.state(&state.node.name, &mut warnings);
    println!(
        "a state assembled from the stores: {:.1} MiB ({})",
        in_use_mib() - with_stores,
        rss()
    );
    drop(published);
    // The API churn row's shape (issue #18: RSS flat): 100 changes a second for 60 s, each
    // moving the first endpoint of a Service not changed before, one sync a second.
    let mut stores = stores;
    let first = Arc::new(stores.publish(&state.node.name, &mut warnings));
    p.sync_shared(&first).expect("sync of the stores' state");
    drop(first);
    let before = in_use_mib();
    let names: Vec<_> = state.endpoints.keys().cloned().collect();
    // RULESET_MEMORY_ROUNDS: fewer rounds, to compare heaptrack's live sites with these.
    let rounds = std::env::var("RULESET_MEMORY_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(60);
    let per_round = 100.min(names.len() / 60).max(1);
    for r in 0..rounds {
        for name in names.iter().skip(r * per_round).take(per_round) {
            let mut eps = state.endpoints_of(name).to_vec();
            if let Some(e) = eps.first_mut() {
                e.ip = "10.250.0.1".parse().unwrap();
            }
            stores.set_endpoints(name, eps);
        }
        let st = Arc::new(stores.publish(&state.node.name, &mut warnings));
        p.sync_shared(&st).expect("partial sync");
    }
    println!(
        "after {} one-endpoint changes in {rounds} syncs (proxier and stores; this probe's own original state, and the proxier's previous state, are counted too): {:+.1} MiB ({})",
        rounds * per_round,
        in_use_mib() - before,
        rss()
    );
    if std::env::var_os("RULESET_MEMORY_EXIT").is_some() {
        // Under heaptrack: everything still live shows as leaked, by the site that made it.
        std::process::exit(0);
    }
    // What each holds now, by dropping it (compare with the figures above).
    let all = in_use_mib();
    drop(stores);
    let without_stores = in_use_mib();
    drop(p);
    println!(
        "then the stores hold {:.1} MiB and the proxier {:.1} MiB",
        all - without_stores,
        without_stores - in_use_mib()
    );
}
