//! `dnat to jhash … map @M` (Maglev) against the real kernel and the real nft: what nft 1.0
//! loads for the rule text is exactly our lowering, `nft list` prints our rendering, and
//! real flows from many source ports each reach the endpoint the evaluator predicts.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::Duration;

use kube_nlproxy::kernel::nft::eval::{evaluate, Host, Packet};
use kube_nlproxy::kernel::nft::live::canonical_rule;
use kube_nlproxy::kernel::nft::lower::lower;
use kube_nlproxy::kernel::nft::netlink::NetlinkNftables;
use kube_nlproxy::kernel::nft::{
    encode, render, trace, Chain, ChainType, CmpOp, ElemData, Element, Expr, FakeNftables, Family,
    Field, Hook, KeyValue, Nftables, Rule, Set, Table, Target, Transaction,
};
use kube_nlproxy::proxy::maglev;
use netlink_tests::backend::{classify, parse_greeting, udp_backend, Reply};
use netlink_tests::ns::{require_root, sh, NetNs};

const TABLE: &str = "kube-nlproxy-jhash";

fn maglev_key() -> Vec<Field> {
    vec![Field::Saddr, Field::Sport, Field::Daddr, Field::Dport]
}

/// A table with a nat prerouting chain `pre` holding `rules` and the slot-keyed endpoint
/// map `endpoints-3` (no elements: the rules are what is compared).
fn rules_tx(family: Family, rules: &[Vec<Expr>]) -> Transaction {
    let mut tx = Transaction::new(family, TABLE);
    tx.add(Table {
        family,
        name: TABLE.into(),
        comment: None,
    });
    tx.add(Chain::base("pre", ChainType::Nat, Hook::Prerouting, -100));
    tx.add(Set::endpoint_map("endpoints-3"));
    for exprs in rules {
        tx.add(Rule::new("pre", exprs.clone()));
    }
    tx
}

fn hash(key: Vec<Field>, modulus: u32, seed: u32, offset: u32) -> Expr {
    Expr::DnatHash {
        key,
        modulus,
        seed,
        offset,
        map: "endpoints-3".into(),
    }
}

/// The rules of our table in `ns`, as our decoder reads the kernel's listing.
fn listed(ns: &NetNs, family: Family) -> Vec<Vec<kube_nlproxy::kernel::nft::lower::KExpr>> {
    ns.run(move || {
        let mut n = NetlinkNftables::open().unwrap();
        let mut r = n.list_rules(family, TABLE).unwrap();
        r.sort_by_key(|r| r.handle);
        r.into_iter().map(|r| r.exprs).collect()
    })
}

/// nft's text of the rule loaded by `nft -f` lists back, through our decoder, as exactly
/// our lowering (and as our netlink encoding does), for both families, with and without
/// an offset, a concatenation (padded: 16 and 40 bytes) and a lone field (2 bytes); both
/// tables print the same under `nft list`, and what it prints loads again.
#[test]
fn nft_loads_the_rule_text_as_our_lowering() {
    require_root();
    for family in Family::all() {
        let five = vec![
            Field::Saddr,
            Field::Daddr,
            Field::L4Proto,
            Field::Sport,
            Field::Dport,
        ];
        let rules: Vec<Vec<Expr>> = [
            hash(maglev_key(), 1021, 0x4b4e_4c50, 2048),
            hash(maglev_key(), 251, 0, 0),
            hash(vec![Field::Sport], 7, 5, 1),
            hash(vec![Field::Saddr], 7, 5, 0),
            hash(five, 509, 0xffff_ffff, 10),
        ]
        .into_iter()
        .map(|h| vec![Expr::L4Proto(6), h])
        .collect();
        let tx = rules_tx(family, &rules);
        let text = render::transaction(&tx);
        assert!(
            text.contains(&format!(
                "meta l4proto tcp dnat {family} to jhash {family} saddr . th sport . {family} \
                 daddr . th dport mod 1021 seed 0x4b4e4c50 offset 2048 map @endpoints-3"
            )),
            "{text}"
        );
        let theirs = NetNs::new("jhnft");
        let file = format!("/tmp/{}.nft", theirs.name);
        std::fs::write(&file, &text).unwrap();
        theirs.sh(&format!("nft -f {file}"));
        let _ = std::fs::remove_file(&file);
        let ours = NetNs::new("jhours");
        ours.run({
            let tx = tx.clone();
            move || NetlinkNftables::open().unwrap().apply(&tx).unwrap()
        });
        let want: Vec<_> = rules.iter().map(|r| lower(r, family)).collect();
        let (nft, ours_listed) = (listed(&theirs, family), listed(&ours, family));
        assert_eq!(nft, want, "{family}: nft -f of {text}");
        assert_eq!(ours_listed, want, "{family}: our batch");
        let data_len = |_: &str| encode::key_len(&[Field::Daddr, Field::Dport], family) as usize;
        for (a, b) in nft.iter().zip(&want) {
            assert_eq!(canonical_rule(a, &data_len), canonical_rule(b, &data_len));
        }
        let list = |ns: &NetNs| ns.sh(&format!("nft list table {family} {TABLE}"));
        let printed = list(&ours);
        assert_eq!(printed, list(&theirs), "{family}");
        // After `meta l4proto tcp` nft prints the ports as `tcp sport`, `tcp dport`.
        assert!(
            printed.contains(&format!(
                "dnat {family} to jhash {family} saddr . tcp sport . {family} daddr . tcp dport \
                 mod 1021 seed 0x4b4e4c50 offset 2048 map @endpoints-3"
            )),
            "{printed}"
        );
        assert!(
            printed.contains("mod 251 seed 0x0 map @endpoints-3"),
            "{printed}"
        );
        let again = NetNs::new("jhagain");
        let file = format!("/tmp/{}.nft", again.name);
        std::fs::write(&file, &printed).unwrap();
        again.sh(&format!("nft -f {file}"));
        let _ = std::fs::remove_file(&file);
        assert_eq!(
            list(&again),
            printed,
            "{family}: nft list of ours re-parses"
        );
        assert_eq!(listed(&again, family), want);
    }
}

