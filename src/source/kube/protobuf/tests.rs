//! The protobuf watcher against a scripted API server (a tower service answering each
//! request with the next reply in its script, recording what was asked): hostile bodies in
//! protobuf (garbage frames, an undecodable object among good ones, a frame past the size
//! limit, a stream cut inside a frame, a 410), errors in protobuf, JSON when the server
//! answers JSON, and what the watcher asks for after each.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_pb::api::core::v1 as pb_core;
use k8s_pb::api::discovery::v1 as pb_discovery;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;
use kube::runtime::watcher::{self, Event};
use kube::Resource as _;
use prost::Message;

use super::decode::tests::{enveloped, meta, service};
use super::wire::fixtures::{event, framed};
use super::wire::PROTOBUF;
use super::Accept;
use crate::source::kube::{EventStream, Lenient};

type Reply = http::Response<kube::client::Body>;

/// Answers each request with the next reply; records each request's path and query.
#[derive(Clone, Default)]
struct Scripted {
    replies: Arc<Mutex<VecDeque<Reply>>>,
    asked: Arc<Mutex<Vec<String>>>,
}

impl tower::Service<http::Request<kube::client::Body>> for Scripted {
    type Response = Reply;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Reply, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let accept = req.headers()[http::header::ACCEPT]
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(accept, format!("{PROTOBUF}, */*"));
        self.asked.lock().unwrap().push(req.uri().to_string());
        let reply = self.replies.lock().unwrap().pop_front().unwrap_or_else(|| {
            // The script is over: a server that is down.
            http::Response::builder()
                .status(503)
                .body(kube::client::Body::from(b"down".to_vec()))
                .unwrap()
        });
        std::future::ready(Ok(reply))
    }
}

impl Scripted {
    fn reply(&self, status: u16, content_type: &str, body: Vec<u8>) -> &Self {
        let r = http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(kube::client::Body::from(body))
            .unwrap();
        self.replies.lock().unwrap().push_back(r);
        self
    }

    fn client(&self) -> kube::Client {
        kube::Client::new(self.clone(), "default")
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

fn list_body(rv: &str, items: Vec<Vec<u8>>) -> Vec<u8> {
    enveloped("ServiceList", super::wire::fixtures::list(rv, &items))
}

/// A Service whose spec is a varint where a message belongs: its metadata still decodes.
fn broken_service(name: &str) -> Vec<u8> {
    let mut b = pb_core::Service {
        metadata: Some(meta("default", name, "8")),
        ..Default::default()
    }
    .encode_to_vec();
    b.extend_from_slice(&[0x10, 0x01]);
    b
}

const WATCH: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// The next `n` items, each within 5 s.
async fn next<K: Send + 'static>(
    s: &mut EventStream<K>,
    n: usize,
) -> Vec<watcher::Result<Event<Lenient<K>>>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let item = tokio::time::timeout(Duration::from_secs(5), s.next())
            .await
            .expect("an item within 5 s")
            .expect("the watcher never ends");
        out.push(item);
    }
    out
}

fn name<K: kube::Resource>(e: &watcher::Result<Event<Lenient<K>>>) -> String {
    match e {
        Ok(Event::InitApply(o) | Event::Apply(o) | Event::Delete(o)) => {
            let n = o.meta().name.clone().unwrap_or_default();
            match o {
                Lenient::Decoded(_) => n,
                Lenient::Undecodable { .. } => format!("{n} (undecodable)"),
            }
        }
        Ok(Event::Init) => "init".into(),
        Ok(Event::InitDone) => "done".into(),
        Err(e) => format!("error: {e}"),
    }
}

