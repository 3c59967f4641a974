//! Criterion benches of the pure path: planning, diffing, encoding, model building, and the
//! conntrack decision. `cargo bench --bench pure`.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use kube_nlproxy::kernel::conntrack::Flow;
use kube_nlproxy::kernel::nft::encode::encode_transaction;
use kube_nlproxy::kernel::nft::Family;
use kube_nlproxy::model::fixtures::synthetic_state;
use kube_nlproxy::model::{Protocol, ProxyState};
use kube_nlproxy::modes::nftables::plan::{build_service, release_service_slots};
use kube_nlproxy::modes::nftables::{build_ruleset, build_ruleset_with_slots, SlotAllocator};
use kube_nlproxy::proxy::conntrack::{service_destinations, stale_flows};
use kube_nlproxy::proxy::{plan_changes, plan_transaction, Change, ProxierConfig};
use kube_nlproxy::source::convert::{
    assemble, build_state, convert_service, convert_slice, Snapshot,
};
use std::sync::Arc;

fn state(services: usize, eps: usize, proto: Protocol) -> ProxyState {
    let mut st = synthetic_state(services, eps);
    let mut out = st.clone();
    out.services.clear();
    out.endpoints.clear();
    for (i, (mut name, sp)) in std::mem::take(&mut st.services).into_iter().enumerate() {
        let e = st.endpoints.remove(&name).unwrap_or_default();
        let mut sp = std::sync::Arc::unwrap_or_clone(sp);
        name.protocol = proto;
        sp.name = name.clone();
        let idx: usize = name.name.trim_start_matches("svc-").parse().unwrap_or(i);
        sp.node_port = (idx < 2000).then_some(30000 + idx as u16);
        out.endpoints.insert(name.clone(), e);
        out.services.insert(name, sp.into());
    }
    out
}

fn snapshot(services: usize, eps: usize) -> Snapshot {
    let mut s = Snapshot::default();
    for i in 0..services {
        let svc = serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("svc-{i}"), "namespace": "bench"},
            "spec": {"clusterIP": Ipv4Addr::from(0x0a60_0000u32 + i as u32).to_string(),
                     "ports": [{"name": "p", "port": 80}]}
        });
        s.services.push(serde_json::from_value(svc).unwrap());
        let endpoints: Vec<_> = (0..eps)
            .map(|j| serde_json::json!({"addresses": [Ipv4Addr::from(0x0af4_0000u32 + (i * eps + j) as u32).to_string()], "nodeName": "node1"}))
            .collect();
        let slice = serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            // As the EndpointSlice controller writes them: with the trigger time.
            "metadata": {"name": format!("svc-{i}-abc"), "namespace": "bench", "labels": {"kubernetes.io/service-name": format!("svc-{i}")},
                         "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-12-01T17:00:00Z"}},
            "addressType": "IPv4", "ports": [{"name": "p", "port": 8080}], "endpoints": endpoints
        });
        s.endpoint_slices
            .push(serde_json::from_value(slice).unwrap());
    }
    s
}

