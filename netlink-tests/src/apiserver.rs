//! A small Kubernetes API server for tests: list and watch of Services, EndpointSlices and
//! Nodes over real HTTP, the way the API server speaks them — lists carry a resourceVersion,
//! watches stream `ADDED`/`MODIFIED`/`DELETED`/`BOOKMARK` events as chunked JSON lines from a
//! given resourceVersion, streaming lists (`sendInitialEvents`) send the objects and the
//! `k8s.io/initial-events-end` bookmark (or 422, as a server without WatchList, or no end
//! at all, as a server that ignores the parameter), an
//! expired resourceVersion gets `410 Gone`, and tests can drop
//! connections, compact history or take the server down. Events posted by the proxy are
//! recorded. Label selectors of the form `!key` and the field selector `metadata.name=` are
//! honoured (what kube-nlproxy sends).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{json, Value};
use tokio::sync::broadcast;

/// The kinds we serve, by URL collection.
const KINDS: [(&str, &str, &str); 4] = [
    ("services", "v1", "Service"),
    ("endpointslices", "discovery.k8s.io/v1", "EndpointSlice"),
    ("nodes", "v1", "Node"),
    ("servicecidrs", "networking.k8s.io/v1", "ServiceCIDR"),
];

#[derive(Default)]
struct Store {
    rv: u64,
    /// kind → (namespace/name → object)
    objects: BTreeMap<String, BTreeMap<String, Value>>,
    /// (rv, kind, type, object)
    history: Vec<(u64, String, String, Value)>,
    /// Watches from a resourceVersion older than this get 410.
    oldest: u64,
    lists: BTreeMap<String, usize>,
    watches: BTreeMap<String, usize>,
    /// Each list or watch request's `Accept` header, in order.
    accepts: Vec<String>,
    events: Vec<Value>,
    refuse_watches: bool,
    /// Answer 404 for ServiceCIDRs, as an API server before Kubernetes 1.33 does.
    no_service_cidrs: bool,
    /// Refuse streaming lists (`sendInitialEvents`) with 422, as an API server without the
    /// WatchList feature does.
    no_watch_list: bool,
    /// Streaming lists served.
    watch_lists: BTreeMap<String, usize>,
    /// Ignore `sendInitialEvents`, as an API server before 1.27 or a proxy that drops
    /// unknown parameters: the watch sends the current objects as ADDED and goes on, never
    /// the `k8s.io/initial-events-end` bookmark; with `Some(true)` a plain bookmark follows
    /// the objects (bookmarks are allowed, just never the end).
    ignore_watch_list: Option<bool>,
}

#[derive(Clone)]
struct Shared {
    store: Arc<Mutex<Store>>,
    tx: broadcast::Sender<(u64, String, String, Value)>,
    /// Bumped to end every open watch stream.
    drops: Arc<tokio::sync::watch::Sender<u64>>,
}

/// A handle to a running fake API server.
pub struct ApiServer {
    shared: Shared,
    pub addr: SocketAddr,
    rt: Option<tokio::runtime::Runtime>,
    server: Option<tokio::task::JoinHandle<()>>,
}

fn key(obj: &Value) -> String {
    let m = &obj["metadata"];
    format!(
        "{}/{}",
        m["namespace"].as_str().unwrap_or(""),
        m["name"].as_str().unwrap_or("")
    )
}

fn kind_of(obj: &Value) -> String {
    let k = obj["kind"].as_str().expect("object has a kind");
    KINDS
        .iter()
        .find(|(_, _, kk)| *kk == k)
        .expect("served kind")
        .0
        .to_string()
}

fn matches(obj: &Value, labels: Option<&str>, fields: Option<&str>) -> bool {
    if let Some(sel) = labels {
        let label = |k: &str| obj["metadata"]["labels"].get(k).and_then(Value::as_str);
        for term in sel.split(',').filter(|t| !t.is_empty()) {
            // Equality-based terms, as the API server reads them: `!k`, `k!=v`, `k=v`
            // (or `k==v`), `k`.
            let holds = if let Some(k) = term.strip_prefix('!') {
                label(k).is_none()
            } else if let Some((k, v)) = term.split_once("!=") {
                label(k) != Some(v)
            } else if let Some((k, v)) = term.split_once('=') {
                label(k) == Some(v.trim_start_matches('='))
            } else {
                label(term).is_some()
            };
            if !holds {
                return false;
            }
        }
    }
    if let Some(f) = fields {
        for term in f.split(',') {
            if let Some(n) = term.strip_prefix("metadata.name=") {
                if obj["metadata"]["name"].as_str() != Some(n) {
                    return false;
                }
            }
        }
    }
    true
}

