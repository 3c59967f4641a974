//! `--fleet-only [NxE]` (issue #54): what the proxies' watches cost the API server, JSON
//! against protobuf, on the real kube-apiserver and etcd with `shape` loaded.
//! - Bytes of a full list of EndpointSlices and of Services, and our decode CPU per object.
//! - Bytes per watch event (EndpointSlice changes) and our decode CPU per event.
//! - The API server's CPU per event per watcher with N watches of upstream kube-proxy's
//!   request (its selector, bookmarks, one watch per node) in each encoding, under
//!   [`RATE`] endpoint changes a second: N nodes' watches, many per process here, not N
//!   daemons.
//!
//! Upstream kube-proxy's informers ask for protobuf with the same selector; ours now does
//! too, so its bytes per event are upstream's by construction, and the JSON column is what
//! ours asked for before.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams};
use kube_nlproxy::source::kube::protobuf::{decode, wire};
use kube_nlproxy::source::kube::Lenient;
use netlink_tests::cluster::Cluster;
use netlink_tests::controlplane::ControlPlane;

use crate::args::Shape;
use crate::harness::stop;
use crate::side_by_side::{bench_slice, create_workload, first_sync, spawn_ours, start_upstream};
use crate::table::{Goal, Row, Table, Target, Unit};

/// The bound on each admin session here: opening 1,000 watches, 10 s of changes and their
/// delivery take more than the usual 60 s on 2 cores.
const SESSION: Duration = Duration::from_secs(300);

/// Endpoint changes a second during the watch rows, as the churn row's.
const RATE: u64 = 100;
const JSON: &str = "application/json";

/// The goal: our decode CPU per event in protobuf at most half of JSON's.
const DECODE_RATIO: f64 = 0.5;

pub fn fleet_rows(table: &mut Table, shape: Shape, watchers: &[usize]) {
    let a = Cluster::new();
    let cp = ControlPlane::start(&a.node);
    create_workload(&cp, &a.node, shape);
    let label = shape.label();
    eprintln!("fleet: {label} created; full lists");
    let lists = cp.with_admin_within(&a.node, SESSION, |client| {
        Box::pin(async move { list_rows(&client).await })
    });
    for l in &lists {
        table.push(
            Row::new(
                format!(
                    "full list of {} ({label}, upstream's selector): bytes JSON / protobuf; our decode per object JSON / protobuf",
                    l.what
                ),
                format!(
                    "{} / {} ({:.2}×); {:.1} / {:.1} µs ({:.2}×)",
                    mb(l.bytes[0]),
                    mb(l.bytes[1]),
                    l.bytes[1] as f64 / l.bytes[0] as f64,
                    l.decode_us[0],
                    l.decode_us[1],
                    l.decode_us[1] / l.decode_us[0],
                ),
            )
            .target(Target::Note("")),
        );
    }
    eprintln!("fleet: watch events");
    let ev = cp.with_admin_within(&a.node, SESSION, move |client| {
        Box::pin(async move { event_row(&client, shape).await })
    });
    table.push(
        Row::new(
            format!(
                "one EndpointSlice change ({} endpoints) as a watch event: bytes JSON / protobuf; our decode per event JSON / protobuf (of {} events each)",
                shape.endpoints, ev.events
            ),
            format!(
                "{:.0} / {:.0} B ({:.2}×); {:.1} / {:.1} µs",
                ev.bytes[0],
                ev.bytes[1],
                ev.bytes[1] / ev.bytes[0],
                ev.decode_us[0],
                ev.decode_us[1],
            ),
        )
        .ratio(format!("decode {:.2}× JSON's", ev.decode_us[1] / ev.decode_us[0]))
        .target(Target::goal(
            Goal::at_most(ev.decode_us[1] / ev.decode_us[0], DECODE_RATIO, Unit::Times)
                .named("decode"),
        )),
    );
    daemon_bytes_row(table, &a, &cp, shape);
    let pid = cp.apiserver_pid();
    // The changes alone, without watches: the API server's CPU for the writes, taken off
    // every row's so that what remains is what the watchers cost.
    let base = cp.with_admin_within(&a.node, SESSION, move |client| {
        Box::pin(async move { watchers_window(&client, pid, 0, JSON, shape, 0).await })
    });
    eprintln!(
        "fleet: the changes alone: API server CPU {:.2} s",
        base.cpu_secs
    );
    let mut next_service = (RATE * WINDOW_SECS) as usize;
    for &n in watchers {
        let mut per = [0.0f64; 2];
        let mut delivered = [0u64; 2];
        let mut egress = [0u64; 2];
        for (k, accept) in [JSON, wire::PROTOBUF].into_iter().enumerate() {
            let first = next_service;
            next_service += (RATE * WINDOW_SECS) as usize;
            let r = cp.with_admin_within(&a.node, SESSION, move |client| {
                Box::pin(
                    async move { watchers_window(&client, pid, n, accept, shape, first).await },
                )
            });
            per[k] = (r.cpu_secs - base.cpu_secs).max(0.0) / r.events.max(1) as f64 * 1e6;
            delivered[k] = r.events;
            egress[k] = r.bytes;
            eprintln!(
                "fleet: {n} watchers, {accept}: {} events delivered, {} bytes, API server CPU {:.2} s",
                r.events, r.bytes, r.cpu_secs
            );
        }
        table.push(
            Row::new(
                format!(
                    "API server with {n} watches of EndpointSlices as upstream kube-proxy's ({RATE} changes/s for {WINDOW_SECS} s, {label}): its CPU per event per watcher JSON / protobuf (less its CPU for the same changes without watches, {:.2} s); events delivered; bytes sent",
                    base.cpu_secs
                ),
                format!(
                    "{:.1} / {:.1} µs ({:.2}×); {} / {}; {} / {}",
                    per[0],
                    per[1],
                    per[1] / per[0],
                    delivered[0],
                    delivered[1],
                    mb(egress[0]),
                    mb(egress[1]),
                ),
            )
            .ratio(format!("{:.2}× JSON's CPU", per[1] / per[0]))
            .target(Target::Note(
                "protobuf is the request upstream kube-proxy makes: ours ≡ upstream by construction",
            )),
        );
    }
}