#[tokio::test]
async fn a_paged_list_then_watch_skips_bad_objects_and_bad_frames_alone() {
    let api = Scripted::default();
    api.reply(
        200,
        PROTOBUF,
        list_body(
            "10",
            vec![
                service("a", "10.0.0.1", 80).encode_to_vec(),
                broken_service("b"),
                service("c", "10.0.0.3", 80).encode_to_vec(),
            ],
        ),
    );
    api.reply(
        200,
        WATCH,
        framed(&[
            event(
                "ADDED",
                "Service",
                service("d", "10.0.0.4", 80).encode_to_vec(),
            ),
            vec![0xff, 0xff, 0xff],
            event("MODIFIED", "Service", broken_service("e")),
            event(
                "DELETED",
                "Service",
                service("a", "10.0.0.1", 80).encode_to_vec(),
            ),
        ]),
    );
    let accept = Accept::new(PROTOBUF, "");
    let mut w = super::watcher::<Service>(api.client(), accept, Default::default(), false);
    let got: Vec<String> = next(&mut w, 9).await.iter().map(name).collect();
    assert_eq!(got[..5], ["init", "a", "b (undecodable)", "c", "done"]);
    assert_eq!(got[5], "d");
    assert!(got[6].starts_with("error: "), "{got:?}");
    assert_eq!(got[7..], ["e (undecodable)", "a"]);
    let asked = api.asked();
    assert!(asked[0].starts_with("/api/v1/services?"), "{asked:?}");
    assert!(!asked[0].contains("watch=true"), "{asked:?}");
    assert!(asked[1].contains("watch=true"), "{asked:?}");
    assert!(asked[1].contains("resourceVersion=10"), "{asked:?}");
}