/// Whether `obj`, which does not match a watch's selectors in its version `rv`, did in its
/// version before: the API server then sends that watch DELETED with the new object, as an
/// object that left its selection (a Service relabelled for another proxy).
fn left_selection(
    sh: &Shared,
    coll: &str,
    rv: u64,
    obj: &Value,
    labels: Option<&str>,
    fields: Option<&str>,
) -> bool {
    let k = key(obj);
    let st = sh.store.lock().unwrap();
    st.history
        .iter()
        .rev()
        .filter(|(r, c, _, o)| *r < rv && c == coll && key(o) == k)
        .map(|(_, _, ty, o)| ty != "DELETED" && matches(o, labels, fields))
        .next()
        .unwrap_or(false)
}

/// One watch event's line, `type` first as the API server writes it (apimachinery's
/// `WatchEvent` struct in field order; `json!` would sort the keys).
fn line(ty: &str, obj: &Value) -> Bytes {
    Bytes::from(format!("{{\"type\":{},\"object\":{obj}}}\n", json!(ty)))
}

async fn collection(
    State(sh): State<Shared>,
    Path(p): Path<Vec<String>>,
    Query(q): Query<BTreeMap<String, String>>,
    headers: axum::http::HeaderMap,
) -> Response {
    let coll = p.last().cloned().unwrap_or_default();
    let accept = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    sh.store.lock().unwrap().accepts.push(accept);
    let Some((_, api, kind)) = KINDS.iter().find(|(c, _, _)| *c == coll) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let (api, kind): (&'static str, &'static str) = (api, kind);
    if coll == "servicecidrs" && sh.store.lock().unwrap().no_service_cidrs {
        return StatusCode::NOT_FOUND.into_response();
    }
    let labels = q.get("labelSelector").cloned();
    let fields = q.get("fieldSelector").cloned();
    if q.get("watch").map(String::as_str) != Some("true") {
        let mut st = sh.store.lock().unwrap();
        *st.lists.entry(coll.clone()).or_default() += 1;
        let items: Vec<Value> = st
            .objects
            .get(&coll)
            .map(|m| {
                m.values()
                    .filter(|o| matches(o, labels.as_deref(), fields.as_deref()))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        return axum::Json(json!({
            "apiVersion": api, "kind": format!("{kind}List"),
            "metadata": {"resourceVersion": st.rv.to_string()},
            "items": items,
        }))
        .into_response();
    }
    let mut from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let streaming_list = q.get("sendInitialEvents").map(String::as_str) == Some("true");
    let (backlog, rx, gone) = {
        let mut st = sh.store.lock().unwrap();
        if st.refuse_watches {
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
        *st.watches.entry(coll.clone()).or_default() += 1;
        let ignored = streaming_list.then_some(st.ignore_watch_list).flatten();
        let backlog: Vec<_> = if let Some(bookmark) = ignored {
            // A watch without resourceVersion, as such a server serves it: the current
            // objects as ADDED, then whatever happens next.
            from = st.rv;
            let bm = json!({"apiVersion": api, "kind": kind, "metadata": {"resourceVersion": st.rv.to_string()}});
            st.objects
                .get(&coll)
                .into_iter()
                .flat_map(|m| m.values())
                .map(|o| (st.rv, coll.clone(), "ADDED".to_string(), o.clone()))
                .chain(bookmark.then(|| (st.rv, coll.clone(), "BOOKMARK".to_string(), bm)))
                .collect()
        } else if streaming_list {
            if st.no_watch_list {
                let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
                    "reason": "Invalid", "code": 422});
                return (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(status)).into_response();
            }
            // The current objects as ADDED, then the bookmark that ends the initial events.
            *st.lists.entry(coll.clone()).or_default() += 1;
            *st.watch_lists.entry(coll.clone()).or_default() += 1;
            from = st.rv;
            let bm = json!({"apiVersion": api, "kind": kind, "metadata": {"resourceVersion": st.rv.to_string(),
                "annotations": {"k8s.io/initial-events-end": "true"}}});
            st.objects
                .get(&coll)
                .into_iter()
                .flat_map(|m| m.values())
                .map(|o| (st.rv, coll.clone(), "ADDED".to_string(), o.clone()))
                .chain([(st.rv, coll.clone(), "BOOKMARK".to_string(), bm)])
                .collect()
        } else {
            st.history
                .iter()
                .filter(|(rv, k, _, _)| *rv > from && *k == coll)
                .cloned()
                .collect()
        };
        // A streaming list starts from the current state: never too old.
        (
            backlog,
            sh.tx.subscribe(),
            !streaming_list && from < st.oldest,
        )
    };
    if gone {
        let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {from}"), "reason": "Expired", "code": 410});
        let body = Body::from(line("ERROR", &status));
        return (StatusCode::OK, body).into_response();
    }
    let mut drops = sh.drops.subscribe();
    drops.borrow_and_update();
    let state = (backlog.into_iter(), rx, drops, coll, labels, fields, from);
    let store = sh.clone();
    let s = futures::stream::unfold(
        state,
        move |(mut backlog, mut rx, mut drops, coll, labels, fields, mut last)| {
            let store = store.clone();
            async move {
                loop {
                    if let Some((rv, _, ty, obj)) = backlog.next() {
                        last = rv;
                        if ty == "BOOKMARK" || matches(&obj, labels.as_deref(), fields.as_deref()) {
                            return Some((
                                Ok::<_, std::io::Error>(line(&ty, &obj)),
                                (backlog, rx, drops, coll, labels, fields, last),
                            ));
                        }
                        if left_selection(
                            &store,
                            &coll,
                            rv,
                            &obj,
                            labels.as_deref(),
                            fields.as_deref(),
                        ) {
                            return Some((
                                Ok(line("DELETED", &obj)),
                                (backlog, rx, drops, coll, labels, fields, last),
                            ));
                        }
                        continue;
                    }
                    tokio::select! {
                        _ = drops.changed() => return None,
                        ev = rx.recv() => match ev {
                            Ok((rv, k, ty, obj)) => {
                                if k != coll || rv <= last { continue; }
                                last = rv;
                                if matches(&obj, labels.as_deref(), fields.as_deref()) {
                                    return Some((Ok(line(&ty, &obj)), (backlog, rx, drops, coll, labels, fields, last)));
                                }
                                if left_selection(&store, &coll, rv, &obj, labels.as_deref(), fields.as_deref()) {
                                    return Some((Ok(line("DELETED", &obj)), (backlog, rx, drops, coll, labels, fields, last)));
                                }
                                // Filtered out: tell the client how far it has seen.
                                let bm = json!({"apiVersion": api, "kind": kind, "metadata": {"resourceVersion": rv.to_string()}});
                                return Some((Ok(line("BOOKMARK", &bm)), (backlog, rx, drops, coll, labels, fields, last)));
                            }
                            Err(broadcast::error::RecvError::Lagged(_)) => continue,
                            Err(_) => return None,
                        },
                    }
                }
            }
        },
    );
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(s))
        .unwrap()
}