/// Changes per proxy in the daemons' row.
const DAEMON_CHANGES: usize = 100;

/// Upstream kube-proxy v1.37.2 (nftables mode) and ours as daemons, each alone against the
/// API server after its first sync: the bytes of one EndpointSlice change as the API server
/// counts what it wrote to that proxy's watch (`apiserver_watch_events_sizes` for
/// endpointslices, which nothing else here watches by then).
fn daemon_bytes_row(table: &mut Table, a: &Cluster, cp: &ControlPlane, shape: Shape) {
    // Slices past the event row's, so that each change is one of its own.
    let first = shape.services / 2 + 100;
    // The bytes and events sent to every EndpointSlice watch during DAEMON_CHANGES changes.
    let measure = |first: usize| {
        cp.with_admin_within(&a.node, SESSION, move |client| {
            Box::pin(async move {
                let before = watch_event_sizes(&client).await;
                changes(&client, shape, first, DAEMON_CHANGES).await;
                tokio::time::sleep(Duration::from_secs(3)).await;
                let after = watch_event_sizes(&client).await;
                (after.0 - before.0, after.1 - before.1)
            })
        })
    };
    // Without either proxy: what other watches there are (none expected) are taken off.
    let base = measure(first);
    let per_event = |(bytes, events): (f64, f64)| {
        eprintln!(
            "fleet: {events} watch events of EndpointSlices sent, {base:?} without the proxy"
        );
        (events > base.1).then(|| (bytes - base.0) / (events - base.1))
    };
    let (synced, running) = start_upstream(a, cp, 1, "nftables", shape);
    let upstream = synced.and_then(|_| per_event(measure(first + DAEMON_CHANGES)));
    drop(running);
    let admin = cp.admin_kubeconfig();
    let mut ours = spawn_ours(&a.node, &["--kubeconfig", admin.to_str().unwrap()], &cp.dir);
    let ours_bytes = first_sync(&a.node, ours.id(), "ours")
        .and_then(|_| per_event(measure(first + 2 * DAEMON_CHANGES)));
    stop(&mut ours, "our daemon");
    let (Some(up), Some(our)) = (upstream, ours_bytes) else {
        eprintln!("fleet: a daemon did not sync (upstream {upstream:?}, ours {ours_bytes:?})");
        return;
    };
    table.push(
        Row::new(
            format!(
                "one EndpointSlice change ({} endpoints) as the API server counts what it wrote to each proxy's watch (apiserver_watch_events_sizes; {DAEMON_CHANGES} changes, each proxy alone after its first sync, {}): upstream kube-proxy v1.37.2 (nftables mode) / ours",
                shape.endpoints,
                shape.label()
            ),
            format!("{up:.0} / {our:.0} B"),
        )
        .ratio(format!("{:.2}× upstream's", our / up))
        .target(Target::goal(
            Goal::at_most(our / up, 1.0, Unit::Times).named("bytes"),
        )),
    );
}

