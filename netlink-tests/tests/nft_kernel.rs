//! Differential tests: transactions committed to the kernel over netlink in a throwaway
//! namespace, listed back, and compared with what `nft -f` makes of the same transaction
//! rendered as text (nft is a test-time oracle only).
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use kube_nlproxy::kernel::nft::netlink::NetlinkNftables;
use kube_nlproxy::kernel::nft::{
    render, Chain, ChainType, CmpOp, ElemData, Element, Expr, Family, Field, Hook, KeyValue,
    Nftables, Rule, Set, Table, Transaction, Verdict,
};
use netlink_tests::ns::{require_root, NetNs};

/// `jhash` DNAT (Maglev): nft's own encoding of it, and real flows against the evaluator.
#[path = "nft_kernel/jhash.rs"]
mod jhash;

fn sample(family: Family) -> Transaction {
    let (a, b, net) = match family {
        Family::Ip => ("10.96.0.10", "10.244.1.2", "10.0.0.0/8"),
        Family::Ip6 => ("fd00:96::10", "fd00:244::2", "fd00::/8"),
    };
    let t = "kube-nlproxy-test";
    let mut tx = Transaction::new(family, t);
    tx.add(Table {
        family,
        name: t.into(),
        comment: Some("rules for kube-nlproxy".into()),
    });
    tx.add(Chain::base(
        "nat-prerouting",
        ChainType::Nat,
        Hook::Prerouting,
        -100,
    ));
    tx.add(Chain::base(
        "filter-input",
        ChainType::Filter,
        Hook::Input,
        0,
    ));
    tx.add(Chain::regular("services"));
    tx.add(Chain::regular("svc1"));
    tx.add(Chain::regular("reject-chain"));
    tx.add(Set::vmap(
        "service-ips",
        vec![Field::Daddr, Field::L4Proto, Field::Dport],
    ));
    tx.add(Set::plain("hairpin", vec![Field::Saddr, Field::Daddr]));
    let mut aff = Set::plain("affinity-1", vec![Field::Saddr]);
    aff.timeout = Some(10800);
    tx.add(aff);
    tx.add(Rule::new(
        "nat-prerouting",
        vec![Expr::Verdict(Verdict::Jump("services".into()))],
    ));
    tx.add(Rule::new(
        "services",
        vec![Expr::Vmap {
            key: vec![Field::Daddr, Field::L4Proto, Field::Dport],
            map: "service-ips".into(),
        }],
    ));
    tx.add(Rule::new("reject-chain", vec![Expr::Reject]));
    tx.add(Rule::new(
        "services",
        vec![
            Expr::IifName {
                name: "veth".into(),
                prefix: true,
                op: CmpOp::Neq,
            },
            Expr::IifName {
                name: "cni0".into(),
                prefix: false,
                op: CmpOp::Eq,
            },
            Expr::Counter,
        ],
    ));
    tx.add(
        Rule::new(
            "filter-input",
            vec![
                Expr::CtStateInvalid,
                Expr::Counter,
                Expr::Verdict(Verdict::Drop),
            ],
        )
        .with_comment("drop conntrack INVALID packets, kubernetes#74839"),
    );
    tx.add(Rule::new(
        "filter-input",
        vec![
            Expr::CtStateNew,
            Expr::FibLocal(Field::Daddr),
            Expr::Verdict(Verdict::Jump("reject-chain".into())),
        ],
    ));
    tx.add(
        Rule::new(
            "svc1",
            vec![
                Expr::Addr {
                    field: Field::Saddr,
                    op: CmpOp::Neq,
                    value: net.parse().unwrap(),
                },
                Expr::MarkOr(0x4000),
            ],
        )
        .with_comment("masquerade off-cluster traffic"),
    );
    tx.add(Rule::new(
        "svc1",
        vec![
            Expr::InSet {
                key: vec![Field::Saddr],
                set: "affinity-1".into(),
                negate: false,
            },
            Expr::UpdateSet {
                set: "affinity-1".into(),
                key: Field::Saddr,
            },
            Expr::L4Proto(6),
            Expr::Dnat {
                addr: b.parse().unwrap(),
                port: 8080,
            },
        ],
    ));
    tx.add(Rule::new(
        "svc1",
        vec![
            Expr::NumgenZero(2),
            Expr::L4Proto(6),
            Expr::Dnat {
                addr: b.parse().unwrap(),
                port: 8080,
            },
        ],
    ));
    tx.add(Rule::new(
        "svc1",
        vec![Expr::L4Proto(17), Expr::Redirect { port: 31234 }],
    ));
    tx.add(Set::endpoint_map("endpoints"));
    tx.add(Rule::new(
        "svc1",
        vec![
            Expr::L4Proto(6),
            Expr::DnatMap {
                modulus: 2,
                offset: 4,
                map: "endpoints".into(),
            },
        ],
    ));
    // Maglev: the slot by a jhash of the flow's addresses and ports, the seed always sent
    // (0 too), `offset 0` left out when nft lists it; a lone field hashes its own 2 bytes.
    for (key, seed, offset) in [
        (
            vec![Field::Saddr, Field::Sport, Field::Daddr, Field::Dport],
            0x4b4e_4c50,
            2048,
        ),
        (
            vec![Field::Saddr, Field::Sport, Field::Daddr, Field::Dport],
            0,
            0,
        ),
        (vec![Field::Sport], 7, 4),
    ] {
        tx.add(Rule::new(
            "svc1",
            vec![
                Expr::L4Proto(6),
                Expr::DnatHash {
                    key,
                    modulus: 1021,
                    seed,
                    offset,
                    map: "endpoints".into(),
                },
            ],
        ));
    }
    for (slot, port) in [(4u32, 8080u16), (5, 8443)] {
        tx.add(Element::new(
            "endpoints".into(),
            vec![KeyValue::Slot(slot)],
            ElemData::Target(std::net::SocketAddr::new(b.parse().unwrap(), port).into()),
            None,
        ));
    }
    // Endpoint maps keyed by packet fields: one endpoint per address and port, and several
    // picked by `numgen random mod N` (`nft list` prints their typeof from the user data).
    let addr_key = vec![Field::Daddr, Field::L4Proto, Field::Dport];
    let mut balance_key = addr_key.clone();
    balance_key.push(Field::Random(3));
    for (map, key) in [
        ("one-endpoint-services", addr_key),
        ("balance-3-services", balance_key),
    ] {
        tx.add(Set::endpoint_map_by(map, key.clone()));
        let chain = format!("{map}-chain");
        tx.add(Chain::regular(chain.clone()));
        tx.add(Rule::new(
            chain,
            vec![Expr::DnatLookup {
                key: key.clone(),
                map: map.into(),
            }],
        ));
        let slots: &[Option<u32>] = if key.len() == 4 {
            &[Some(0), Some(1), Some(2)]
        } else {
            &[None]
        };
        for (i, slot) in slots.iter().enumerate() {
            let mut k = vec![
                KeyValue::Addr(a.parse().unwrap()),
                KeyValue::Proto(6),
                KeyValue::Port(80),
            ];
            k.extend(slot.map(KeyValue::Slot));
            tx.add(Element::new(
                map.into(),
                k,
                ElemData::Target(
                    std::net::SocketAddr::new(b.parse().unwrap(), 8080 + i as u16).into(),
                ),
                None,
            ));
        }
    }
    tx.add(Chain::base(
        "nat-postrouting",
        ChainType::Nat,
        Hook::Postrouting,
        100,
    ));
    tx.add(Chain::regular("masquerading"));
    tx.add(Rule::new(
        "nat-postrouting",
        vec![Expr::Verdict(Verdict::Jump("masquerading".into()))],
    ));
    tx.add(Rule::new(
        "masquerading",
        vec![
            Expr::CtStatusDnat,
            Expr::InSet {
                key: vec![Field::Saddr, Field::Daddr],
                set: "hairpin".into(),
                negate: false,
            },
            Expr::MarkBitClear(0x4000),
            Expr::Masquerade { fully_random: true },
        ],
    ));
    tx.add(Element::new(
        "service-ips".into(),
        vec![
            KeyValue::Addr(a.parse().unwrap()),
            KeyValue::Proto(6),
            KeyValue::Port(80),
        ],
        ElemData::Verdict(Verdict::Goto("svc1".into())),
        Some("ns1/svc1:http".into()),
    ));
    tx.add(Element::new(
        "hairpin".into(),
        vec![
            KeyValue::Addr(b.parse().unwrap()),
            KeyValue::Addr(b.parse().unwrap()),
        ],
        ElemData::None,
        None,
    ));
    tx
}

