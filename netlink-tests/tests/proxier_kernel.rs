//! A full proxier sync into the kernel, listed back and compared with the Fake that the unit
//! tests trust; then partial syncs on both, compared again. Also: a 10k-service sync goes
//! through in one batch.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::collections::BTreeMap;

use kube_nlproxy::config::DetectLocal;
use kube_nlproxy::kernel::nft::lower::{key_bytes, lower, target_bytes, KExpr};
use kube_nlproxy::kernel::nft::netlink::NetlinkNftables;
use kube_nlproxy::kernel::nft::{FakeNftables, Family, Nftables};
use kube_nlproxy::model::ProxyState;
use kube_nlproxy::modes::nftables::NftablesProxier;
use kube_nlproxy::proxy::{names, LocalDetector, ProxierConfig};
use kube_nlproxy::source::convert::build_state;
use kube_nlproxy::source::manifest;
use netlink_tests::ns::{require_root, NetNs};

use netlink_tests::listing::Listing;

fn cfg() -> ProxierConfig {
    ProxierConfig {
        local_detector: LocalDetector::Cidrs(vec![
            "10.244.0.0/16".parse().unwrap(),
            "fd00:10:244::/48".parse().unwrap(),
        ]),
        ..Default::default()
    }
}

fn kernel_listing(n: &mut NetlinkNftables, family: Family) -> Listing {
    netlink_tests::listing::kernel_listing(n, family, names::DEFAULT_TABLE)
}

fn fake_listing(f: &mut FakeNftables, family: Family) -> Listing {
    let t = names::DEFAULT_TABLE;
    let mut chains = f.list_chains(family, t).unwrap();
    chains.sort();
    let rules = chains
        .iter()
        .map(|c| {
            let r = f
                .rules(family, t, c)
                .unwrap()
                .iter()
                .map(|r| lower(&r.exprs, family))
                .collect();
            (c.clone(), r)
        })
        .collect();
    let mut elems = BTreeMap::new();
    for s in f.list_sets(family, t).unwrap() {
        let mut v: Vec<_> = f
            .elements(family, t, &s)
            .unwrap()
            .into_iter()
            .map(|e| (key_bytes(&e.key), e.verdict().cloned()))
            .collect();
        v.sort();
        elems.insert(s, v);
    }
    (chains, rules, elems)
}

fn example_state() -> ProxyState {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster.yaml");
    let (snap, w) = manifest::load(&path, "node1").unwrap();
    assert!(w.is_empty(), "{w:?}");
    build_state(&snap, "node1", &Default::default()).0
}

fn compare(kernel: &mut NetlinkNftables, fake: &mut FakeNftables, when: &str) {
    for family in Family::all() {
        let k = kernel_listing(kernel, family);
        let f = fake_listing(fake, family);
        assert_eq!(k.0, f.0, "{when}: chains differ ({family})");
        for (c, rules) in &f.1 {
            assert_eq!(&k.1[c], rules, "{when}: rules of {c} differ ({family})");
        }
        assert_eq!(k.2, f.2, "{when}: set elements differ ({family})");
    }
}

/// Endpoint-map contents per map: slot → the endpoint's bytes as the kernel stores them.
type Slots = BTreeMap<String, BTreeMap<u32, Vec<u8>>>;

/// Chains, rules (endpoint-map offsets zeroed), the endpoints behind each endpoint-map
/// rule, and the other sets' elements.
type Routing = (
    Vec<String>,
    BTreeMap<String, Vec<Vec<KExpr>>>,
    Vec<(String, Vec<Vec<u8>>)>,
    BTreeMap<String, Vec<(Vec<u8>, Option<kube_nlproxy::kernel::nft::Verdict>)>>,
);

/// What a listing routes, wherever its endpoint slots were allocated: each rule with the
/// offset of its `numgen` lookup zeroed and the endpoints of its slots beside it, and every
/// set other than the endpoint maps, element by element (slot offsets depend on the order
/// Services came and went, which a fresh sync does not repeat).
fn routing(l: Listing, slots: &Slots) -> Routing {
    let (chains, rules, elems) = l;
    let mut targets = Vec::new();
    let mut out = BTreeMap::new();
    for (c, rs) in rules {
        let mut v = Vec::new();
        for mut r in rs {
            let mut at = None;
            for e in r.iter_mut() {
                if let KExpr::Numgen {
                    modulus, offset, ..
                } = e
                {
                    at = Some((*modulus, *offset));
                    *offset = 0;
                }
                if let (Some((m, o)), KExpr::Lookup { set, .. }) = (at, &*e) {
                    let map = slots.get(set).cloned().unwrap_or_default();
                    let eps = (o..o + m)
                        .map(|k| map.get(&k).cloned().unwrap_or_default())
                        .collect();
                    targets.push((c.clone(), eps));
                    at = None;
                }
            }
            v.push(r);
        }
        out.insert(c, v);
    }
    let others = elems
        .into_iter()
        .filter(|(s, _)| !s.starts_with("endpoints-"))
        .collect();
    (chains, out, targets, others)
}

