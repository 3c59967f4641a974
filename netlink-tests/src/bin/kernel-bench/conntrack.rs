//! Conntrack reconciliation: 100k UDP entries of which 1k are stale, ours (dump, decide,
//! delete over ctnetlink) against `conntrack -L` merely listing the same table (I/O).

use std::net::Ipv4Addr;
use std::time::Instant;

use kube_nlproxy::kernel::conntrack::ctnetlink::NetlinkConntrack;
use kube_nlproxy::kernel::conntrack::{Conntrack, Flow};
use kube_nlproxy::kernel::nft::Family;
use kube_nlproxy::model::Protocol;
use kube_nlproxy::proxy::conntrack::{service_destinations, stale_flows};
use netlink_tests::baseline::{cluster_ip, endpoint_ip};
use netlink_tests::ns::NetNs;

use crate::args::EPS;
use crate::harness::{state, timed};
use crate::table::{render_time, render_time_ratio, Row, Table, Target};

/// Reconciling a conntrack table of 100k UDP entries of which 1k are stale: dump, decide,
/// delete (ours) against `conntrack -L` merely listing the same table.
pub fn conntrack_row(table: &mut Table) {
    let ns = NetNs::new("kc");
    let mut st = state(1000);
    let keys: Vec<_> = st.services.keys().cloned().collect();
    for k in keys {
        let mut sp = std::sync::Arc::unwrap_or_clone(st.services.remove(&k).unwrap());
        let eps = st.endpoints.remove(&k).unwrap();
        sp.name.protocol = Protocol::Udp;
        st.endpoints.insert(sp.name.clone(), eps);
        st.services.insert(sp.name.clone(), sp.into());
    }
    let (ours, deleted) = ns.run(move || {
        let mut ct = NetlinkConntrack::open().unwrap();
        let flows: Vec<(Flow, u32)> = (0..100_000u32)
            .map(|i| {
                let svc = (i % 1000) as usize;
                let ep = (i / 1000 % 10) as usize;
                let src = Ipv4Addr::from(0x0b00_0000 + i);
                let reply = if i % 100 == 0 {
                    Ipv4Addr::from(0x0c00_0000 + i)
                } else {
                    endpoint_ip(svc, ep, EPS)
                };
                (
                    Flow {
                        proto: 17,
                        orig_src: src.into(),
                        orig_dst: cluster_ip(svc).into(),
                        orig_sport: 40000,
                        orig_dport: 80,
                        reply_src: reply.into(),
                        reply_dst: src.into(),
                        reply_sport: 8080,
                        reply_dport: 40000,
                        zone: 0,
                        id: None,
                    },
                    600,
                )
            })
            .collect();
        ct.create(&flows).unwrap();
        let t0 = Instant::now();
        let dests = service_destinations(&st, Family::Ip, Protocol::Udp);
        let all = ct.list(Family::Ip, 17).unwrap();
        let n = ct
            .delete(&stale_flows(&dests, &Default::default(), &all))
            .unwrap();
        (t0.elapsed(), n)
    });
    assert_eq!(deleted, 1000);
    let list = timed(&ns, &["conntrack", "-L", "-p", "udp"], "");
    table.push(
        Row::new(
            "conntrack reconcile: 100k UDP entries, 1k stale (dump + decide + delete)",
            render_time(ours),
        )
        .baseline(format!(
            "{} (`conntrack -L` listing only)",
            render_time(list)
        ))
        .ratio(render_time_ratio(list, ours, 1))
        .target(Target::Note("(issue 5 benchmark)")),
    );
    eprintln!("conntrack: done");
}
