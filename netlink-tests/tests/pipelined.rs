//! Pipelined requests (`NetlinkSocket::pipelined`, used for IPVS and the IPVS mode's VIPs)
//! against this kernel: more than one `sendmsg` worth of address changes, each answered
//! with its own result, a failed one in the middle not stopping the rest, and its error
//! naming the address. `ip` is the oracle.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::net::{IpAddr, Ipv4Addr};

use kube_nlproxy::kernel::netlink::socket::PIPELINE_DEPTH;
use kube_nlproxy::kernel::rtnl::{IfAddr, Links, NetlinkLinks};
use netlink_tests::ns::{require_root, NetNs};

fn addr(index: u32, i: usize) -> IfAddr {
    IfAddr {
        index,
        addr: IpAddr::V4(Ipv4Addr::from(0x0ac8_0000u32 + i as u32)),
        prefix_len: 32,
    }
}

fn on_lo(ns: &NetNs) -> usize {
    ns.ip("-4 -o addr show dev lo")
        .lines()
        .filter(|l| l.contains(" 10.200."))
        .count()
}

#[test]
fn pipelined_address_changes_answer_each_request_in_order() {
    require_root();
    let ns = NetNs::new("pipe");
    let n = 2 * PIPELINE_DEPTH + 100; // three sendmsg calls
    let dup = PIPELINE_DEPTH + 7; // a failure inside the second one
    let (added, removed) = ns.run(move || {
        let mut l = NetlinkLinks::open().unwrap();
        let lo = l.link("lo").unwrap().expect("lo").index;
        let mut addrs: Vec<IfAddr> = (0..n).map(|i| addr(lo, i)).collect();
        addrs[dup] = addr(lo, 3); // already added by then: EEXIST
        let added: Vec<Result<(), (Option<i32>, String)>> = l
            .change_addresses(true, &addrs)
            .into_iter()
            .map(|r| r.map_err(|e| (e.source.errno(), e.to_string())))
            .collect();
        // Delete every one, and one that was never added.
        let mut gone: Vec<IfAddr> = (0..n).filter(|&i| i != dup).map(|i| addr(lo, i)).collect();
        gone.insert(10, addr(lo, n + 50));
        let removed: Vec<Option<i32>> = l
            .change_addresses(false, &gone)
            .into_iter()
            .map(|r| r.err().and_then(|e| e.source.errno()))
            .collect();
        (added, removed)
    });
    assert_eq!(added.len(), n, "one result per request");
    for (i, r) in added.iter().enumerate() {
        if i == dup {
            let (errno, text) = r.as_ref().expect_err("the duplicate fails");
            assert_eq!(*errno, Some(libc::EEXIST));
            assert!(text.contains("add address 10.200.0.3/32"), "{text}");
        } else {
            assert!(r.is_ok(), "address {i}: {r:?}");
        }
    }
    assert_eq!(removed.len(), n);
    assert_eq!(removed[10], Some(libc::EADDRNOTAVAIL), "the unknown one");
    assert!(
        removed
            .iter()
            .enumerate()
            .all(|(i, e)| i == 10 || e.is_none()),
        "{removed:?}"
    );
    assert_eq!(on_lo(&ns), 0, "all removed");
}

#[test]
fn pipelined_additions_are_all_in_the_kernel() {
    require_root();
    let ns = NetNs::new("pipe2");
    let n = PIPELINE_DEPTH + 1;
    let ok = ns.run(move || {
        let mut l = NetlinkLinks::open().unwrap();
        let lo = l.link("lo").unwrap().expect("lo").index;
        let addrs: Vec<IfAddr> = (0..n).map(|i| addr(lo, i)).collect();
        l.change_addresses(true, &addrs)
            .iter()
            .filter(|r| r.is_ok())
            .count()
    });
    assert_eq!(ok, n);
    assert_eq!(on_lo(&ns), n, "ip sees every address");
    assert!(ns.ip("-4 -o addr show dev lo").contains("10.200.2.0/32"));
}