#[tokio::test]
async fn a_streaming_list_ends_at_its_bookmark_and_a_410_relists() {
    let api = Scripted::default();
    let end = pb_core::Service {
        metadata: Some(pb_meta::ObjectMeta {
            resource_version: Some("20".into()),
            annotations: [("k8s.io/initial-events-end".to_string(), "true".to_string())].into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let gone = pb_meta::Status {
        code: Some(410),
        reason: Some("Expired".into()),
        ..Default::default()
    };
    api.reply(
        200,
        WATCH,
        framed(&[
            event(
                "ADDED",
                "Service",
                service("a", "10.0.0.1", 80).encode_to_vec(),
            ),
            event("BOOKMARK", "Service", end.encode_to_vec()),
            event("ERROR", "Status", gone.encode_to_vec()),
        ]),
    );
    // After the 410: a streaming list again, answered with a protobuf 403.
    let forbidden = pb_meta::Status {
        code: Some(403),
        reason: Some("Forbidden".into()),
        message: Some("services is forbidden".into()),
        ..Default::default()
    };
    api.reply(
        403,
        PROTOBUF,
        enveloped("Status", forbidden.encode_to_vec()),
    );
    let mut w = super::watcher::<Service>(
        api.client(),
        Accept::new(PROTOBUF, ""),
        Default::default(),
        true,
    );
    let items = next(&mut w, 5).await;
    let got: Vec<String> = items.iter().map(name).collect();
    assert_eq!(got[..3], ["init", "a", "done"]);
    assert!(
        matches!(&items[3], Err(watcher::Error::WatchError(s)) if s.code == 410),
        "{got:?}"
    );
    match &items[4] {
        Err(watcher::Error::WatchStartFailed(kube::Error::Api(s))) => {
            assert_eq!((s.code, s.message.as_str()), (403, "services is forbidden"));
        }
        other => panic!("{:?}", other.as_ref().err()),
    }
    let asked = api.asked();
    assert_eq!(asked.len(), 2, "{asked:?}");
    for a in &asked {
        assert!(a.contains("sendInitialEvents=true"), "{asked:?}");
    }
}

#[tokio::test]
async fn a_frame_past_the_limit_or_a_cut_stream_resumes_from_the_last_version() {
    let api = Scripted::default();
    api.reply(200, PROTOBUF, list_body("30", vec![]));
    let mut huge = framed(&[event(
        "ADDED",
        "Service",
        service("a", "10.0.0.1", 80).encode_to_vec(),
    )]);
    huge.extend_from_slice(&0x7fff_ffffu32.to_be_bytes());
    huge.extend_from_slice(&[0; 64]);
    api.reply(200, WATCH, huge);
    let mut cut = framed(&[event(
        "ADDED",
        "Service",
        service("b", "10.0.0.2", 80).encode_to_vec(),
    )]);
    cut.extend_from_slice(&[0, 0, 0, 50, 1, 2, 3]);
    api.reply(200, WATCH, cut);
    let mut w = super::watcher::<Service>(
        api.client(),
        Accept::new(PROTOBUF, ""),
        Default::default(),
        false,
    );
    let got: Vec<String> = next(&mut w, 5).await.iter().map(name).collect();
    assert_eq!(got[..3], ["init", "done", "a"]);
    assert!(got[3].contains("larger than the"), "{got:?}");
    assert_eq!(got[4], "b");
    let asked = api.asked();
    // The watch that broke resumed from the object it had last ("7", the fixture's).
    assert!(asked[1].contains("resourceVersion=30"), "{asked:?}");
    assert!(asked[2].contains("resourceVersion=7"), "{asked:?}");
}

#[tokio::test]
async fn json_answers_are_read_as_json_and_huge_slices_decode() {
    let api = Scripted::default();
    api.reply(
        200,
        "application/json",
        serde_json::to_vec(&serde_json::json!({
            "kind": "ServiceList", "apiVersion": "v1", "metadata": {"resourceVersion": "5"},
            "items": [{"metadata": {"name": "j", "namespace": "default", "resourceVersion": "5"},
                       "spec": {"ports": [{"port": "eighty"}]}},
                      {"metadata": {"name": "k", "namespace": "default", "resourceVersion": "5"},
                       "spec": {"clusterIP": "10.0.0.9", "ports": [{"port": 80}]}}]
        }))
        .unwrap(),
    );
    api.reply(
        200,
        "application/json",
        b"{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"l\",\"namespace\":\"default\",\"resourceVersion\":\"6\"}}}\n".to_vec(),
    );
    let mut w = super::watcher::<Service>(
        api.client(),
        Accept::new(PROTOBUF, ""),
        Default::default(),
        false,
    );
    let got: Vec<String> = next(&mut w, 5).await.iter().map(name).collect();
    assert_eq!(got, ["init", "j (undecodable)", "k", "done", "l"]);

    // One EndpointSlice with 5,000 endpoints (the API's limit is 1,000; a server may not
    // enforce it for us).
    let slices = Scripted::default();
    let big = pb_discovery::EndpointSlice {
        metadata: Some(meta("default", "big", "3")),
        address_type: Some("IPv4".into()),
        endpoints: (0..5000u32)
            .map(|i| pb_discovery::Endpoint {
                addresses: vec![format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255)],
                ..Default::default()
            })
            .collect(),
        ports: vec![],
    };
    let mut list = pb_discovery::EndpointSliceList {
        metadata: Some(pb_meta::ListMeta {
            resource_version: Some("3".into()),
            ..Default::default()
        }),
        items: vec![big],
    }
    .encode_to_vec();
    list = enveloped("EndpointSliceList", std::mem::take(&mut list));
    slices.reply(200, PROTOBUF, list);
    let mut w = super::watcher::<EndpointSlice>(
        slices.client(),
        Accept::new(PROTOBUF, ""),
        Default::default(),
        false,
    );
    match &next(&mut w, 2).await[1] {
        Ok(Event::InitApply(Lenient::Decoded(s))) => {
            assert_eq!(s.endpoints.as_ref().map(Vec::len), Some(5000));
        }
        other => panic!("{:?}", other.as_ref().err()),
    }
}

#[test]
fn accept_header_is_client_gos() {
    let a = Accept::new(PROTOBUF, "");
    assert_eq!(a.0, "application/vnd.kubernetes.protobuf, */*");
    let j = Accept::new("application/json", "");
    assert_eq!(j.0, "application/json, */*");
    let both = Accept::new(
        PROTOBUF,
        "application/vnd.kubernetes.protobuf,application/json",
    );
    assert_eq!(
        both.0,
        "application/vnd.kubernetes.protobuf,application/json"
    );
    assert_eq!(Accept::new("", "").0, "application/json");
}