fn nft_list(ns: &NetNs, family: Family, table: &str) -> String {
    ns.sh(&format!("nft list table {family} {table}"))
}

#[test]
fn netlink_batch_matches_nft_f_of_rendered_text() {
    require_root();
    for family in Family::all() {
        let tx = sample(family);
        let ours = NetNs::new("nftdiff");
        ours.run({
            let tx = tx.clone();
            move || NetlinkNftables::open().unwrap().apply(&tx).unwrap()
        });
        let theirs = NetNs::new("nftdiff");
        let text = render::transaction(&tx);
        std::fs::write("/tmp/nlp-diff.nft", &text).unwrap();
        theirs.sh("nft -f /tmp/nlp-diff.nft");
        let a = nft_list(&ours, family, &tx.table);
        let b = nft_list(&theirs, family, &tx.table);
        assert_eq!(
            a, b,
            "netlink and nft -f disagree for {family}:\n--- ours\n{a}\n--- nft -f\n{b}"
        );
        assert!(a.contains("numgen random mod 2"), "{a}");
        assert!(
            a.contains(&format!(
                "dnat {family} to jhash {family} saddr . tcp sport . {family} daddr . tcp dport \
                 mod 1021 seed 0x4b4e4c50 offset 2048 map @endpoints"
            )),
            "{a}"
        );
        assert!(
            a.contains("ct state invalid counter packets 0 bytes 0 drop"),
            "{a}"
        );
        assert!(
            a.contains(&format!(
                "typeof {family} daddr . meta l4proto . th dport . numgen random mod 3 : \
                 {family} daddr . th dport"
            )),
            "{a}"
        );
    }
}

