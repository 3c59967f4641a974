//! Decoding the API server's watch events for EndpointSlices and Services each way the API
//! source could (issue #36: start to first sync): `cargo run --release --example api_decoders
//! --features testing -- [SLICES] [ENDPOINTS]` (default 10000 × 10, plus as many Services), or `-- DIR` for the
//! real API server's watch events that `kernel-bench --fleet-only` kept there
//! (`KBENCH_FLEET_EVENTS=DIR`), JSON against protobuf. The events are the
//! lines a streaming list sends (`{"type":"ADDED","object":{…}}`), with what the API server
//! writes in each object (managedFields, conditions, nodeName, zone, targetRef, hints). The
//! time is the best of 3 over every line.
use std::time::Instant;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DynamicObject, WatchEvent};
use kube_nlproxy::source::kube::Lenient;
use serde::de::DeserializeOwned;

/// A watch event's line as the API server writes it: `type` first (apimachinery's
/// `WatchEvent` struct in field order; `json!` would sort the keys).
fn event(object: serde_json::Value) -> String {
    format!(r#"{{"type":"ADDED","object":{object}}}"#)
}

fn slice(i: usize, endpoints: usize) -> String {
    let eps: Vec<_> = (0..endpoints)
        .map(|j| {
            serde_json::json!({
                "addresses": [format!("10.{}.{}.{}", (i >> 8) & 255, i & 255, j + 1)],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": format!("node-{}", j % 50),
                "zone": "zone-a",
                "targetRef": {"kind": "Pod", "namespace": "bench", "name": format!("web-{i}-{j}"),
                              "uid": "2f1c8a56-0d4e-4c61-9a0e-5c2b1f7d8e90"},
                "hints": {"forZones": [{"name": "zone-a"}]}
            })
        })
        .collect();
    event(serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "name": format!("svc-{i}-abcde"), "namespace": "bench",
            "uid": "7d1c8a56-0d4e-4c61-9a0e-5c2b1f7d8e90", "resourceVersion": format!("{}", 1000 + i),
            "generation": 1, "creationTimestamp": "2026-12-05T10:00:00Z",
            "labels": {"kubernetes.io/service-name": format!("svc-{i}"),
                       "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": format!("svc-{i}"),
                                 "uid": "8e1c8a56-0d4e-4c61-9a0e-5c2b1f7d8e90", "controller": true,
                                 "blockOwnerDeletion": true}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                               "apiVersion": "discovery.k8s.io/v1", "time": "2026-12-05T10:00:00Z",
                               "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:addressType": {}, "f:endpoints": {}, "f:ports": {}}}]
        },
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
    }))
}

