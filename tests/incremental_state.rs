//! Issue #36: the API source's stores publish each state by patching the one before where
//! events touched it. After any sequence of events (adds, updates, deletes of Services,
//! slices, the Node and ServiceCIDRs; relists after a 410, with objects gone meanwhile or
//! kept because they could not be decoded; resyncs that publish with nothing new) every
//! published state equals the state built whole from the same stores, names every service
//! port that differs from the state before, and programs the same ruleset (nftables mode,
//! the Fake) as the whole-built states do; the sync loop's trackers that follow the states
//! by their diffs (no-local-endpoint counts, new collisions) agree with counting whole.
//! Pure: no sockets.
#![cfg(feature = "testing")]

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kube_nlproxy::kernel::nft::fake::FakeNftables;
use kube_nlproxy::kernel::nft::Family;
use kube_nlproxy::model::collisions::{collisions_of, Collision, CollisionTracker};
use kube_nlproxy::model::intern::ArcStr;
use kube_nlproxy::model::net::Cidr;
use kube_nlproxy::model::topology::{count_no_local_endpoints_of, NoLocalEndpoints};
use kube_nlproxy::model::{Endpoint, NodeInfo, Protocol, ProxyState, ServicePort, ServicePortName};
use kube_nlproxy::modes::nftables::NftablesProxier;
use kube_nlproxy::proxy::{DetectLocal, ProxierConfig, DEFAULT_TABLE};
use kube_nlproxy::source::convert::{merge_endpoints, SliceEndpoints};
use kube_nlproxy::source::kube::{Change, Stores, Update};
use proptest::prelude::*;

const NODE: &str = "node-a";
const NAMESPACES: [&str; 2] = ["a", "b"];
const SERVICES: [&str; 3] = ["s0", "s1", "s2"];
const PORT_NAMES: [&str; 3] = ["", "p", "q"];

type Key = (ArcStr, ArcStr);

fn key(ns: usize, name: &str) -> Key {
    (NAMESPACES[ns].into(), name.into())
}

fn spn(ns: usize, svc: usize, port: usize, udp: bool) -> ServicePortName {
    ServicePortName {
        namespace: NAMESPACES[ns].into(),
        name: SERVICES[svc].into(),
        port: PORT_NAMES[port].into(),
        protocol: if udp { Protocol::Udp } else { Protocol::Tcp },
    }
}

/// One Service's ports, as the stores keep them (two ports of one name may appear: the
/// later one stays).
fn service_value(ns: usize, svc: usize) -> impl Strategy<Value = Vec<Arc<ServicePort>>> {
    prop::collection::vec(
        (
            0..PORT_NAMES.len(),
            any::<bool>(),
            80u16..83,
            prop::option::of(30080u16..30082),
            1u8..4,
            prop::option::of(0i64..3),
            (any::<bool>(), any::<bool>(), prop::option::of(1u8..3)),
        ),
        0..4,
    )
    .prop_map(move |ports| {
        ports
            .into_iter()
            .map(
                |(port, udp, number, node_port, ip, created, (local, itp, external))| {
                    let ip: IpAddr = format!("10.96.0.{}", ip + 10 * svc as u8)
                        .parse()
                        .expect("an address");
                    let mut sp = ServicePort::new(spn(ns, svc, port, udp), ip, number);
                    sp.node_port = node_port;
                    sp.created = created;
                    sp.external_policy_local = local && node_port.is_some();
                    sp.health_check_node_port = sp.external_policy_local.then_some(32000);
                    sp.internal_policy_local = itp;
                    // Shared by every Service: two claiming one is a collision.
                    sp.external_ips = external
                        .map(|i| format!("203.0.113.{i}").parse().expect("an address"))
                        .into_iter()
                        .collect();
                    Arc::new(sp)
                },
            )
            .collect()
    })
}

fn endpoints() -> impl Strategy<Value = Vec<Endpoint>> {
    prop::collection::vec((1u8..5, any::<bool>(), any::<bool>()), 0..4).prop_map(|eps| {
        let all: Vec<Endpoint> = eps
            .into_iter()
            .map(|(i, local, ready)| {
                let mut e = Endpoint::ready(
                    format!("10.1.0.{i}").parse().expect("an address"),
                    8080,
                    local,
                );
                e.ready = ready;
                e.serving = ready;
                e
            })
            .collect();
        merge_endpoints(all.iter())
    })
}