/// GET of one cluster-scoped object (upstream kube-proxy reads its Node so).
async fn one(State(sh): State<Shared>, Path((coll, name)): Path<(String, String)>) -> Response {
    let st = sh.store.lock().unwrap();
    match st
        .objects
        .get(&coll)
        .and_then(|m| m.get(&format!("/{name}")))
    {
        Some(o) => axum::Json(o.clone()).into_response(),
        None => {
            let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("{coll} \"{name}\" not found"), "reason": "NotFound", "code": 404});
            (StatusCode::NOT_FOUND, axum::Json(status)).into_response()
        }
    }
}

async fn post_event(State(sh): State<Shared>, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    sh.store.lock().unwrap().events.push(v.clone());
    (StatusCode::CREATED, axum::Json(v)).into_response()
}

impl ApiServer {
    /// Starts a server on 127.0.0.1 (in the calling thread's network namespace).
    pub fn start() -> ApiServer {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (tx, _) = broadcast::channel(4096);
        let shared = Shared {
            store: Arc::default(),
            tx,
            drops: Arc::new(tokio::sync::watch::channel(0).0),
        };
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let mut s = ApiServer {
            shared,
            addr,
            rt: Some(rt),
            server: None,
        };
        s.serve(listener);
        s
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let app = axum::Router::new()
            .route(
                "/api/v1/{c}",
                get(|s, Path(c): Path<String>, q, h| collection(s, Path(vec![c]), q, h)),
            )
            .route("/api/v1/{c}/{name}", get(one))
            .route(
                "/apis/discovery.k8s.io/v1/{c}",
                get(|s, Path(c): Path<String>, q, h| collection(s, Path(vec![c]), q, h)),
            )
            .route(
                "/apis/networking.k8s.io/v1/{c}",
                get(|s, Path(c): Path<String>, q, h| collection(s, Path(vec![c]), q, h)),
            )
            .route(
                "/apis/events.k8s.io/v1/namespaces/{ns}/events",
                post(post_event),
            )
            .with_state(self.shared.clone());
        let rt = self.rt.as_ref().unwrap();
        self.server = Some(rt.spawn(async move {
            let _ = axum::serve(listener, app).await;
        }));
    }