/// Without a transport match before it, nft prints the rule exactly as we render it (nft
/// itself would not load that text: a port mapping wants a transport protocol match first,
/// so our rules always have `meta l4proto`).
#[test]
fn nft_lists_a_bare_jhash_dnat_as_we_render_it() {
    require_root();
    for family in Family::all() {
        let exprs = vec![hash(maglev_key(), 1021, 0x4b4e_4c50, 2048)];
        let bare = vec![hash(maglev_key(), 251, 0, 0)];
        let tx = rules_tx(family, &[exprs.clone(), bare.clone()]);
        let ns = NetNs::new("jhbare");
        ns.run(move || NetlinkNftables::open().unwrap().apply(&tx).unwrap());
        let printed = ns.sh(&format!("nft list table {family} {TABLE}"));
        for e in [exprs, bare] {
            let line = render::rule_body(&Rule::new("pre", e), family);
            assert!(
                printed.lines().any(|l| l.trim() == line),
                "{line}\n{printed}"
            );
        }
    }
}

const VIP: &str = "10.96.0.50";
const CLIENT: &str = "10.1.0.2";
const BACKENDS: [&str; 4] = ["10.244.0.11", "10.244.0.12", "10.244.0.13", "10.244.0.14"];
const SLOTS: u32 = 251;
const OFFSET: u32 = 1000;
const SEED: u32 = 0x4b4e_4c50;

/// Client → router (our table, forwarding) → four backends on one link:
/// `client 10.1.0.2/24 c0 — r0 10.1.0.1/24 router r1 10.244.0.1/24 — b0 backends`.
fn topology() -> (NetNs, NetNs, NetNs) {
    let (client, router, backends) = (NetNs::new("jhcl"), NetNs::new("jhrt"), NetNs::new("jhbe"));
    for (a, an, b, bn) in [
        (&client, "c0", &router, "r0"),
        (&backends, "b0", &router, "r1"),
    ] {
        sh(&format!(
            "ip link add {an} netns {} type veth peer name {bn} netns {}",
            a.name, b.name
        ));
        a.ip(&format!("link set {an} up"));
        b.ip(&format!("link set {bn} up"));
    }
    client.ip(&format!("addr add {CLIENT}/24 dev c0"));
    client.ip("route add default via 10.1.0.1");
    router.ip("addr add 10.1.0.1/24 dev r0");
    router.ip("addr add 10.244.0.1/24 dev r1");
    router.sh("sysctl -qw net.ipv4.ip_forward=1");
    for b in BACKENDS {
        backends.ip(&format!("addr add {b}/24 dev b0"));
    }
    backends.ip("route add default via 10.244.0.1");
    (client, router, backends)
}

/// `ip daddr VIP meta l4proto udp dnat ip to jhash ip saddr . th sport . ip daddr . th
/// dport mod 251 seed … offset 1000 map @endpoints-1`, the 251 slots filled by Maglev over
/// the four backends (port 8080).
fn maglev_tx() -> Transaction {
    let mut tx = Transaction::new(Family::Ip, TABLE);
    tx.add(Table {
        family: Family::Ip,
        name: TABLE.into(),
        comment: None,
    });
    tx.add(Chain::base("pre", ChainType::Nat, Hook::Prerouting, -100));
    tx.add(Set::endpoint_map("endpoints-1"));
    let ids: Vec<String> = BACKENDS.iter().map(|b| format!("{b}:8080")).collect();
    for (i, owner) in maglev::lookup_table(&ids, SLOTS).iter().enumerate() {
        let ip: IpAddr = BACKENDS[*owner as usize].parse().unwrap();
        tx.add(Element::new(
            "endpoints-1".into(),
            vec![KeyValue::Slot(OFFSET + i as u32)],
            ElemData::Target(Target::new(ip, 8080)),
            None,
        ));
    }
    tx.add(Rule::new(
        "pre",
        vec![
            Expr::Addr {
                field: Field::Daddr,
                op: CmpOp::Eq,
                value: format!("{VIP}/32").parse().unwrap(),
            },
            Expr::L4Proto(17),
            Expr::DnatHash {
                key: maglev_key(),
                modulus: SLOTS,
                seed: SEED,
                offset: OFFSET,
                map: "endpoints-1".into(),
            },
        ],
    ));
    tx
}

