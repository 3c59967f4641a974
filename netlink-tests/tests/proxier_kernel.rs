//! A full proxier sync into the kernel, listed back and compared with the Fake that the unit
//! tests trust; then partial syncs on both, compared again. Also: a 10k-service sync goes
//! through in one batch.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::collections::BTreeMap;

use kube_nlproxy::config::DetectLocal;
use kube_nlproxy::kernel::nft::lower::{key_bytes, lower};
use kube_nlproxy::kernel::nft::netlink::NetlinkNftables;
use kube_nlproxy::kernel::nft::{FakeNftables, Family, Nftables};
use kube_nlproxy::model::convert::build_state;
use kube_nlproxy::model::ProxyState;
use kube_nlproxy::modes::nftables::NftablesProxier;
use kube_nlproxy::proxy::{names, LocalDetector, ProxierConfig};
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
            .map(|e| (key_bytes(&e.key), e.verdict.clone()))
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
    build_state(&snap, "node1").0
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

#[test]
fn kernel_and_fake_agree_through_full_and_partial_syncs() {
    require_root();
    let ns = NetNs::new("pk");
    ns.run(|| {
        let mut st = example_state();
        let mut k = NftablesProxier::new(
            NetlinkNftables::open().unwrap(),
            cfg(),
            DetectLocal::ClusterCidr(vec![]),
        );
        let mut f =
            NftablesProxier::new(FakeNftables::new(), cfg(), DetectLocal::ClusterCidr(vec![]));
        k.sync(&st).unwrap();
        f.sync(&st).unwrap();
        compare(k.nft(), f.nft(), "after the full sync");
        // Change one endpoint and drop a Service: partial syncs on both.
        let web = st
            .services
            .keys()
            .find(|s| s.name == "web")
            .unwrap()
            .clone();
        st.endpoints.get_mut(&web).unwrap()[0].ip = "10.244.1.77".parse().unwrap();
        let shop = st
            .services
            .keys()
            .find(|s| s.name == "shop")
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
    let (rules, chains, slots) = ns.run(|| {
        let st = big_state(10_000, 10);
        let mut k = NftablesProxier::new(
            NetlinkNftables::open().unwrap(),
            cfg(),
            DetectLocal::ClusterCidr(vec![]),
        );
        let stats = k.sync(&st).unwrap();
        assert!(stats.ops[&Family::Ip] > 100_000, "{:?}", stats.ops);
        let n = k.nft();
        (
            n.list_rules(Family::Ip, names::DEFAULT_TABLE)
                .unwrap()
                .len(),
            n.list_chains(Family::Ip, names::DEFAULT_TABLE)
                .unwrap()
                .len(),
            (0..names::ENDPOINT_MAPS)
                .map(|i| {
                    n.list_elements(
                        Family::Ip,
                        names::DEFAULT_TABLE,
                        &names::endpoint_map_name(i),
                    )
                    .map(|v| v.len())
                    .unwrap_or(0)
                })
                .sum::<usize>(),
        )
    });
    assert!(chains > 10_000, "{chains}");
    // Per service chain a masquerade rule and one `dnat … map @endpoints` rule; the
    // 100,000 endpoints are elements of the endpoint map.
    assert!((20_000..21_000).contains(&rules), "{rules}");
    assert_eq!(slots, 100_000);
}