#[test]
fn rules_list_back_as_encoded() {
    require_root();
    let tx = sample(Family::Ip);
    let ns = NetNs::new("nftlist");
    let (rules, chains, sets, elems) = ns.run(move || {
        let mut n = NetlinkNftables::open().unwrap();
        n.apply(&tx).unwrap();
        let rules = n.list_rules(Family::Ip, &tx.table).unwrap();
        let chains = n.list_chains(Family::Ip, &tx.table).unwrap();
        let sets = n.list_sets(Family::Ip, &tx.table).unwrap();
        let elems = n
            .list_elements(Family::Ip, &tx.table, "service-ips")
            .unwrap();
        (rules, chains, sets, elems)
    });
    let expected = sample(Family::Ip);
    let want: Vec<_> = expected
        .ops
        .iter()
        .filter_map(|o| match o.object() {
            kube_nlproxy::kernel::nft::Object::Rule(r) => Some(
                kube_nlproxy::kernel::nft::lower::lower(&r.exprs, Family::Ip),
            ),
            _ => None,
        })
        .collect();
    let mut got: Vec<_> = rules.iter().map(|r| r.exprs.clone()).collect();
    let mut want_sorted = want.clone();
    got.sort_by_key(|e| format!("{e:?}"));
    want_sorted.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(got, want_sorted);
    let mut chains = chains;
    chains.sort();
    assert_eq!(
        chains,
        [
            "balance-3-services-chain",
            "filter-input",
            "masquerading",
            "nat-postrouting",
            "nat-prerouting",
            "one-endpoint-services-chain",
            "reject-chain",
            "services",
            "svc1"
        ]
    );
    assert_eq!(sets.len(), 6);
    // A key ending in a `numgen` value: address, protocol and port each in a 32-bit
    // register, then the slot in host byte order.
    let mut balanced = ns.run(|| {
        NetlinkNftables::open()
            .unwrap()
            .list_elements(Family::Ip, "kube-nlproxy-test", "balance-3-services")
            .unwrap()
    });
    balanced.sort_by(|a, b| a.key.cmp(&b.key));
    let keys: Vec<Vec<u8>> = balanced.into_iter().map(|e| e.key).collect();
    let key = |slot: u32| {
        let mut k = vec![10, 96, 0, 10, 6, 0, 0, 0, 0, 80, 0, 0];
        k.extend(slot.to_ne_bytes());
        k
    };
    assert_eq!(keys, [key(0), key(1), key(2)]);
    assert_eq!(elems.len(), 1);
    assert_eq!(elems[0].verdict, Some(Verdict::Goto("svc1".into())));
    let mut eps = ns.run(|| {
        NetlinkNftables::open()
            .unwrap()
            .list_elements(Family::Ip, "kube-nlproxy-test", "endpoints")
            .unwrap()
    });
    eps.sort_by(|a, b| a.key.cmp(&b.key));
    let listed: Vec<(Vec<u8>, Option<Vec<u8>>)> =
        eps.into_iter().map(|e| (e.key, e.value)).collect();
    assert_eq!(
        listed,
        [
            (
                4u32.to_ne_bytes().to_vec(),
                Some(vec![10, 244, 1, 2, 0x1f, 0x90, 0, 0])
            ),
            (
                5u32.to_ne_bytes().to_vec(),
                Some(vec![10, 244, 1, 2, 0x20, 0xfb, 0, 0])
            ),
        ],
        "slot keys in host order, address . port data"
    );
}