/// One slice of namespace `ns`: its Service (or none: no label), trigger time, and ports.
fn slice_value(ns: usize) -> impl Strategy<Value = SliceEndpoints> {
    (
        prop::option::of(0..SERVICES.len()),
        prop::option::of(0u64..3),
        prop::collection::vec((0..PORT_NAMES.len(), any::<bool>(), endpoints()), 0..3),
    )
        .prop_map(move |(svc, trigger, ports)| {
            let Some(svc) = svc else {
                return SliceEndpoints::default();
            };
            SliceEndpoints {
                service: Some(key(ns, SERVICES[svc])),
                trigger_time: trigger.map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s)),
                ports: ports
                    .into_iter()
                    .map(|(port, udp, eps)| (spn(ns, svc, port, udp), Arc::new(eps)))
                    .collect(),
            }
        })
}

fn node_value() -> impl Strategy<Value = NodeInfo> {
    (any::<bool>(), prop::option::of(0u8..2)).prop_map(|(ours, zone)| NodeInfo {
        name: if ours { NODE } else { "node-b" }.into(),
        labels: zone
            .map(|z| {
                [("topology.kubernetes.io/zone".to_string(), format!("z{z}"))]
                    .into_iter()
                    .collect()
            })
            .unwrap_or_default(),
        addresses: vec!["192.168.0.1".parse().expect("an address")],
        ..Default::default()
    })
}

fn cidrs_value() -> impl Strategy<Value = Vec<Cidr>> {
    prop::collection::vec(
        prop::sample::select(vec!["10.96.0.0/16", "10.96.0.0/24", "fd00::/108"]),
        0..3,
    )
    .prop_map(|v| v.into_iter().map(|c| c.parse().expect("a CIDR")).collect())
}

/// What one step of a sequence does.
#[derive(Debug, Clone)]
enum Step {
    Service(Key, Option<Vec<Arc<ServicePort>>>),
    Slice(Key, Option<SliceEndpoints>),
    Node(Option<NodeInfo>),
    Cidrs(Key, Option<Vec<Cidr>>),
    /// A relist of one kind after a 410: these objects (slices: (name, value or None for
    /// one that could not be decoded, kept as it was)); whatever is not listed was deleted.
    RelistServices(Vec<(Key, Vec<Arc<ServicePort>>)>),
    RelistSlices(Vec<(Key, Option<SliceEndpoints>)>),
    /// A state is published (a resync publishes with nothing new).
    Publish,
}

fn a_service() -> impl Strategy<Value = (Key, Vec<Arc<ServicePort>>)> {
    (0..NAMESPACES.len(), 0..SERVICES.len())
        .prop_flat_map(|(ns, svc)| (Just(key(ns, SERVICES[svc])), service_value(ns, svc)))
}

fn a_slice() -> impl Strategy<Value = (Key, SliceEndpoints)> {
    (0..NAMESPACES.len(), 0u8..4)
        .prop_flat_map(|(ns, i)| (Just(key(ns, &format!("sl{i}"))), slice_value(ns)))
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (a_service(), any::<bool>()).prop_map(|((k, v), del)| Step::Service(k, (!del).then_some(v))),
        6 => (a_slice(), prop::bool::weighted(0.2)).prop_map(|((k, v), del)| Step::Slice(k, (!del).then_some(v))),
        1 => prop::option::weighted(0.8, node_value()).prop_map(Step::Node),
        1 => (0u8..2, prop::option::of(cidrs_value())).prop_map(|(i, v)| Step::Cidrs(("default".into(), format!("c{i}").into()), v)),
        1 => prop::collection::vec(a_service(), 0..4).prop_map(Step::RelistServices),
        1 => prop::collection::vec((a_slice(), prop::bool::weighted(0.2)), 0..5)
            .prop_map(|v| Step::RelistSlices(v.into_iter().map(|((k, s), keep)| (k, (!keep).then_some(s))).collect())),
        5 => Just(Step::Publish),
    ]
}

/// Stores after every kind's first list, empty.
fn listed() -> Stores {
    let mut s = Stores::default();
    for u in [
        Update::Service(Change::Init),
        Update::Service(Change::InitDone),
        Update::Slice(Change::Init),
        Update::Slice(Change::InitDone),
        Update::Node(Change::Init),
        Update::Node(Change::InitDone),
        Update::ServiceCidr(Change::Init),
        Update::ServiceCidr(Change::InitDone),
    ] {
        s.apply(u);
    }
    s
}

