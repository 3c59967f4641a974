//! Decoding a manifest of 10k Services and their EndpointSlices (the realistic shape:
//! conditions and nodeName on every endpoint), each way we could (issue #18):
//! `cargo run --release --example yaml_decoders -- FILE.yaml` with alternating
//! Service/EndpointSlice documents. Times each decoder over the same documents.
use std::time::Instant;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

fn main() {
    let path = std::env::args().nth(1).expect("FILE.yaml");
    let text = std::fs::read_to_string(&path).expect("readable");
    let docs: Vec<&str> = text.split("\n---\n").collect();
    let n = docs.len();
    let run = |what: &str, f: &dyn Fn(usize, &str) -> bool| {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t0 = Instant::now();
            let ok = docs.iter().enumerate().filter(|(i, d)| f(*i, d)).count();
            assert_eq!(ok, n, "{what}: every document decodes");
            best = best.min(t0.elapsed().as_secs_f64());
        }
        println!(
            "{what}: {:.0} ms for {n} documents ({} MB)",
            best * 1e3,
            text.len() / 1_000_000
        );
    };
    run("serde_yaml: Value, then typed (today's path)", &|i, d| {
        let v: serde_yaml::Value = serde_yaml::from_str(d).unwrap();
        if i % 2 == 0 {
            serde_path_to_error::deserialize::<_, Service>(v).is_ok()
        } else {
            serde_path_to_error::deserialize::<_, EndpointSlice>(v).is_ok()
        }
    });
    run("serde_yaml: typed directly", &|i, d| {
        if i % 2 == 0 {
            serde_yaml::from_str::<Service>(d).is_ok()
        } else {
            serde_yaml::from_str::<EndpointSlice>(d).is_ok()
        }
    });
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(rename = "apiVersion")]
        _api: Option<serde_yaml::Value>,
        kind: Option<serde_yaml::Value>,
        _metadata: Option<serde_yaml::Value>,
    }
    run(
        "serde_yaml: the head (apiVersion, kind, metadata), then typed",
        &|i, d| {
            let h: Head = serde_yaml::from_str(d).unwrap();
            assert!(h.kind.is_some());
            if i % 2 == 0 {
                serde_yaml::from_str::<Service>(d).is_ok()
            } else {
                serde_yaml::from_str::<EndpointSlice>(d).is_ok()
            }
        },
    );
    run("serde-saphyr: typed directly", &|i, d| {
        if i % 2 == 0 {
            serde_saphyr::from_str::<Service>(d).is_ok()
        } else {
            serde_saphyr::from_str::<EndpointSlice>(d).is_ok()
        }
    });
    run("serde-saphyr: serde_json::Value, then typed", &|i, d| {
        let v: serde_json::Value = serde_saphyr::from_str(d).unwrap();
        if i % 2 == 0 {
            serde_json::from_value::<Service>(v).is_ok()
        } else {
            serde_json::from_value::<EndpointSlice>(v).is_ok()
        }
    });
}