fn benches(c: &mut Criterion) {
    let cfg = ProxierConfig::default();
    let big = state(10_000, 10, Protocol::Tcp);
    let mut g = c.benchmark_group("plan");
    g.sample_size(10);
    g.bench_function("full ruleset 10k services x 10 endpoints", |b| {
        b.iter(|| {
            let rs = build_ruleset(&big, &cfg, Family::Ip);
            plan_transaction(None, &rs, None, &[]).tx.num_ops()
        })
    });
    g.bench_function("build ruleset only 10k x 10", |b| {
        b.iter(|| build_ruleset(&big, &cfg, Family::Ip).element_count())
    });
    let mut slots = SlotAllocator::new();
    let prev = build_ruleset_with_slots(&big, &cfg, Family::Ip, &mut slots);
    g.bench_function("plan full transaction only 10k x 10", |b| {
        b.iter(|| plan_transaction(None, &prev, None, &[]).tx.num_ops())
    });
    let full = plan_transaction(None, &prev, None, &[]).tx;
    let mut changed = big.clone();
    let k = changed.endpoints.keys().nth(5000).unwrap().clone();
    std::sync::Arc::make_mut(changed.endpoints.get_mut(&k).unwrap())[3].ip =
        "10.99.99.99".parse().unwrap();
    // What the syncer does on a partial sync: detect the changed service port by comparing
    // inputs, rebuild its fragment, plan the difference.
    let node = changed.node.clone();
    g.bench_function("one endpoint change among 10k services", |b| {
        b.iter(|| {
            let changes: Vec<Change> = changed
                .services
                .iter()
                .filter(|(k, sp)| {
                    big.services.get(*k) != Some(*sp)
                        || big.endpoints.get(*k) != changed.endpoints.get(*k)
                })
                .map(|(k, sp)| {
                    release_service_slots(k, &mut slots);
                    Change {
                        name: k.clone(),
                        old: prev.services.get(k).cloned(),
                        new: Some(Arc::new(build_service(
                            &cfg,
                            &node,
                            sp,
                            &changed.endpoints[k],
                            Family::Ip,
                            &mut slots,
                        ))),
                    }
                })
                .collect();
            let ops = plan_changes(&prev, &prev.base, &changes, &[]).tx.num_ops();
            assert_eq!(
                ops, 4,
                "endpoint-map and hairpin elements: delete and add each"
            );
            ops
        })
    });
    g.bench_function("encode full 10k x 10 transaction to nfnetlink", |b| {
        b.iter(|| encode_transaction(&full, 1).bytes.len())
    });
    let snap = snapshot(10_000, 10);
    g.bench_function("model from 10k Services and 10k EndpointSlices", |b| {
        b.iter(|| {
            build_state(&snap, "node1", &Default::default())
                .0
                .services
                .len()
        })
    });
    // What the API source does per change: assemble the state from each object's
    // conversion, kept since it arrived.
    let mut w = Vec::new();
    let ports: Vec<_> = snap
        .services
        .iter()
        .flat_map(|s| convert_service(s, &Default::default(), &mut w))
        .map(std::sync::Arc::new)
        .collect();
    let slices: Vec<_> = snap
        .endpoint_slices
        .iter()
        .map(|s| convert_slice(s, "node1", &Default::default(), &mut w))
        .collect();
    let node = build_state(&snap, "node1", &Default::default()).0.node;
    g.bench_function(
        "state assembled from 10k converted Services and slices",
        |b| {
            b.iter(|| {
                assemble(node.clone(), ports.iter(), slices.iter(), vec![])
                    .services
                    .len()
            })
        },
    );
    g.finish();

    let mut g = c.benchmark_group("conntrack");
    g.sample_size(10);
    let udp = state(1_000, 10, Protocol::Udp);
    let flows: Vec<Flow> = (0..100_000u32)
        .map(|i| {
            let svc = (i % 1000) as usize;
            let ep = (i / 1000 % 10) as usize;
            // 1 in 100 answered by an address that is no endpoint: 1k stale of 100k.
            let reply = if i % 100 == 0 {
                0x0b00_0000 + i
            } else {
                0x0af4_0000 + (svc * 10 + ep) as u32
            };
            Flow {
                proto: 17,
                orig_src: Ipv4Addr::from(0x0a00_0000 + i).into(),
                orig_dst: Ipv4Addr::from(0x0a60_0000u32 + svc as u32).into(),
                orig_sport: 40000,
                orig_dport: 80,
                reply_src: Ipv4Addr::from(reply).into(),
                reply_dst: Ipv4Addr::from(0x0a00_0000 + i).into(),
                reply_sport: 8080,
                reply_dport: 40000,
                zone: 0,
                id: None,
            }
        })
        .collect();
    g.bench_function("decide stale among 100k entries (1k stale)", |b| {
        b.iter_batched(
            || (),
            |_| {
                let d = service_destinations(&udp, Family::Ip, Protocol::Udp);
                let n = stale_flows(&d, &Default::default(), &flows).len();
                assert_eq!(n, 1000);
                n
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
    let _ = BTreeMap::<u8, u8>::new();
}

criterion_group!(pure, benches);
criterion_main!(pure);