fn apply(s: &mut Stores, step: Step) {
    let node_key: Key = ("default".into(), NODE.into());
    match step {
        Step::Service(k, Some(v)) => s.apply(Update::Service(Change::Apply(k, v))),
        Step::Service(k, None) => s.apply(Update::Service(Change::Delete(k))),
        Step::Slice(k, Some(v)) => s.apply(Update::Slice(Change::Apply(k, v))),
        Step::Slice(k, None) => s.apply(Update::Slice(Change::Delete(k))),
        Step::Node(Some(v)) => s.apply(Update::Node(Change::Apply(node_key, v))),
        Step::Node(None) => s.apply(Update::Node(Change::Delete(node_key))),
        Step::Cidrs(k, Some(v)) => s.apply(Update::ServiceCidr(Change::Apply(k, v))),
        Step::Cidrs(k, None) => s.apply(Update::ServiceCidr(Change::Delete(k))),
        Step::RelistServices(objects) => {
            s.apply(Update::Service(Change::Init));
            for (k, v) in objects {
                s.apply(Update::Service(Change::InitApply(k, v)));
            }
            s.apply(Update::Service(Change::InitDone))
        }
        Step::RelistSlices(objects) => {
            s.apply(Update::Slice(Change::Init));
            for (k, v) in objects {
                s.apply(Update::Slice(match v {
                    Some(v) => Change::InitApply(k, v),
                    None => Change::InitKeep(k),
                }));
            }
            s.apply(Update::Slice(Change::InitDone))
        }
        Step::Publish => false,
    };
}

/// The service ports on which two states differ (Service or endpoints).
fn differing(a: &ProxyState, b: &ProxyState) -> BTreeSet<ServicePortName> {
    let keys: BTreeSet<&ServicePortName> = a
        .services
        .keys()
        .chain(b.services.keys())
        .chain(a.endpoints.keys())
        .chain(b.endpoints.keys())
        .collect();
    keys.into_iter()
        .filter(|k| {
            a.services.get(*k) != b.services.get(*k) || a.endpoints.get(*k) != b.endpoints.get(*k)
        })
        .cloned()
        .collect()
}

fn proxier() -> NftablesProxier<FakeNftables> {
    NftablesProxier::new(
        FakeNftables::new(),
        ProxierConfig::default(),
        DetectLocal::ClusterCidr(vec![]),
    )
}

fn tables(p: &mut NftablesProxier<FakeNftables>) -> [String; 2] {
    [Family::Ip, Family::Ip6].map(|f| p.nft().dump(f, DEFAULT_TABLE))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn every_published_state_equals_the_state_built_whole(steps in prop::collection::vec(step(), 1..40)) {
        let mut stores = listed();
        let mut w = Vec::new();
        let mut prev = Arc::new(stores.publish(NODE, &mut w));
        // One proxier fed the published states (partial syncs from their lineage), one fed
        // the states built whole (each a fresh allocation that names nothing).
        let (mut incremental, mut whole) = (proxier(), proxier());
        // The sync loop's trackers, fed the published states.
        let mut no_local = NoLocalEndpoints::default();
        let mut collisions = CollisionTracker::default();
        no_local.update(&prev);
        collisions.new_in(&prev);
        let mut prev_built = stores.state(NODE, &mut w);
        incremental.sync_shared(&prev).expect("first sync");
        whole.sync(&stores.state(NODE, &mut w)).expect("first sync");
        for step in steps.into_iter().chain([Step::Publish]) {
            let publish = matches!(step, Step::Publish);
            apply(&mut stores, step);
            if !publish {
                continue;
            }
            let next = Arc::new(stores.publish(NODE, &mut w));
            let built = stores.state(NODE, &mut w);
            prop_assert_eq!(&*next, &built);
            if let Some(named) = next.changes_since(&prev) {
                let missing: Vec<_> = differing(&prev, &next).difference(named).cloned().collect();
                prop_assert!(missing.is_empty(), "changed but not named: {:?}", missing);
                prop_assert_eq!(&prev.node, &next.node, "a Node change names nothing");
                prop_assert_eq!(&prev.service_cidrs, &next.service_cidrs);
            }
            prop_assert_eq!(
                no_local.update(&next),
                [Family::Ip, Family::Ip6].map(|f| count_no_local_endpoints_of(&built, f))
            );
            let appeared: BTreeSet<Collision> = collisions.new_in(&next).into_iter().collect();
            let before: BTreeSet<Collision> = collisions_of(&prev_built).into_iter().collect();
            let want: BTreeSet<Collision> = collisions_of(&built).into_iter().filter(|c| !before.contains(c)).collect();
            prop_assert_eq!(appeared, want);
            prev_built = built.clone();
            incremental.sync_shared(&next).expect("sync");
            whole.sync(&built).expect("sync");
            prop_assert_eq!(tables(&mut incremental), tables(&mut whole));
            prev = next;
        }
    }
}
