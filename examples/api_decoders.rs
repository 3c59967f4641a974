//! Decoding the API server's watch events for EndpointSlices and Services each way the API
//! source could (issue #36: start to first sync): `cargo run --release --example api_decoders
//! -- [SLICES] [ENDPOINTS]` (default 10000 × 10, plus as many Services). The events are the
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

fn main() {
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
}