fn kernel_slots(n: &mut NetlinkNftables, family: Family) -> Slots {
    let t = names::DEFAULT_TABLE;
    let mut out = Slots::new();
    for s in n.list_sets(family, t).unwrap() {
        if s.starts_with("endpoints-") {
            let m = n
                .list_elements(family, t, &s)
                .unwrap()
                .into_iter()
                .map(|e| {
                    let k = u32::from_ne_bytes(e.key[..4].try_into().unwrap());
                    (k, e.value.unwrap_or_default())
                });
            out.insert(s, m.collect());
        }
    }
    out
}

fn fake_slots(f: &mut FakeNftables, family: Family) -> Slots {
    use kube_nlproxy::kernel::nft::KeyValue;
    let t = names::DEFAULT_TABLE;
    let mut out = Slots::new();
    for s in f.list_sets(family, t).unwrap() {
        if s.starts_with("endpoints-") {
            let m = f
                .elements(family, t, &s)
                .unwrap()
                .into_iter()
                .filter_map(|e| {
                    let Some(KeyValue::Slot(k)) = e.key.get(0) else {
                        return None;
                    };
                    Some((
                        k,
                        e.target()
                            .map(|t| target_bytes(&t.into()))
                            .unwrap_or_default(),
                    ))
                });
            out.insert(s, m.collect());
        }
    }
    out
}

/// [`compare`] up to where endpoint slots were allocated: the same chains, rules, set
/// elements, and the same endpoints behind every endpoint-map rule.
fn compare_routing(kernel: &mut NetlinkNftables, fake: &mut FakeNftables, when: &str) {
    for family in Family::all() {
        let (ks, fs) = (kernel_slots(kernel, family), fake_slots(fake, family));
        let k = routing(kernel_listing(kernel, family), &ks);
        let f = routing(fake_listing(fake, family), &fs);
        assert_eq!(k.0, f.0, "{when}: chains differ ({family})");
        assert_eq!(k.1, f.1, "{when}: rules differ ({family})");
        assert_eq!(
            k.2, f.2,
            "{when}: endpoints behind the rules differ ({family})"
        );
        assert_eq!(k.3, f.3, "{when}: set elements differ ({family})");
        let count = |s: &Slots| s.values().map(|m| m.len()).sum::<usize>();
        assert_eq!(
            count(&ks),
            count(&fs),
            "{when}: endpoint-map elements ({family})"
        );
    }
}

/// A proxier on the kernel (in the calling thread's namespace) and one on the fake, alike.
fn kernel_and_fake() -> (
    NftablesProxier<NetlinkNftables>,
    NftablesProxier<FakeNftables>,
) {
    let k = NftablesProxier::new(
        NetlinkNftables::open().unwrap(),
        cfg(),
        DetectLocal::ClusterCidr(vec![]),
    );
    let f = NftablesProxier::new(FakeNftables::new(), cfg(), DetectLocal::ClusterCidr(vec![]));
    (k, f)
}

#[test]
fn kernel_and_fake_agree_through_full_and_partial_syncs() {
    require_root();
    let ns = NetNs::new("pk");
    ns.run(|| {
        let mut st = example_state();
        let (mut k, mut f) = kernel_and_fake();
        k.sync(&st).unwrap();
        f.sync(&st).unwrap();
        compare(k.nft(), f.nft(), "after the full sync");
        // Change one endpoint and drop a Service: partial syncs on both.
        let web = st
            .services
            .keys()
            .find(|s| &*s.name == "web")
            .unwrap()
            .clone();
        std::sync::Arc::make_mut(st.endpoints.get_mut(&web).unwrap())[0].ip =
            "10.244.1.77".parse().unwrap();
        let shop = st
            .services
            .keys()
            .find(|s| &*s.name == "shop")
            .unwrap()
            .clone();
        st.services.remove(&shop);
        st.endpoints.remove(&shop);
        for _ in 0..2 {
            assert!(!k.sync(&st).unwrap().full);
            f.sync(&st).unwrap();
            compare(k.nft(), f.nft(), "after partial syncs");
        }
    });
}

