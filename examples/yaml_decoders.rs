//! Decoding a manifest of realistic Services and EndpointSlices (conditions and nodeName on
//! every endpoint, alternating Service/EndpointSlice documents) each way we could (issues #18
//! and #37): `cargo run --release --example yaml_decoders -- FILE.yaml`. The time is the best
//! of 3 over every document; the peak is the growth of the resident set's high-water mark
//! over the text already read (reset before each decoder through `/proc/self/clear_refs`),
//! keeping every decoded object as the manifest source does.
use std::time::Instant;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// A decoder: whether document `i` (even: a Service, odd: a slice) decoded, the object kept.
type Decoder = fn(usize, &str, &mut Vec<Kept>) -> bool;

#[allow(dead_code)] // kept for their memory, never read
enum Kept {
    Service(Box<Service>),
    Slice(Box<EndpointSlice>),
}

fn keep<S, E>(
    i: usize,
    s: Result<Service, S>,
    e: Result<EndpointSlice, E>,
    v: &mut Vec<Kept>,
) -> bool {
    let kept = if i.is_multiple_of(2) {
        s.ok().map(|o| Kept::Service(Box::new(o)))
    } else {
        e.ok().map(|o| Kept::Slice(Box::new(o)))
    };
    kept.map(|k| v.push(k)).is_some()
}

fn typed<T: serde::de::DeserializeOwned>(d: &str) -> Result<T, ()> {
    kube_nlproxy::source::yaml::from_str(d).map_err(|_| ())
}

const DECODERS: [(&str, Decoder); 3] = [
    ("serde-saphyr 2.2 with our limits, typed directly (the manifest source)", |i, d, v| {
        if i % 2 == 0 {
            keep(i, typed::<Service>(d), Err(()), v)
        } else {
            keep(i, Err(()), typed::<EndpointSlice>(d), v)
        }
    }),
    ("serde-saphyr 2.2 defaults, typed directly", |i, d, v| {
        if i % 2 == 0 {
            keep(i, serde_saphyr::from_str::<Service>(d), Err(()), v)
        } else {
            keep(i, Err(()), serde_saphyr::from_str::<EndpointSlice>(d), v)
        }
    }),
    ("serde-saphyr 2.2 with our limits, a JSON value tree, then typed (the fallback that names fields)", |i, d, v| {
        let t: serde_json::Value = kube_nlproxy::source::yaml::from_str(d).unwrap();
        if i % 2 == 0 {
            keep(i, serde_json::from_value::<Service>(t), Err(()), v)
        } else {
            keep(i, Err(()), serde_json::from_value::<EndpointSlice>(t), v)
        }
    }),
];

/// VmRSS and VmHWM of this process, KiB.
fn rss_and_peak() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn main() {
    let path = std::env::args().nth(1).expect("FILE.yaml");
    let text = std::fs::read_to_string(&path).expect("readable");
    let docs: Vec<&str> = text
        .split("\n---\n")
        .filter(|d| !d.trim().is_empty())
        .collect();
    let n = docs.len();
    println!("| decoder | documents | size | time | peak |\n| --- | --- | --- | --- | --- |");
    for (which, decode) in DECODERS {
        // Writing 5 resets VmHWM to the current resident set (proc(5)).
        std::fs::write("/proc/self/clear_refs", "5").expect("reset the high-water mark");
        let (base, _) = rss_and_peak();
        let mut best = f64::MAX;
        for _ in 0..3 {
            let mut kept = Vec::with_capacity(n);
            let t0 = Instant::now();
            let ok = docs
                .iter()
                .enumerate()
                .filter(|(i, d)| decode(*i, d.trim_start_matches("---\n"), &mut kept))
                .count();
            best = best.min(t0.elapsed().as_secs_f64());
            assert_eq!(ok, n, "{which}: every document decodes");
        }
        let (_, peak) = rss_and_peak();
        println!(
            "| {which} | {n} | {:.0} MB | {:.2} s | +{} MiB |",
            text.len() as f64 / 1e6,
            best,
            peak.saturating_sub(base) / 1024
        );
    }
}