#[test]
fn failed_batch_names_the_object_and_changes_nothing() {
    require_root();
    let ns = NetNs::new("nftfail");
    let before = sample(Family::Ip);
    let table = before.table.clone();
    ns.run(move || NetlinkNftables::open().unwrap().apply(&before).unwrap());
    let listed_before = nft_list(&ns, Family::Ip, &table);
    let mut bad = Transaction::new(Family::Ip, &table);
    bad.add(Chain::regular("new-chain"));
    bad.add(Rule::new(
        "new-chain",
        vec![Expr::Verdict(Verdict::Goto("no-such-chain".into()))],
    ));
    let err = ns.run(move || NetlinkNftables::open().unwrap().apply(&bad).unwrap_err());
    assert!(err.is_not_found(), "{err}");
    assert!(err.to_string().contains("rule in chain new-chain"), "{err}");
    assert_eq!(listed_before, nft_list(&ns, Family::Ip, &table));
}

#[test]
fn large_batch_goes_through() {
    require_root();
    let ns = NetNs::new("nftbig");
    let n = ns.run(|| {
        let mut tx = Transaction::new(Family::Ip, "big");
        tx.add(Table {
            family: Family::Ip,
            name: "big".into(),
            comment: None,
        });
        tx.add(Set::vmap(
            "m",
            vec![Field::Daddr, Field::L4Proto, Field::Dport],
        ));
        tx.add(Chain::regular("c"));
        for i in 0..100_000u32 {
            tx.add(Element::new(
                "m".into(),
                vec![
                    KeyValue::Addr(std::net::Ipv4Addr::from(0x0a00_0000 + i).into()),
                    KeyValue::Proto(6),
                    KeyValue::Port(80),
                ],
                ElemData::Verdict(Verdict::Goto("c".into())),
                Some("some/namespace/service:port".into()),
            ));
        }
        let mut nft = NetlinkNftables::open().unwrap();
        nft.apply(&tx).unwrap();
        nft.list_elements(Family::Ip, "big", "m").unwrap().len()
    });
    assert_eq!(n, 100_000);
}

#[test]
fn corrupted_batch_is_rejected_whole_and_the_ruleset_is_byte_identical() {
    require_root();
    let ns = NetNs::new("nftfault");
    let good = sample(Family::Ip);
    let table = good.table.clone();
    ns.run(move || NetlinkNftables::open().unwrap().apply(&good).unwrap());
    let before = nft_list(&ns, Family::Ip, &table);
    let mut change = Transaction::new(Family::Ip, &table);
    change.flush(Chain::regular("svc1"));
    change.add(Rule::new("svc1", vec![Expr::Verdict(Verdict::Drop)]));
    change.add(Chain::regular("extra"));
    let err = ns.run(move || {
        let mut n = NetlinkNftables::open().unwrap();
        n.corrupt_next_batch();
        n.apply(&change).unwrap_err()
    });
    assert!(
        err.to_string().contains("add chain extra"),
        "the error names the failing operation: {err}"
    );
    assert!(err.errno().is_some());
    assert_eq!(
        before,
        nft_list(&ns, Family::Ip, &table),
        "the previous ruleset stays in force unchanged"
    );
}