    /// From now on answer 404 for ServiceCIDRs (an API server before Kubernetes 1.33).
    pub fn without_service_cidrs(&self) {
        self.shared.store.lock().unwrap().no_service_cidrs = true;
    }

    /// From now on refuse streaming lists with 422 (an API server without WatchList).
    pub fn without_watch_list(&self) {
        self.shared.store.lock().unwrap().no_watch_list = true;
    }

    /// From now on ignore `sendInitialEvents` (an API server before 1.27, or a proxy that
    /// drops the parameter): the objects come as ADDED events but the end of the initial
    /// events never does; with `bookmarks`, a plain bookmark follows them.
    pub fn ignoring_watch_list(&self, bookmarks: bool) {
        self.shared.store.lock().unwrap().ignore_watch_list = Some(bookmarks);
    }

    /// Streaming lists (`sendInitialEvents=true` watches) served for `coll`.
    pub fn watch_lists(&self, coll: &str) -> usize {
        let st = self.shared.store.lock().unwrap();
        st.watch_lists.get(coll).copied().unwrap_or(0)
    }

    /// The `--master` URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Creates or replaces an object (ADDED or MODIFIED) and returns its resourceVersion.
    pub fn apply(&self, mut obj: Value) -> u64 {
        let coll = kind_of(&obj);
        let k = key(&obj);
        let mut st = self.shared.store.lock().unwrap();
        st.rv += 1;
        let rv = st.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let existed = st
            .objects
            .entry(coll.clone())
            .or_default()
            .insert(k, obj.clone())
            .is_some();
        let ty = if existed { "MODIFIED" } else { "ADDED" };
        st.history.push((rv, coll.clone(), ty.into(), obj.clone()));
        let _ = self.shared.tx.send((rv, coll, ty.into(), obj));
        rv
    }

    /// Deletes an object (DELETED event).
    pub fn delete(&self, kind: &str, namespace: &str, name: &str) {
        let coll = KINDS
            .iter()
            .find(|(_, _, k)| *k == kind)
            .unwrap()
            .0
            .to_string();
        let mut st = self.shared.store.lock().unwrap();
        let Some(mut obj) = st
            .objects
            .get_mut(&coll)
            .and_then(|m| m.remove(&format!("{namespace}/{name}")))
        else {
            return;
        };
        st.rv += 1;
        let rv = st.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        st.history
            .push((rv, coll.clone(), "DELETED".into(), obj.clone()));
        let _ = self.shared.tx.send((rv, coll, "DELETED".into(), obj));
    }

    /// Ends every open watch stream mid-flight (clients must resume).
    pub fn drop_watches(&self) {
        self.shared.drops.send_modify(|v| *v += 1);
    }

    /// Forgets the event history: resuming from an older resourceVersion gets 410 Gone.
    pub fn compact(&self) {
        let mut st = self.shared.store.lock().unwrap();
        st.oldest = st.rv + 1;
        st.history.clear();
    }

    /// Refuses (503) new watches until [`allow_watches`](Self::allow_watches).
    pub fn refuse_watches(&self) {
        self.shared.store.lock().unwrap().refuse_watches = true;
    }

    pub fn allow_watches(&self) {
        self.shared.store.lock().unwrap().refuse_watches = false;
    }

    /// Takes the server down: the port stops accepting and open streams end.
    pub fn stop(&mut self) {
        self.drop_watches();
        if let Some(h) = self.server.take() {
            h.abort();
        }
    }