/// `apiserver_watch_events_sizes`' sum and count for EndpointSlices, from the API server's
/// own metrics.
async fn watch_event_sizes(client: &kube::Client) -> (f64, f64) {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(req).await.unwrap();
    let value = |name: &str| {
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains("resource=\"endpointslices\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    (
        value("apiserver_watch_events_sizes_sum{"),
        value("apiserver_watch_events_sizes_count{"),
    )
}

fn mb(b: u64) -> String {
    format!("{:.2} MB", b as f64 / 1e6)
}

struct ListRow {
    what: &'static str,
    bytes: [u64; 2],
    decode_us: [f64; 2],
}

fn selector() -> String {
    kube_nlproxy::source::convert::ServiceSelection::default()
        .service_label_selector()
        .replace(',', "%2C")
}

/// GET `path` with `accept`: the body and the media type the server chose.
async fn get(client: &kube::Client, path: &str, accept: &str) -> (prost::bytes::Bytes, String) {
    let req = http::Request::get(path)
        .header(http::header::ACCEPT, accept)
        .body(kube::client::Body::empty())
        .unwrap();
    let res = client.send(req).await.unwrap();
    assert!(res.status().is_success(), "{path}: {}", res.status());
    let ct = res.headers()[http::header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_string();
    (res.into_body().collect().await.unwrap().to_bytes(), ct)
}

/// Two decoders of the same `items` timed in turns, 40 rounds of 20 passes each, the
/// fastest round of each, per item: one pass of 100 events takes about a millisecond, and
/// timed once each, five times (as before), they read 0.30× to 0.72× of each other from
/// run to run on a shared machine.
fn interleaved_us(items: usize, decoders: [&dyn Fn() -> usize; 2]) -> [f64; 2] {
    const ROUNDS: usize = 40;
    const PASSES: usize = 20;
    let mut best = [f64::INFINITY; 2];
    for _ in 0..ROUNDS {
        for (k, decode) in decoders.iter().enumerate() {
            let t0 = Instant::now();
            for _ in 0..PASSES {
                assert_eq!(decode(), items, "every event decoded");
            }
            let us = t0.elapsed().as_secs_f64() * 1e6 / (PASSES * items) as f64;
            best[k] = best[k].min(us);
        }
    }
    best
}

/// The fastest of 5 runs of `f`, per item.
fn per_item_us(items: usize, mut f: impl FnMut() -> usize) -> f64 {
    (0..5)
        .map(|_| {
            let t0 = Instant::now();
            let n = f();
            assert_eq!(n, items, "every object decoded");
            t0.elapsed().as_secs_f64() * 1e6 / items.max(1) as f64
        })
        .fold(f64::INFINITY, f64::min)
}

async fn list_rows(client: &kube::Client) -> Vec<ListRow> {
    let sel = selector();
    let mut rows = Vec::new();
    for (what, path) in [
        (
            "EndpointSlices",
            format!(
                "/apis/discovery.k8s.io/v1/endpointslices?labelSelector={sel}&resourceVersion=0"
            ),
        ),
        (
            "Services",
            format!("/api/v1/services?labelSelector={sel}&resourceVersion=0"),
        ),
    ] {
        let (json, ct) = get(client, &path, JSON).await;
        assert!(ct.starts_with(JSON), "{ct}");
        let (pb, ct) = get(client, &path, wire::PROTOBUF).await;
        assert_eq!(ct, wire::PROTOBUF);
        let (j, p) = if what == "Services" {
            (
                decode_json_list::<Service>(&json),
                decode_pb_list::<Service>(&pb),
            )
        } else {
            (
                decode_json_list::<EndpointSlice>(&json),
                decode_pb_list::<EndpointSlice>(&pb),
            )
        };
        rows.push(ListRow {
            what,
            bytes: [json.len() as u64, pb.len() as u64],
            decode_us: [j, p],
        });
    }
    rows
}

/// Our decode per object of a list body, by `decode` (JSON or protobuf).
fn per_object_us<K>(body: &[u8], decode: impl Fn(&[u8]) -> Vec<Lenient<K>>) -> f64 {
    let count = |b: &[u8]| {
        decode(b)
            .iter()
            .filter(|o| matches!(o, Lenient::Decoded(_)))
            .count()
    };
    let items = count(body);
    per_item_us(items, || count(body))
}

fn decode_json_list<K>(body: &[u8]) -> f64
where
    K: kube::Resource + serde::de::DeserializeOwned + Clone,
{
    per_object_us(body, |b| {
        serde_json::from_slice::<kube::core::ObjectList<Lenient<K>>>(b)
            .unwrap()
            .items
    })
}

fn decode_pb_list<K: kube_nlproxy::source::kube::protobuf::ProtobufKind>(body: &[u8]) -> f64 {
    per_object_us(body, |b| decode::list::<K>(b).unwrap().items)
}

struct EventRow {
    events: usize,
    bytes: [f64; 2],
    decode_us: [f64; 2],
}

/// A watch's raw body as it arrives, kept whole.
fn keep(
    body: kube::client::Body,
    into: Arc<std::sync::Mutex<Vec<u8>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut data = body.into_data_stream();
        while let Some(Ok(chunk)) = data.next().await {
            into.lock().unwrap().extend_from_slice(&chunk);
        }
    })
}