fn big_state(services: usize, eps: usize) -> ProxyState {
    kube_nlproxy::model::fixtures::synthetic_state(services, eps)
}

#[test]
fn ten_thousand_services_sync_in_one_batch() {
    require_root();
    let ns = NetNs::new("big");
    let (rules, chains, balanced, service_ips) = ns.run(|| {
        let st = big_state(10_000, 10);
        let mut k = NftablesProxier::new(
            NetlinkNftables::open().unwrap(),
            cfg(),
            DetectLocal::ClusterCidr(vec![]),
        );
        let stats = k.sync(&st).unwrap();
        assert!(stats.ops[&Family::Ip] > 100_000, "{:?}", stats.ops);
        let n = k.nft();
        let mut elements = |set: &str| {
            n.list_elements(Family::Ip, names::DEFAULT_TABLE, set)
                .unwrap()
                .len()
        };
        let balanced = elements(&names::balance_map(10));
        let service_ips = elements(names::SERVICE_IPS);
        (
            n.list_rules(Family::Ip, names::DEFAULT_TABLE)
                .unwrap()
                .len(),
            n.list_chains(Family::Ip, names::DEFAULT_TABLE).unwrap(),
            balanced,
            service_ips,
        )
    });
    // ClusterIP service ports with 10 endpoints and nothing else of their own share the
    // chain `balance-10`: no chain per service port, the 100,000 endpoints are elements of
    // its map, the 10,000 ClusterIPs elements of `service-ips`.
    assert!(chains.contains(&names::balance_chain(10)), "{chains:?}");
    assert!(chains.len() < 30, "{chains:?}");
    assert!(rules < 40, "{rules}");
    assert_eq!(balanced, 100_000);
    assert_eq!(service_ips, 10_000);
}

/// One service port of a collision sequence: (name, ClusterIP, externalIP, NodePort,
/// creation time, endpoints).
type Claim = (
    &'static str,
    &'static str,
    Option<&'static str>,
    Option<u16>,
    Option<i64>,
    &'static [&'static str],
);

fn claims_state(claims: &[Claim]) -> ProxyState {
    use kube_nlproxy::model::{Endpoint, NodeInfo, Protocol, ServicePort, ServicePortName};
    let mut st = ProxyState {
        node: NodeInfo {
            name: "node1".into(),
            addresses: vec!["192.168.0.2".parse().unwrap()],
            ..Default::default()
        },
        ..Default::default()
    };
    for (name, cip, ext, np, created, eps) in claims {
        let spn = ServicePortName {
            namespace: "ns".into(),
            name: (*name).into(),
            port: "p".into(),
            protocol: Protocol::Tcp,
        };
        let mut sp = ServicePort::new(spn.clone(), cip.parse().unwrap(), 80);
        sp.external_ips = ext.iter().map(|e| e.parse().unwrap()).collect();
        sp.node_port = *np;
        sp.created = *created;
        st.services.insert(spn.clone(), sp.into());
        st.endpoints.insert(
            spn,
            eps.iter()
                .map(|e| Endpoint::ready(e.parse().unwrap(), 8080, false))
                .collect::<Vec<_>>()
                .into(),
        );
    }
    st
}