/// One UDP request from `CLIENT:sport` to `VIP:80` inside the calling thread's namespace,
/// tried up to three times (the first datagram of a flow may wait on ARP); each wait is
/// bounded by the socket's timeout.
fn udp_from(sport: u16) -> Reply {
    let s = UdpSocket::bind(SocketAddr::new(CLIENT.parse().unwrap(), sport)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    if let Err(e) = s.connect(SocketAddr::new(VIP.parse().unwrap(), 80)) {
        return classify(&e);
    }
    let mut last = Reply::Timeout;
    for _ in 0..3 {
        if let Err(e) = s.send(b"hello") {
            return classify(&e);
        }
        let mut buf = [0u8; 256];
        last = match s.recv(&mut buf) {
            Ok(n) => parse_greeting(&String::from_utf8_lossy(&buf[..n])),
            Err(e) => classify(&e),
        };
        if last != Reply::Timeout {
            break;
        }
    }
    last
}

/// 80 flows that differ only in their source port: each is answered by the backend the
/// evaluator predicts for its 5-tuple from the table listed back from the kernel (and the
/// fake's tracer agrees), and every backend answers some.
#[test]
fn each_flow_reaches_the_endpoint_the_evaluator_predicts() {
    require_root();
    let (client, router, backends) = topology();
    for (i, b) in BACKENDS.iter().enumerate() {
        udp_backend(
            &backends,
            &format!("ep{i}"),
            SocketAddr::new(b.parse().unwrap(), 8080),
        );
    }
    let tx = maglev_tx();
    let live = router.run({
        let tx = tx.clone();
        move || {
            let mut n = NetlinkNftables::open().unwrap();
            n.apply(&tx).unwrap();
            n.read_table(Family::Ip, TABLE).unwrap()
        }
    });
    let mut fake = FakeNftables::new();
    fake.apply(&tx).unwrap();
    let host = Host {
        local_addrs: vec![IpAddr::from([10, 1, 0, 1]), IpAddr::from([10, 244, 0, 1])],
    };
    let sports: Vec<u16> = (0..80).map(|i| 40000 + 7 * i).collect();
    let replies = client.run({
        let sports = sports.clone();
        move || {
            sports
                .iter()
                .map(|p| (*p, udp_from(*p)))
                .collect::<Vec<_>>()
        }
    });
    let name_of = |ip: IpAddr| {
        let i = BACKENDS
            .iter()
            .position(|b| b.parse::<IpAddr>().unwrap() == ip);
        format!("ep{}", i.expect("a backend address"))
    };
    let mut answered: BTreeMap<String, usize> = BTreeMap::new();
    for (sport, reply) in &replies {
        let pkt = Packet {
            saddr: CLIENT.parse().unwrap(),
            daddr: VIP.parse().unwrap(),
            proto: 17,
            sport: *sport,
            dport: 80,
            iif: Some("r0".into()),
            mark: 0,
        };
        let paths = evaluate(&live, &host, &pkt);
        assert_eq!(paths.len(), 1, "sport {sport}: one certain path: {paths:?}");
        let (ip, port) = paths[0].dnat.expect("DNATed");
        assert_eq!(port, 8080);
        let want = name_of(ip);
        match reply {
            Reply::Answered { name, peer } => {
                assert_eq!(*name, want, "sport {sport}: kernel and evaluator disagree");
                assert_eq!(peer.to_string(), CLIENT);
            }
            other => panic!("sport {sport}: no answer: {other:?}"),
        }
        let traced = trace::trace(
            &fake,
            Family::Ip,
            TABLE,
            "pre",
            0,
            &trace::Packet {
                saddr: pkt.saddr,
                daddr: pkt.daddr,
                proto: 17,
                sport: Some(*sport),
                dport: 80,
                iif: "r0".into(),
                local_addrs: host.local_addrs.clone(),
            },
        );
        assert_eq!(
            traced,
            BTreeSet::from([trace::Outcome::Dnat {
                addr: ip,
                port,
                masquerade: false
            }]),
            "sport {sport}: the fake's tracer agrees"
        );
        *answered.entry(want).or_default() += 1;
    }
    assert_eq!(
        answered.len(),
        BACKENDS.len(),
        "every backend answers some: {answered:?}"
    );
}