async fn start_watch(client: &kube::Client, accept: &str, rv: &str) -> kube::client::Body {
    let path = format!(
        "/apis/discovery.k8s.io/v1/endpointslices?watch=true&allowWatchBookmarks=true&timeoutSeconds=600&labelSelector={}&resourceVersion={rv}",
        selector()
    );
    let req = http::Request::get(path)
        .header(http::header::ACCEPT, accept)
        .header(http::header::ACCEPT_ENCODING, "identity")
        .body(kube::client::Body::empty())
        .unwrap();
    let res = client.send(req).await.unwrap();
    assert!(res.status().is_success(), "watch: {}", res.status());
    res.into_body()
}

async fn current_rv(client: &kube::Client) -> String {
    let l = Api::<EndpointSlice>::all(client.clone())
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
        .unwrap();
    l.metadata.resource_version.unwrap()
}

/// `count` changes to distinct EndpointSlices from service `first` on, [`RATE`] a second.
async fn changes(client: &kube::Client, shape: Shape, first: usize, count: usize) {
    let api = Api::<EndpointSlice>::namespaced(client.clone(), "default");
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / RATE));
    let mut tasks = Vec::new();
    for k in first..first + count {
        tick.tick().await;
        let i = k % shape.services;
        let bump = (k / shape.services).is_multiple_of(2);
        let sl = bench_slice(i, shape.endpoints, bump);
        let patch = serde_json::json!({"metadata": {"annotations": sl["metadata"]["annotations"]},
            "endpoints": sl["endpoints"]});
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            api.patch(
                &format!("svc-{i}-a"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .is_ok()
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap(), "a change the API server refused");
    }
}