/// The collision property of the unit tests, against the kernel for a fixed set of
/// sequences: Services sharing a ClusterIP:port, an externalIP or a NodePort are added,
/// updated and deleted (owners first, by age and by name); every sync succeeds, and the
/// kernel's table then equals a fresh full sync of the final objects (on the Fake, which the
/// test above shows agrees with the kernel).
#[test]
fn colliding_sequences_never_wedge_the_kernel_table() {
    require_root();
    const A: &[&str] = &["10.180.0.1"];
    const B: &[&str] = &["10.180.1.1", "10.180.1.2"];
    let sequences: &[&[&[Claim]]] = &[
        // a owns the shared ClusterIP by name, then goes; c arrives; b changes endpoints
        &[
            &[
                ("a", "172.30.0.1", None, None, None, A),
                ("b", "172.30.0.1", None, None, None, B),
            ],
            &[("b", "172.30.0.1", None, None, None, B)],
            &[
                ("b", "172.30.0.1", None, None, None, A),
                ("c", "172.30.0.3", None, None, None, B),
            ],
        ],
        // b is older and owns the externalIP; it goes and comes back
        &[
            &[
                ("a", "172.30.0.1", Some("5.6.7.8"), None, Some(200), A),
                ("b", "172.30.0.2", Some("5.6.7.8"), None, Some(100), B),
            ],
            &[("a", "172.30.0.1", Some("5.6.7.8"), None, Some(200), A)],
            &[
                ("a", "172.30.0.1", Some("5.6.7.8"), None, Some(200), A),
                ("b", "172.30.0.2", Some("5.6.7.8"), None, Some(100), B),
            ],
            &[],
        ],
        // three Services on one NodePort, removed in turn, then one without endpoints
        &[
            &[
                ("a", "172.30.0.1", None, Some(30001), None, A),
                ("b", "172.30.0.2", None, Some(30001), None, B),
                ("c", "172.30.0.3", None, Some(30001), None, A),
            ],
            &[
                ("b", "172.30.0.2", None, Some(30001), None, B),
                ("c", "172.30.0.3", None, Some(30001), None, A),
            ],
            &[("c", "172.30.0.3", None, Some(30001), None, &[])],
            &[
                ("c", "172.30.0.3", None, Some(30001), None, &[]),
                ("d", "172.30.0.4", None, Some(30002), None, B),
            ],
        ],
    ];
    for (i, seq) in sequences.iter().enumerate() {
        // a namespace of its own per sequence: each starts from an empty kernel
        let ns = NetNs::new(&format!("coll{i}"));
        let seq: Vec<Vec<Claim>> = seq.iter().map(|s| s.to_vec()).collect();
        ns.run(move || {
            let mut k = NftablesProxier::new(
                NetlinkNftables::open().unwrap(),
                cfg(),
                DetectLocal::ClusterCidr(vec![]),
            );
            for (step, claims) in seq.iter().enumerate() {
                k.sync(&claims_state(claims))
                    .unwrap_or_else(|e| panic!("sequence {i}, step {step}: {e}"));
            }
            // Removed chains are flushed in one sync and deleted in the next (the runner
            // syncs again at once while work is pending).
            for _ in 0..3 {
                if !kube_nlproxy::proxy::Proxier::has_pending_work(&k) {
                    break;
                }
                k.sync(&claims_state(seq.last().unwrap())).unwrap();
            }
            let mut fresh =
                NftablesProxier::new(FakeNftables::new(), cfg(), DetectLocal::ClusterCidr(vec![]));
            fresh.sync(&claims_state(seq.last().unwrap())).unwrap();
            compare_routing(
                k.nft(),
                fresh.nft(),
                &format!("sequence {i}: kernel vs a fresh sync"),
            );
        });
    }
}

/// Service ports that share a `balance-N` chain change their endpoint count through partial
/// syncs: the first user of an N brings its chain and map into the base, the last one takes
/// the map along (in the batch that flushes the chain's rule) and the chain goes in the next
/// sync. The kernel takes every batch, and agrees with the fake after each.
#[test]
fn balance_chains_come_and_go_through_partial_syncs() {
    require_root();
    const EPS: [&str; 5] = [
        "10.180.0.1",
        "10.180.0.2",
        "10.180.0.3",
        "10.180.0.4",
        "10.180.0.5",
    ];
    let claims = |web: usize, api: usize| -> ProxyState {
        claims_state(&[
            ("web", "10.96.0.10", None, None, Some(1), &EPS[..web]),
            ("api", "10.96.0.11", None, None, Some(2), &EPS[..api]),
        ])
    };
    let ns = NetNs::new("balance");
    ns.run(move || {
        let (mut k, mut f) = kernel_and_fake();
        let counts = [
            (3, 3),
            (4, 3),
            (4, 2),
            (4, 2),
            (1, 2),
            (0, 0),
            (5, 2),
            (2, 2),
        ];
        for (i, (web, api)) in counts.into_iter().enumerate() {
            let st = claims(web, api);
            let stats = k.sync(&st).unwrap();
            assert_eq!(stats.full, i == 0, "step {i}");
            f.sync(&st).unwrap();
            let what = format!("after web {web}, api {api}");
            compare(k.nft(), f.nft(), &what);
            let chains = k
                .nft()
                .list_chains(Family::Ip, names::DEFAULT_TABLE)
                .unwrap();
            for n in [web, api] {
                if n >= 2 {
                    assert!(
                        chains.contains(&names::balance_chain(n)),
                        "{what}: {chains:?}"
                    );
                }
            }
            let sets = k.nft().list_sets(Family::Ip, names::DEFAULT_TABLE).unwrap();
            for n in 2..=5 {
                assert_eq!(
                    sets.contains(&names::balance_map(n)),
                    web == n || api == n,
                    "{what}: {sets:?}"
                );
            }
        }
        // Nothing left pending: one more sync deletes the last unused chain.
        k.sync(&claims(2, 2)).unwrap();
        let chains = k
            .nft()
            .list_chains(Family::Ip, names::DEFAULT_TABLE)
            .unwrap();
        let balance: Vec<_> = chains
            .iter()
            .filter(|c| c.starts_with(names::BALANCE_PREFIX))
            .collect();
        assert_eq!(balance, ["balance-2"], "{chains:?}");
    });
}