fn big_tx(table: &str, n: u32) -> Transaction {
    let mut tx = Transaction::new(Family::Ip, table);
    tx.add(Table {
        family: Family::Ip,
        name: table.into(),
        comment: None,
    });
    tx.add(Set::plain("s", vec![Field::Daddr]));
    tx.add(Chain::regular("c"));
    for i in 0..n {
        tx.add(Element::new(
            "s".into(),
            vec![KeyValue::Addr(
                std::net::Ipv4Addr::from(0x0a00_0000 + i).into(),
            )],
            ElemData::None,
            None,
        ));
    }
    tx
}

/// Large batches are committed with the change monitor out of its group (the kernel would
/// otherwise build a notification per object); the monitor hears changes again right
/// after, and a change slipped into the pause is reported as missed.
#[test]
fn large_batches_pause_the_monitor_and_report_what_it_missed() {
    use kube_nlproxy::kernel::nft::monitor::Monitor;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;
    require_root();
    let ns = NetNs::new("nftquiet");
    let name = ns.name.clone();
    let (foreign, missed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (f2, m2) = (foreign.clone(), missed.clone());
    let wait_for = |c: &AtomicUsize, n: usize| {
        let t0 = std::time::Instant::now();
        while c.load(SeqCst) < n && t0.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        c.load(SeqCst)
    };
    let (tx_port, rx_port) = std::sync::mpsc::channel();
    let monitor = ns.run(Monitor::open).unwrap();
    let switch = monitor.switch().unwrap();
    std::thread::spawn(move || {
        let port: u32 = rx_port.recv().unwrap();
        let _ = monitor.run(
            "t".into(),
            move || port,
            move || {
                f2.fetch_add(1, SeqCst);
            },
        );
    });
    let mut nft = ns.run(|| NetlinkNftables::open().unwrap());
    tx_port.send(nft.port_id()).unwrap();
    nft.quiet_large_batches(
        switch,
        Box::new(move || {
            m2.fetch_add(1, SeqCst);
        }),
    );
    // Our own large batch: nothing foreign, nothing missed.
    nft.apply(&big_tx("t", 3000)).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!((foreign.load(SeqCst), missed.load(SeqCst)), (0, 0));
    // The monitor is back in its group: a foreign change is heard.
    netlink_tests::ns::sh(&format!("ip netns exec {name} nft add chain ip t other"));
    assert_eq!(
        wait_for(&foreign, 1),
        1,
        "foreign change heard after a quiet batch"
    );
    // A foreign deletion inside the pause is not heard by the monitor, but reported.
    let n2 = name.clone();
    nft.after_next_quiet_commit(Box::new(move || {
        netlink_tests::ns::sh(&format!("ip netns exec {n2} nft delete table ip t"));
    }));
    nft.apply(&big_tx("t", 3001)).unwrap();
    assert_eq!(
        wait_for(&missed, 1),
        1,
        "the deletion in the pause is reported"
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(
        foreign.load(SeqCst),
        1,
        "the monitor was out of its group during the pause"
    );
    // A foreign element deletion during a partial batch's pause is reported: the batch
    // does not re-assert what it leaves alone.
    let n3 = name.clone();
    nft.after_next_quiet_commit(Box::new(move || {
        netlink_tests::ns::sh(&format!(
            "ip netns exec {n3} nft delete element ip t s '{{ 10.0.0.7 }}'"
        ));
    }));
    nft.apply(&big_tx("t", 3002)).unwrap();
    assert_eq!(
        wait_for(&missed, 2),
        2,
        "an element deleted in a partial batch's pause is reported"
    );
    // Behind a whole-table batch (a full sync), a foreign change elsewhere is no reason to
    // restore: the batch asserted all of ours.
    let n4 = name.clone();
    nft.after_next_quiet_commit(Box::new(move || {
        netlink_tests::ns::sh(&format!("ip netns exec {n4} nft add table ip unrelated"));
    }));
    let mut whole = big_tx("t", 3003);
    whole.whole_table = true;
    nft.apply(&whole).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(missed.load(SeqCst), 2);
}