/// The same slice as [`slice`]'s, as the API server writes it in protobuf: one watch
/// frame's event (its 4-byte length left off, as `decode::watch_event` takes it).
fn pb_slice(i: usize, endpoints: usize) -> Vec<u8> {
    use k8s_pb::api::core::v1 as core;
    use k8s_pb::api::discovery::v1 as d;
    use k8s_pb::apimachinery::pkg::apis::meta::v1 as m;
    use prost::Message;
    let s = |v: String| Some(v);
    let time = Some(m::Time {
        seconds: Some(1_796_464_800),
        nanos: Some(0),
    });
    let eps = (0..endpoints)
        .map(|j| d::Endpoint {
            addresses: vec![format!("10.{}.{}.{}", (i >> 8) & 255, i & 255, j + 1)],
            conditions: Some(d::EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            node_name: s(format!("node-{}", j % 50)),
            zone: s("zone-a".into()),
            target_ref: Some(core::ObjectReference {
                kind: s("Pod".into()),
                namespace: s("bench".into()),
                name: s(format!("web-{i}-{j}")),
                uid: s("2f1c8a56-0d4e-4c61-9a0e-5c2b1f7d8e90".into()),
                ..Default::default()
            }),
            hints: Some(d::EndpointHints {
                for_zones: vec![d::ForZone {
                    name: s("zone-a".into()),
                }],
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    let object = d::EndpointSlice {
        metadata: Some(m::ObjectMeta {
            name: s(format!("svc-{i}-abcde")),
            namespace: s("bench".into()),
            uid: s("7d1c8a56-0d4e-4c61-9a0e-5c2b1f7d8e90".into()),
            resource_version: s(format!("{}", 1000 + i)),
            generation: Some(1),
            creation_timestamp: time,
            labels: [
                ("kubernetes.io/service-name".to_string(), format!("svc-{i}")),
                (
                    "endpointslice.kubernetes.io/managed-by".to_string(),
                    "endpointslice-controller.k8s.io".to_string(),
                ),
            ]
            .into(),
            owner_references: vec![m::OwnerReference {
                api_version: s("v1".into()),
                kind: s("Service".into()),
                name: s(format!("svc-{i}")),
                uid: s("8e1c8a56-0d4e-4c61-9a0e-5c2b1f7d8e90".into()),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }],
            managed_fields: vec![m::ManagedFieldsEntry {
                manager: s("kube-controller-manager".into()),
                operation: s("Update".into()),
                api_version: s("discovery.k8s.io/v1".into()),
                time,
                fields_type: s("FieldsV1".into()),
                fields_v1: Some(m::FieldsV1 {
                    raw: Some(br#"{"f:addressType":{},"f:endpoints":{},"f:ports":{}}"#.to_vec()),
                }),
                subresource: None,
            }],
            ..Default::default()
        }),
        address_type: s("IPv4".into()),
        endpoints: eps,
        ports: vec![d::EndpointPort {
            name: s("http".into()),
            port: Some(8080),
            protocol: s("TCP".into()),
            app_protocol: None,
        }],
    };
    kube_nlproxy::source::kube::protobuf::wire::fixtures::event(
        "ADDED",
        "EndpointSlice",
        object.encode_to_vec(),
    )
}

fn service(i: usize) -> String {
    event(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{i}"), "namespace": "bench",
                     "uid": "9f1c8a56-0d4e-4c61-9a0e-5c2b1f7d8e90", "resourceVersion": format!("{}", 500 + i),
                     "creationTimestamp": "2026-12-05T10:00:00Z"},
        "spec": {"type": "ClusterIP", "clusterIP": format!("10.96.{}.{}", (i >> 8) & 255, i & 255),
                 "clusterIPs": [format!("10.96.{}.{}", (i >> 8) & 255, i & 255)],
                 "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                 "internalTrafficPolicy": "Cluster", "sessionAffinity": "None",
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
                 "selector": {"app": format!("web-{i}")}},
        "status": {"loadBalancer": {}}
    }))
}

/// Decodes every line as `K` one way; how many decoded.
type Decoder = fn(&[String]) -> usize;

fn dynamic_then_try_parse<K: DeserializeOwned + kube::Resource>(lines: &[String]) -> usize {
    lines
        .iter()
        .filter_map(
            |l| match serde_json::from_str::<WatchEvent<DynamicObject>>(l) {
                Ok(WatchEvent::Added(o)) => o.try_parse::<K>().ok(),
                _ => None,
            },
        )
        .count()
}

fn value_then_typed<K: DeserializeOwned>(lines: &[String]) -> usize {
    lines
        .iter()
        .filter_map(
            |l| match serde_json::from_str::<WatchEvent<serde_json::Value>>(l) {
                Ok(WatchEvent::Added(v)) => K::deserialize(&v).ok(),
                _ => None,
            },
        )
        .count()
}

fn lenient<K: DeserializeOwned>(lines: &[String]) -> usize {
    lines
        .iter()
        .filter_map(
            |l| match serde_json::from_str::<WatchEvent<Lenient<K>>>(l) {
                Ok(WatchEvent::Added(o)) => o.decoded().ok(),
                _ => None,
            },
        )
        .count()
}

fn typed<K: DeserializeOwned>(lines: &[String]) -> usize {
    lines
        .iter()
        .filter(|l| {
            matches!(
                serde_json::from_str::<WatchEvent<K>>(l),
                Ok(WatchEvent::Added(_))
            )
        })
        .count()
}

const BEFORE: &str = "DynamicObject, then try_parse (before)";
const VALUE: &str = "serde_json::Value, then typed from it";
const LENIENT: &str = "Lenient: the raw text, then typed (the API source)";
const TYPED: &str = "typed directly (the floor; one bad object fails its list)";

/// Each way of decoding `K`, in the table's order.
fn ways<K: DeserializeOwned + kube::Resource>() -> [(&'static str, Decoder); 4] {
    [
        (BEFORE, dynamic_then_try_parse::<K>),
        (VALUE, value_then_typed::<K>),
        (LENIENT, lenient::<K>),
        (TYPED, typed::<K>),
    ]
}

fn measure(what: &str, lines: &[String], decoders: [(&str, Decoder); 4]) {
    let bytes: usize = lines.iter().map(String::len).sum();
    for (how, decode) in decoders {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t0 = Instant::now();
            let n = decode(lines);
            best = best.min(t0.elapsed().as_secs_f64());
            assert_eq!(n, lines.len(), "{how}: every line decodes");
        }
        println!(
            "| {what} | {how} | {} | {:.1} MB | {:.0} ms |",
            lines.len(),
            bytes as f64 / 1e6,
            best * 1e3
        );
    }
}

/// The watch bodies `kernel-bench --fleet-only` kept (`KBENCH_FLEET_EVENTS=DIR`): the real
/// API server's events, decoded by both of the API source's decoders, each event 200 times.
fn measure_kept_events(dir: &std::path::Path) {
    use kube_nlproxy::source::kube::protobuf::{decode, wire};
    let json = std::fs::read(dir.join("events.json")).expect("events.json");
    let pb = std::fs::read(dir.join("events.pb")).expect("events.pb");
    let lines: Vec<String> = String::from_utf8(json)
        .expect("JSON")
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    let mut frames = wire::Frames::default();
    frames.push(&pb);
    let mut pb_frames = Vec::new();
    while let Some(f) = frames.next_frame().expect("frames") {
        pb_frames.push(f.to_vec());
    }
    let rounds = 200;
    let time = |f: &dyn Fn() -> usize| {
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t0 = Instant::now();
            let n: usize = (0..rounds).map(|_| f()).sum();
            best = best.min(t0.elapsed().as_secs_f64());
            assert_eq!(n, rounds * lines.len(), "every event decodes");
        }
        best * 1e6 / (rounds * lines.len()) as f64
    };
    let j = time(&|| {
        lines
            .iter()
            .filter(|l| {
                matches!(
                    serde_json::from_str::<WatchEvent<Lenient<EndpointSlice>>>(l),
                    Ok(WatchEvent::Modified(Lenient::Decoded(_)))
                )
            })
            .count()
    });
    let p = time(&|| {
        pb_frames
            .iter()
            .filter(|f| {
                matches!(
                    decode::watch_event::<EndpointSlice>(f),
                    Ok(decode::WatchEvent::Modified(Lenient::Decoded(_)))
                )
            })
            .count()
    });
    println!(
        "{} events: JSON {j:.2} µs, protobuf {p:.2} µs per event ({:.2}×)",
        lines.len(),
        p / j
    );
}

fn main() {
    if let Some(dir) = std::env::args()
        .nth(1)
        .filter(|a| std::path::Path::new(a).is_dir())
    {
        return measure_kept_events(std::path::Path::new(&dir));
    }
    let arg = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .map_or(default, |a| a.parse().expect("a number"))
    };
    let (slices, endpoints) = (arg(1, 10_000), arg(2, 10));
    let slice_lines: Vec<String> = (0..slices).map(|i| slice(i, endpoints)).collect();
    let service_lines: Vec<String> = (0..slices).map(service).collect();
    println!("| kind | decoder | events | size | time |\n| --- | --- | --- | --- | --- |");
    measure("EndpointSlice", &slice_lines, ways::<EndpointSlice>());
    measure("Service", &service_lines, ways::<Service>());
    let frames: Vec<Vec<u8>> = (0..slices).map(|i| pb_slice(i, endpoints)).collect();
    measure_protobuf("EndpointSlice", &frames);
}

/// Our protobuf decoder (`decode::watch_event`, the API source's) over every frame.
fn measure_protobuf(what: &str, frames: &[Vec<u8>]) {
    use kube_nlproxy::source::kube::protobuf::decode;
    let bytes: usize = frames.iter().map(Vec::len).sum();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        let n = frames
            .iter()
            .filter(|f| {
                matches!(
                    decode::watch_event::<EndpointSlice>(f),
                    Ok(decode::WatchEvent::Added(Lenient::Decoded(_)))
                )
            })
            .count();
        best = best.min(t0.elapsed().as_secs_f64());
        assert_eq!(n, frames.len(), "protobuf: every frame decodes");
    }
    println!(
        "| {what} | protobuf: decode::watch_event (the API source) | {} | {:.1} MB | {:.0} ms |",
        frames.len(),
        bytes as f64 / 1e6,
        best * 1e3
    );
}