    /// Brings it back on the same address.
    pub fn restart(&mut self) {
        let rt = self.rt.as_ref().unwrap();
        let addr = self.addr;
        // Bind on a runtime worker: those threads live in the namespace the server was
        // started in, whichever thread calls this.
        let listener = rt
            .block_on(rt.spawn(async move {
                for _ in 0..50 {
                    if let Ok(l) = tokio::net::TcpListener::bind(addr).await {
                        return l;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                panic!("cannot rebind {addr}");
            }))
            .unwrap();
        self.serve(listener);
    }

    /// How many lists each collection has served: LIST requests and streaming lists.
    pub fn lists(&self, coll: &str) -> usize {
        self.shared
            .store
            .lock()
            .unwrap()
            .lists
            .get(coll)
            .copied()
            .unwrap_or(0)
    }

    /// How many WATCH requests each collection has served.
    pub fn watches(&self, coll: &str) -> usize {
        self.shared
            .store
            .lock()
            .unwrap()
            .watches
            .get(coll)
            .copied()
            .unwrap_or(0)
    }

    /// The `Accept` header of every list and watch request so far, in order. This server
    /// answers JSON whatever is asked for, as one that offers nothing else.
    pub fn accepts(&self) -> Vec<String> {
        self.shared.store.lock().unwrap().accepts.clone()
    }

    /// Events the proxy posted.
    pub fn events(&self) -> Vec<Value> {
        self.shared.store.lock().unwrap().events.clone()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// JSON builders for the objects tests serve.
pub mod obj {
    use kube_nlproxy::source::fixtures::endpoint_slice;
    pub use kube_nlproxy::source::fixtures::{slice_endpoint, SliceEndpoint};
    use serde_json::{json, Value};

    /// A ServiceCIDR (cluster-scoped).
    pub fn service_cidr(name: &str, cidrs: &[&str]) -> Value {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
               "metadata": {"name": name}, "spec": {"cidrs": cidrs}})
    }

    pub fn service(ns: &str, name: &str, cluster_ip: &str, port: u16) -> Value {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": ns},
               "spec": {"clusterIP": cluster_ip, "clusterIPs": [cluster_ip], "ports": [{"name": "http", "port": port, "protocol": "TCP"}]}})
    }

    /// An EndpointSlice with one TCP port `http`, its endpoints built by name
    /// ([`slice_endpoint`]), from the shared builder.
    pub fn slice(ns: &str, svc: &str, name: &str, port: u16, eps: &[SliceEndpoint]) -> Value {
        endpoint_slice(ns, svc, name)
            .port("http", port)
            .endpoints(eps.iter().cloned())
            .json()
    }

    pub fn node(name: &str, zone: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
               "status": {"addresses": [{"type": "InternalIP", "address": "192.168.50.1"}]}})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Label selectors as the API server reads them: upstream's `!k` and ours' `k=v`.
    #[test]
    fn label_selector_terms_select_as_the_api_server() {
        let named = json!({"metadata": {"labels": {"service.kubernetes.io/service-proxy-name": "kube-nlproxy"}}});
        let plain = json!({"metadata": {"name": "x"}});
        let upstream = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";
        let ours =
            "service.kubernetes.io/service-proxy-name=kube-nlproxy,!service.kubernetes.io/headless";
        assert!(!matches(&named, Some(upstream), None));
        assert!(matches(&plain, Some(upstream), None));
        assert!(matches(&named, Some(ours), None));
        assert!(!matches(&plain, Some(ours), None));
        assert!(matches(
            &named,
            Some("service.kubernetes.io/service-proxy-name==kube-nlproxy"),
            None
        ));
        assert!(!matches(
            &named,
            Some("service.kubernetes.io/service-proxy-name=other"),
            None
        ));
        assert!(!matches(
            &named,
            Some("service.kubernetes.io/service-proxy-name!=kube-nlproxy"),
            None
        ));
        assert!(matches(
            &plain,
            Some("service.kubernetes.io/service-proxy-name!=kube-nlproxy"),
            None
        ));
        assert!(matches(
            &named,
            Some("service.kubernetes.io/service-proxy-name"),
            None
        ));
        assert!(!matches(
            &plain,
            Some("service.kubernetes.io/service-proxy-name"),
            None
        ));
    }
}