async fn event_row(client: &kube::Client, shape: Shape) -> EventRow {
    const EVENTS: usize = 100;
    let rv = current_rv(client).await;
    let bodies = [JSON, wire::PROTOBUF].map(|_| Arc::new(std::sync::Mutex::new(Vec::new())));
    let mut readers = Vec::new();
    for (accept, into) in [JSON, wire::PROTOBUF].into_iter().zip(&bodies) {
        readers.push(keep(start_watch(client, accept, &rv).await, into.clone()));
    }
    // Services 1000 on: the watch rows below use 0.. in turns of RATE × WINDOW_SECS.
    changes(client, shape, shape.services / 2, EVENTS).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for r in readers {
        r.abort();
    }
    let json = bodies[0].lock().unwrap().clone();
    let pb = bodies[1].lock().unwrap().clone();
    // A diagnostic: KBENCH_FLEET_EVENTS=DIR keeps both watch bodies as they came
    // (events.json, events.pb) for `cargo run --release --example api_decoders --features testing -- DIR`.
    if let Some(dir) = std::env::var_os("KBENCH_FLEET_EVENTS") {
        let dir = std::path::Path::new(&dir);
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("events.json"), &json).unwrap();
        std::fs::write(dir.join("events.pb"), &pb).unwrap();
    }
    let lines: Vec<&[u8]> = json
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    let mut frames = wire::Frames::default();
    frames.push(&pb);
    let mut pb_frames = Vec::new();
    while let Some(f) = frames.next_frame().unwrap() {
        pb_frames.push(f.to_vec());
    }
    assert_eq!(lines.len(), EVENTS, "every change as a JSON event");
    assert_eq!(pb_frames.len(), EVENTS, "every change as a protobuf event");
    let json_event = |l: &[u8]| {
        matches!(
            serde_json::from_slice::<kube::core::WatchEvent<Lenient<EndpointSlice>>>(l),
            Ok(kube::core::WatchEvent::Modified(Lenient::Decoded(_)))
        )
    };
    let pb_event = |f: &[u8]| {
        matches!(
            decode::watch_event::<EndpointSlice>(f),
            Ok(decode::WatchEvent::Modified(Lenient::Decoded(_)))
        )
    };
    let [json_us, pb_us] = interleaved_us(
        EVENTS,
        [&|| lines.iter().filter(|l| json_event(l)).count(), &|| {
            pb_frames.iter().filter(|f| pb_event(f)).count()
        }],
    );
    EventRow {
        events: EVENTS,
        bytes: [
            json.len() as f64 / EVENTS as f64,
            pb.len() as f64 / EVENTS as f64,
        ],
        decode_us: [json_us, pb_us],
    }
}

/// Seconds of changes per watcher row.
const WINDOW_SECS: u64 = 10;

struct WindowResult {
    events: u64,
    bytes: u64,
    cpu_secs: f64,
}

/// `n` watches in `accept` from now on, [`RATE`] changes a second for [`WINDOW_SECS`], then
/// until every watch has every event or 30 s more: the API server's CPU over that time.
async fn watchers_window(
    client: &kube::Client,
    pid: u32,
    n: usize,
    accept: &'static str,
    shape: Shape,
    first: usize,
) -> WindowResult {
    let rv = current_rv(client).await;
    let events = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    // Opened 50 at a time: one after another, 1,000 TLS handshakes took most of a session.
    let bodies: Vec<kube::client::Body> = futures::stream::iter(0..n)
        .map(|_| start_watch(client, accept, &rv))
        .buffer_unordered(50)
        .collect()
        .await;
    let mut readers = Vec::new();
    for body in bodies {
        let (events, bytes) = (events.clone(), bytes.clone());
        readers.push(tokio::spawn(async move {
            let mut data = body.into_data_stream();
            let mut frames = wire::Frames::default();
            while let Some(Ok(chunk)) = data.next().await {
                bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                let found = if accept == JSON {
                    chunk.iter().filter(|&&b| b == b'\n').count()
                } else {
                    frames.push(&chunk);
                    let mut k = 0;
                    while let Ok(Some(_)) = frames.next_frame() {
                        k += 1;
                    }
                    k
                };
                events.fetch_add(found as u64, Ordering::Relaxed);
            }
        }));
    }
    let cpu0 = crate::procfs::usage(pid).cpu;
    let count = (RATE * WINDOW_SECS) as usize;
    changes(client, shape, first, count).await;
    let want = (count * n) as u64;
    let t0 = Instant::now();
    while events.load(Ordering::Relaxed) < want && t0.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cpu_secs = crate::procfs::usage(pid).cpu - cpu0;
    for r in readers {
        r.abort();
    }
    WindowResult {
        events: events.load(Ordering::Relaxed),
        bytes: bytes.load(Ordering::Relaxed),
        cpu_secs,
    }
}