/// Issue #36, against the kernel: a fixed sequence of API events (endpoints changed and
/// emptied, a Service deleted and added back with a NodePort, a relist of the slices after
/// a 410 in which two are gone, a Node change) through the API source's stores. The kernel,
/// programmed from the states the stores publish by patching the last one (partial syncs
/// from their lineage), lists the same after every step as the Fake programmed from the
/// states built whole from the same stores.
#[test]
fn the_kernel_programmed_from_patched_states_lists_as_from_states_built_whole() {
    use std::sync::Arc;

    use kube_nlproxy::model::NodeInfo;
    use kube_nlproxy::source::kube::{Change, Stores, Update};
    require_root();
    let ns = NetNs::new("pki");
    ns.run(|| {
        let base = big_state(30, 3);
        let node = base.node.name.clone();
        let mut stores = Stores::listed_from(&base);
        let (mut k, mut f) = kernel_and_fake();
        let mut step = |stores: &mut Stores, when: &str| {
            let mut w = Vec::new();
            let patched = Arc::new(stores.publish(&node, &mut w));
            let whole = stores.state(&node, &mut w);
            assert_eq!(*patched, whole, "{when}: the patched state");
            k.sync_shared(&patched).unwrap();
            f.sync(&whole).unwrap();
            compare(k.nft(), f.nft(), when);
        };
        step(&mut stores, "the first state");
        let ports: Vec<_> = base.services.keys().cloned().collect();
        let svc_key = |i: usize| (ports[i].namespace.clone(), ports[i].name.clone());
        let slice_key = |i: usize| {
            let p = &ports[i];
            (p.namespace.clone(), format!("{}-{}", p.name, p.port).into())
        };
        let mut eps = base.endpoints_of(&ports[3]).to_vec();
        eps[0].ip = "10.250.0.3".parse().unwrap();
        stores.set_endpoints(&ports[3], eps);
        stores.set_endpoints(&ports[7], Vec::new());
        step(&mut stores, "an endpoint moved, another port's emptied");
        stores.apply(Update::Service(Change::Delete(svc_key(11))));
        step(&mut stores, "a Service deleted");
        let mut back = (*base.services[&ports[11]]).clone();
        back.node_port = Some(30080);
        stores.apply(Update::Service(Change::Apply(
            svc_key(11),
            vec![Arc::new(back)],
        )));
        step(&mut stores, "the Service back with a NodePort");
        let kept: Vec<_> = (0..ports.len())
            .filter(|i| ![5, 20].contains(i))
            .map(|i| {
                let k = slice_key(i);
                let v = stores.slices.get(&k).expect("listed").clone();
                (k, v)
            })
            .collect();
        stores.apply(Update::Slice(Change::Init));
        for (k, v) in kept {
            stores.apply(Update::Slice(Change::InitApply(k, v)));
        }
        stores.apply(Update::Slice(Change::InitDone));
        step(&mut stores, "a relist of the slices with two gone");
        let moved = NodeInfo {
            name: node.clone(),
            addresses: vec!["192.168.9.9".parse().unwrap()],
            ..Default::default()
        };
        stores.apply(Update::Node(Change::Apply(
            ("".into(), node.as_str().into()),
            moved,
        )));
        step(&mut stores, "the Node's address changed");
        let mut eps = base.endpoints_of(&ports[20]).to_vec();
        eps.truncate(1);
        stores.set_endpoints(&ports[20], eps);
        step(&mut stores, "a slice back after the relist");
    });
}
