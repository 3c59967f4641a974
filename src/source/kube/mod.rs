//! The Kubernetes API source: list/watch Services, EndpointSlices (with upstream's label
//! selector) and this node's Node through kube-rs, keep them in stores, and publish a complete
//! [`ProxyState`] whenever they change. A watch that ends resumes from its resourceVersion; a
//! `410 Gone` relists, and objects that are not listed again count as deleted — an ordinary
//! update, never a flush of the kernel state. While the API server is unreachable the last
//! state stays published and the watchers retry with backoff.
//!
//! This file holds the run loop, the four watches as one stream and the client; the stores
//! are in `store.rs`, each watched object's decoding in `lenient.rs`, streaming lists in
//! `list_watch.rs`, the first state's waits in `first_sync.rs`, the pacer in `pacer.rs` and
//! object warnings as Events in `events.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::{stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, Resource};
use tokio::sync::{mpsc, watch};

use crate::model::collisions::CollisionTracker;
use crate::model::intern::ArcStr;
use crate::model::net::Cidr;
use crate::model::warning::ObjectWarning;
use crate::model::{Lineage, NodeInfo, ProxyState, ServicePort, ServicePortName};
use crate::source::convert::{
    assemble, convert_node, convert_service, convert_service_cidr, convert_slice, ServiceSelection,
    SliceEndpoints,
};

mod events;
mod first_sync;
pub mod lenient;
mod list_watch;
mod pacer;
pub mod protobuf;
mod store;

pub use events::*;
use first_sync::*;
pub use lenient::Lenient;
pub use list_watch::*;
use pacer::*;
pub use store::*;

/// What the API source watches: this node's Node and endpoints, and the Services (with
/// their EndpointSlices) the selection takes.
#[derive(Debug, Clone)]
pub struct Scope {
    pub node: String,
    pub selection: ServiceSelection,
}

/// An object's namespace and name: the namespace shared among objects (20k objects at 10k
/// Services held ~20k copies of a handful of namespaces).
type Key = (ArcStr, ArcStr);

/// A stored object's key: its namespace ("default" when it names none, as the conversions
/// do, so that a service port's namespace and name are its Service's key) and name.
fn key_of<K: Resource>(o: &K) -> Key {
    let m = o.meta();
    (
        crate::model::intern::shared(m.namespace.as_deref().unwrap_or("default")),
        m.name.as_deref().unwrap_or_default().into(),
    )
}

/// Watches the API and publishes states until the streams end (they do not, in practice:
/// watchers retry forever with backoff).
/// Every `resync`, the current state is published again (like an informer resync: the
/// sync that follows finds nothing changed unless the kernel needs it).
///
/// Events are applied to the stores as they come, but a state is assembled at most once
/// per `min_interval` (the sync loop's minimum sync period, which would not sync more often
/// anyway): the first change after a quiet spell is published at once, later ones wait for
/// the interval to pass and go out together. Assembling walks every service port (~16 ms at
/// 10k), so assembling per event took a whole core under 100 endpoint changes a second
/// (issue #18's churn row).
///
/// The first state waits for the initial lists of Services, EndpointSlices and Nodes, for
/// up to [`NODE_WAIT`] for this node's Node object and, with `wait_for_pod_cidrs`
/// (detect-local-mode NodeCIDR), for up to [`POD_CIDR_WAIT`] for its podCIDRs; every
/// [`WAIT_LOG_PERIOD`] meanwhile a line names what is still missing.
pub async fn run(
    api: ApiClient,
    scope: Scope,
    tx: watch::Sender<Option<Arc<ProxyState>>>,
    resync: std::time::Duration,
    min_interval: std::time::Duration,
    wait_for_pod_cidrs: bool,
    events: Option<mpsc::UnboundedSender<Warning>>,
) -> super::SourceEnd {
    let mut all = watch_streams(&api, &scope, &events);
    let node = scope.node;
    let mut stores = Stores::default();
    let mut first = FirstSyncWait::new(NodeWaits {
        node: NODE_WAIT,
        pod_cidrs: wait_for_pod_cidrs.then_some(POD_CIDR_WAIT),
    });
    let mut had_node = false;
    let mut ticker = tokio::time::interval(resync.max(std::time::Duration::from_secs(1)));
    ticker.tick().await;
    let mut pacer = Pacer::new(min_interval);
    let mut collisions = CollisionTracker::default();
    let mut progress = tokio::time::interval(WAIT_LOG_PERIOD);
    progress.tick().await;
    loop {
        let held = pacer.held_until();
        let step = tokio::select! {
            b = all.next() => match b {
                Some(b) => Step::Batch(b),
                None => return super::SourceEnd::Closed,
            },
            _ = tokio::time::sleep_until(held.unwrap_or_else(std::time::Instant::now).into()), if held.is_some() => Step::Held,
            _ = ticker.tick() => {
                if stores.synced() {
                    tx.send_modify(|_| {});
                }
                continue;
            }
            _ = progress.tick(), if !first.announced => Step::Progress,
        };
        let changed = match step {
            Step::Batch(batch) => apply_batch(&mut stores, batch),
            // The changes held back are due.
            Step::Held => pacer.release(),
            Step::Progress => first.progress(&stores, &node),
        };
        if !changed || !stores.synced() || first.holds(&stores, &node) {
            continue;
        }
        if !pacer.publish_now(tokio::time::Instant::now().into()) {
            continue;
        }
        // Upstream's NodeManager exits when its Node is deleted (exit code 1, rules left
        // in place), so that the DaemonSet restarts it and it waits for the new Node: end
        // the source with the reason; the binary exits.
        let has_node = stores.has_node(&node);
        if had_node && !has_node {
            tracing::warn!(node = %node, "Node is being deleted; exiting (rules stay in place), as upstream kube-proxy does");
            return super::SourceEnd::NodeDeleted(node);
        }
        had_node |= has_node;
        first.announce(&stores);
        let state = state_now(&mut stores, &node, &mut collisions);
        if tx.send(Some(Arc::new(state))).is_err() {
            return super::SourceEnd::Closed;
        }
    }
}

/// One kind's watch with backoff, each object decoded as `K` and converted once, its
/// warnings reported ([`reported`]), as updates (`wrap`).
fn converted<K, V>(
    kind: &'static str,
    watch: EventStream<K>,
    events: &Option<mpsc::UnboundedSender<Warning>>,
    convert: impl Fn(&K, &mut Vec<ObjectWarning>) -> V + Clone + Send + Sync + 'static,
    wrap: fn(Change<V>) -> Update,
) -> futures::stream::BoxStream<'static, watcher::Result<Update>>
where
    K: Resource + Send + 'static,
    V: Send + 'static,
{
    let events = events.clone();
    watch
        .default_backoff()
        .filter_map(move |r| {
            let (events, convert) = (events.clone(), convert.clone());
            async move {
                match r {
                    Ok(e) => decode_event(kind, e, |o: &K| reported(&events, |w| convert(o, w)))
                        .map(|c| Ok(wrap(c))),
                    Err(e) => Some(Err(e)),
                }
            }
        })
        .boxed()
}

/// The ServiceCIDR watch: an API server before 1.33 answers 404 forever; say so once, then
/// keep retrying quietly (an upgrade makes them appear).
fn service_cidrs(
    watch: EventStream<ServiceCIDR>,
    events: Option<mpsc::UnboundedSender<Warning>>,
) -> futures::stream::BoxStream<'static, watcher::Result<Update>> {
    watch
        .default_backoff()
        .scan(false, move |told, r| {
            let item = match r {
                Ok(e) => decode_event("ServiceCIDR", e, |o: &ServiceCIDR| {
                    reported(&events, |w| convert_service_cidr(o, w))
                })
                .map(|c| Ok(Update::ServiceCidr(c))),
                Err(e) => {
                    let refused = matches!(
                        e,
                        watcher::Error::WatchStartFailed(_) | watcher::Error::InitialListFailed(_)
                    );
                    if refused && !*told {
                        tracing::info!(
                            err = %describe_watch_error(&e),
                            "ServiceCIDRs cannot be listed; traffic to unallocated service IPs is not dropped until they can"
                        );
                        *told = true;
                    } else {
                        tracing::debug!(err = %describe_watch_error(&e), "ServiceCIDR watch failed");
                    }
                    None
                }
            };
            futures::future::ready(Some(item))
        })
        .filter_map(futures::future::ready)
        .boxed()
}

/// Applies a batch of watch events to the stores; whether any changed them. A watch error
/// is logged: the watcher retries with backoff and the rules stay.
fn apply_batch(stores: &mut Stores, batch: Vec<watcher::Result<Update>>) -> bool {
    let mut changed = false;
    for item in batch {
        match item {
            Ok(u) => changed |= stores.apply(u),
            Err(e) => tracing::warn!(
                err = %describe_watch_error(&e),
                "watch failed; retrying with backoff, rules stay as they are"
            ),
        }
    }
    changed
}

/// The state the stores hold now, its warnings logged, and each Service collision logged
/// once, when it appears (not on every change while it lasts).
fn state_now(stores: &mut Stores, node: &str, collisions: &mut CollisionTracker) -> ProxyState {
    let t0 = std::time::Instant::now();
    let mut warnings = Vec::new();
    let state = stores.publish(node, &mut warnings);
    tracing::debug!(built = ?t0.elapsed(), "new state from the API");
    for w in &warnings {
        super::log_object_warning(w);
    }
    for c in collisions.new_in(&state) {
        super::log_object_warning(&c.warning());
    }
    state
}

/// The API source's watches (Services, EndpointSlices, this node's Node, ServiceCIDRs) as
/// one stream of updates, in batches as they are ready. Each object is decoded on its own
/// ([`Lenient`]): one undecodable object must not fail its whole list (and with it every
/// sync).
fn watch_streams(
    client: &ApiClient,
    scope: &Scope,
    events: &Option<mpsc::UnboundedSender<Warning>>,
) -> futures::stream::BoxStream<'static, Vec<watcher::Result<Update>>> {
    let node = scope.node.as_str();
    // The API server selects; the conversions test the labels again (they serve manifests
    // too), so an object the selector let through by mistake is still left out.
    let cfg = |selector: String| watcher::Config::default().labels(&selector);
    let selection = scope.selection.clone();
    let svc = converted(
        "Service",
        list_and_watch::<Service>(
            "Services",
            client,
            cfg(scope.selection.service_label_selector()),
        ),
        events,
        move |o: &Service, w: &mut Vec<ObjectWarning>| service_ports(o, &selection, w),
        Update::Service,
    );
    // Endpoints on this node are marked local as they arrive.
    let here: ArcStr = node.into();
    let selection = scope.selection.clone();
    let eps = converted(
        "EndpointSlice",
        list_and_watch::<EndpointSlice>(
            "EndpointSlices",
            client,
            cfg(scope.selection.slice_label_selector()),
        ),
        events,
        move |o: &EndpointSlice, w: &mut Vec<ObjectWarning>| convert_slice(o, &here, &selection, w),
        Update::Slice,
    );
    let nodes = converted(
        "Node",
        list_and_watch::<Node>(
            "Nodes",
            client,
            watcher::Config::default().fields(&format!("metadata.name={node}")),
        ),
        events,
        |o: &Node, w: &mut Vec<ObjectWarning>| {
            let name = o.metadata.name.as_deref().unwrap_or_default();
            convert_node(Some(o), name, w)
        },
        Update::Node,
    );
    let cidrs = service_cidrs(
        list_and_watch::<ServiceCIDR>("ServiceCIDRs", client, watcher::Config::default()),
        events.clone(),
    );
    stream::select_all([svc, eps, nodes, cidrs])
        .ready_chunks(4096)
        .boxed()
}

/// The API client and the media types it asks for (`clientConnection.contentType` and
/// `acceptContentTypes`).
#[derive(Clone)]
pub struct ApiClient {
    pub client: Client,
    pub accept: protobuf::Accept,
}

/// The API client (the daemon's, and the tools'): `--kubeconfig`, else the inferred config (in-cluster, $KUBECONFIG,
/// ~/.kube/config); `--master` overrides the server address either way.
pub async fn client(
    kubeconfig: Option<&std::path::Path>,
    master: Option<&str>,
) -> Result<kube::Client, ClientError> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let kubeconfig_error = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| ClientError::Kubeconfig { path, source }
    };
    let master_url = |m: &str| {
        m.parse::<http::Uri>()
            .map_err(|source| ClientError::Master {
                master: m.to_string(),
                source,
            })
    };
    let mut config = match (kubeconfig, master) {
        (Some(path), _) => {
            let kc = Kubeconfig::read_from(path).map_err(kubeconfig_error(path))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(kubeconfig_error(path))?
        }
        // Inside a pod keep the service account's token and CA, only the address changes.
        (None, Some(m)) => match kube::Config::incluster() {
            Ok(c) => c,
            Err(_) => kube::Config::new(master_url(m)?),
        },
        (None, None) => kube::Config::infer().await?,
    };
    if let Some(m) = master {
        config.cluster_url = master_url(m)?;
    }
    // Plain HTTP needs no trust store, but kube-rs builds its TLS layer regardless and
    // without a configured CA reads the system's, failing where there is none (a
    // `scratch` image, the test VM): an empty CA list makes it skip that.
    if config.cluster_url.scheme_str() == Some("http") && config.root_cert.is_none() {
        config.root_cert = Some(Vec::new());
    }
    let host = config
        .cluster_url
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&crate::source::rest_client::MetricsLayer { host })
        .build())
}

/// Why [`client`] could not configure the API client; each names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{}: {source}", path.display())]
    Kubeconfig {
        path: std::path::PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("--master {master:?}: {source}")]
    Master {
        master: String,
        source: http::uri::InvalidUri,
    },
    #[error(transparent)]
    Infer(#[from] kube::config::InferConfigError),
    #[error(transparent)]
    Build(#[from] kube::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_client_that_cannot_be_configured_says_what_to_fix() {
        let e = client(Some(std::path::Path::new("/no/such/kubeconfig")), None)
            .await
            .err()
            .expect("a kubeconfig that is not there");
        assert!(matches!(e, ClientError::Kubeconfig { .. }), "{e:?}");
        assert!(e.to_string().starts_with("/no/such/kubeconfig: "), "{e}");
        // Outside a pod, a --master that is no URL.
        if kube::Config::incluster().is_err() {
            let e = client(None, Some("http://[::1"))
                .await
                .err()
                .expect("a bad --master");
            assert!(
                e.to_string().starts_with("--master \"http://[::1\": "),
                "{e}"
            );
        }
    }
    use kube::ResourceExt;

    fn svc(name: &str) -> Service {
        let mut s = Service::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("ns".into());
        s
    }

    /// What a test store keeps of a Service: its name.
    fn named(e: Event<Service>) -> Change<String> {
        Change::of(e, |s: &Service| s.metadata.name.clone().unwrap_or_default())
    }

    #[test]
    fn an_object_warning_is_an_event_on_that_object() {
        let w = ObjectWarning::new(
            "EndpointSlice",
            "shop/web-x1",
            "no kubernetes.io/service-name label; skipped",
        );
        let e = object_event(&w);
        assert_eq!(e.reference.kind.as_deref(), Some("EndpointSlice"));
        assert_eq!(
            e.reference.api_version.as_deref(),
            Some("discovery.k8s.io/v1")
        );
        assert_eq!(e.reference.namespace.as_deref(), Some("shop"));
        assert_eq!(e.reference.name.as_deref(), Some("web-x1"));
        assert_eq!(
            (e.reason.as_str(), e.note.as_str()),
            (OBJECT_EVENT_REASON, w.problem.as_str())
        );
        let n = object_event(&ObjectWarning::new("Node", "node-1", "invalid podCIDR: x"));
        assert_eq!(
            (n.reference.namespace, n.reference.name.as_deref()),
            (None, Some("node-1"))
        );
        assert_eq!(n.reference.api_version.as_deref(), Some("v1"));
        // Reported: logged, and sent once per warning.
        let (tx, mut rx) = mpsc::unbounded_channel();
        let out = reported(&Some(tx), |ws| {
            ws.push(w.clone());
            7
        });
        assert_eq!(out, 7);
        assert_eq!(rx.try_recv().unwrap().note, w.problem);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn relist_replaces_and_drops_objects_deleted_meanwhile() {
        let mut st = Store::default();
        st.apply(named(Event::Init));
        st.apply(named(Event::InitApply(svc("a"))));
        st.apply(named(Event::InitApply(svc("b"))));
        assert!(!st.synced(), "not synced before InitDone");
        assert!(st.apply(named(Event::InitDone)));
        assert_eq!(st.len(), 2);
        // A 410 relist in which "a" no longer exists.
        st.apply(named(Event::Init));
        st.apply(named(Event::InitApply(svc("b"))));
        assert_eq!(st.len(), 2, "the old view stays until the relist completes");
        st.apply(named(Event::InitDone));
        let names: Vec<_> = st.values().cloned().collect();
        assert_eq!(names, ["b"]);
    }

    #[test]
    fn apply_and_delete() {
        let mut st = Store::default();
        st.apply(named(Event::Init));
        st.apply(named(Event::InitDone));
        assert!(st.apply(named(Event::Apply(svc("a")))));
        assert!(st.apply(named(Event::Delete(svc("a")))));
        assert!(
            !st.apply(named(Event::Delete(svc("a")))),
            "deleting an unknown object changes nothing"
        );
        assert!(st.is_empty());
    }

    #[test]
    fn first_sync_waits_for_all_three_kinds() {
        let mut s = Stores::default();
        s.apply(Update::Service(Change::Init));
        s.apply(Update::Service(Change::InitDone));
        s.apply(Update::Slice(Change::Init));
        s.apply(Update::Slice(Change::InitDone));
        assert!(!s.synced());
        s.apply(Update::Node(Change::Init));
        s.apply(Update::Node(Change::InitDone));
        assert!(s.synced());
    }

    /// Two Services (one with two ports), their slices (one endpoint listed twice, one on
    /// this node, a trigger time) and a headless Service's slice.
    fn objects() -> crate::source::convert::Snapshot {
        fn v<T: serde::de::DeserializeOwned>(j: serde_json::Value) -> T {
            serde_json::from_value(j).unwrap()
        }
        use crate::source::fixtures::{endpoint_slice, slice_endpoint};
        let slice = |name: &str, svc: &str, ips: &[&str], node: &str| {
            endpoint_slice("ns", svc, name)
                .port("http", 8080)
                .endpoints(ips.iter().map(|ip| slice_endpoint(ip).node(node)))
        };
        crate::source::convert::Snapshot {
            services: vec![
                v(
                    serde_json::json!({"metadata": {"name": "web", "namespace": "ns"},
                    "spec": {"clusterIP": "10.96.0.10", "ports": [
                        {"name": "http", "port": 80, "targetPort": 8080},
                        {"name": "dns", "port": 53, "protocol": "UDP"}]}}),
                ),
                v(
                    serde_json::json!({"metadata": {"name": "api", "namespace": "ns"},
                    "spec": {"clusterIP": "10.96.0.11", "ports": [{"name": "http", "port": 443}]}}),
                ),
            ],
            endpoint_slices: vec![
                slice("web-1", "web", &["10.244.0.1", "10.244.0.2"], "node-b").build(),
                slice("web-2", "web", &["10.244.0.2", "10.244.0.3"], "node-b")
                    .annotation(
                        "endpoints.kubernetes.io/last-change-trigger-time",
                        "2026-12-01T10:00:00Z",
                    )
                    .build(),
                slice("api-1", "api", &["10.244.1.1"], "node-a").build(),
                slice("hl-1", "hl", &["10.244.2.1"], "node-b")
                    .label("service.kubernetes.io/headless", "")
                    .build(),
            ],
            ..Default::default()
        }
    }

    /// Stores holding `fx` after its first list, as on this node.
    fn listed(fx: &crate::source::convert::Snapshot, node: &str) -> Stores {
        let mut s = Stores::default();
        for u in [
            Update::Service(Change::Init),
            Update::Slice(Change::Init),
            Update::Node(Change::Init),
        ] {
            s.apply(u);
        }
        for o in &fx.services {
            s.apply(Update::Service(Change::InitApply(
                key_of(o),
                logged(|w| service_ports(o, &ServiceSelection::default(), w)),
            )));
        }
        for o in &fx.endpoint_slices {
            s.apply(Update::Slice(Change::InitApply(
                key_of(o),
                logged(|w| convert_slice(o, node, &ServiceSelection::default(), w)),
            )));
        }
        for u in [
            Update::Service(Change::InitDone),
            Update::Slice(Change::InitDone),
            Update::Node(Change::InitDone),
        ] {
            s.apply(u);
        }
        s
    }

    /// The stores convert on arrival; the state they assemble is the one `build_state`
    /// makes of the same objects, and a change of one slice changes only its endpoints.
    #[test]
    fn stores_assemble_the_state_build_state_makes_of_the_same_objects() {
        let fx = objects();
        let node = "node-a";
        let mut s = listed(&fx, node);
        let mut w = Vec::new();
        let from_stores = s.state(node, &mut w);
        let (built, _) =
            crate::source::convert::build_state(&fx, node, &ServiceSelection::default());
        assert_eq!(from_stores, built);
        let web: Vec<String> = built
            .endpoints
            .iter()
            .find(|(k, _)| k.name == "web" && k.port == "http")
            .map(|(_, e)| e.iter().map(|e| e.to_string()).collect())
            .unwrap();
        assert_eq!(
            web,
            ["10.244.0.1:8080", "10.244.0.2:8080", "10.244.0.3:8080"]
        );
        assert_eq!(built.trigger_times.len(), 2, "both of web's ports");
        assert!(built
            .endpoints
            .values()
            .flat_map(|e| e.iter())
            .any(|e| e.is_local));
        // One slice deleted: its Service's endpoints go, nothing else changes.
        let gone = &fx.endpoint_slices[2];
        assert!(s.apply(Update::Slice(Change::Delete(key_of(gone)))));
        let after = s.state(node, &mut w);
        let (svcs, eps) = crate::model::count_changes(&built, &after);
        assert_eq!((svcs, eps), (0, 1));
    }

    /// Each published state names the service ports whose Service or slices changed since
    /// the one published before it, and nothing when that is not known; what it names
    /// agrees with comparing the two states whole.
    #[test]
    fn a_published_state_names_the_service_ports_changed_since_the_one_before() {
        let fx = objects();
        let node = "node-a";
        let mut s = listed(&fx, node);
        let mut w = Vec::new();
        let spn = |name: &str, port: &str, protocol| ServicePortName {
            namespace: "ns".into(),
            name: name.into(),
            port: port.into(),
            protocol,
        };
        let tcp = crate::model::Protocol::Tcp;
        let named = |next: &ProxyState, prev: &ProxyState| {
            // What the names say agrees with comparing the whole states.
            let mut unnamed = next.clone();
            unnamed.lineage = Lineage::default();
            assert!(unnamed.changes_since(prev).is_none());
            assert_eq!(
                crate::model::count_changes(prev, next),
                crate::model::count_changes(prev, &unnamed)
            );
            next.changes_since(prev)
                .map(|k| k.iter().map(|k| format!("{k}")).collect::<Vec<_>>())
        };
        let first = s.publish(node, &mut w);
        assert_eq!(
            first.lineage.changed_since, None,
            "nothing published before"
        );
        assert_ne!(first.lineage.generation, 0);
        // One slice changed: its Service's port.
        let mut web2 = fx.endpoint_slices[1].clone();
        web2.endpoints
            .as_mut()
            .expect("the fixture lists endpoints")
            .pop();
        s.apply(Update::Slice(Change::Apply(
            key_of(&web2),
            logged(|w| convert_slice(&web2, node, &ServiceSelection::default(), w)),
        )));
        let second = s.publish(node, &mut w);
        assert_eq!(
            named(&second, &first),
            Some(vec!["ns/web:http".to_string()])
        );
        assert_eq!(crate::model::count_changes(&first, &second), (0, 1));
        assert_eq!(
            second.changes_since(&second),
            None,
            "only the state it follows"
        );
        // Changes between two publications add up; a renamed port names the old name and
        // the new one, a deleted slice its ports.
        let mut api = fx.services[1].clone();
        api.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].name = Some("https".into());
        s.apply(Update::Service(Change::Apply(
            key_of(&api),
            logged(|w| service_ports(&api, &ServiceSelection::default(), w)),
        )));
        s.apply(Update::Slice(Change::Delete(key_of(
            &fx.endpoint_slices[0],
        ))));
        let third = s.publish(node, &mut w);
        assert_eq!(
            named(&third, &second),
            Some(vec![
                "ns/api:http".to_string(),
                "ns/api:https".to_string(),
                "ns/web:http".to_string()
            ])
        );
        assert_eq!(named(&third, &first), None, "not the state it follows");
        // A deleted Service names each of its ports.
        s.apply(Update::Service(Change::Delete(key_of(&fx.services[0]))));
        let fourth = s.publish(node, &mut w);
        let dns = spn("web", "dns", crate::model::Protocol::Udp);
        let http = spn("web", "http", tcp);
        assert_eq!(
            fourth
                .changes_since(&third)
                .map(|k| k.iter().collect::<Vec<_>>()),
            Some(vec![&dns, &http])
        );
        // Nothing published in between: an empty list, not an unknown one.
        let fifth = s.publish(node, &mut w);
        assert_eq!(named(&fifth, &fourth), Some(vec![]));
        // A Node change and a relist are not described: the next state names nothing.
        s.apply(Update::Node(Change::Apply(
            ("".into(), node.into()),
            NodeInfo {
                name: node.into(),
                ..Default::default()
            },
        )));
        let sixth = s.publish(node, &mut w);
        assert_eq!(named(&sixth, &fifth), None);
        s.apply(Update::Slice(Change::Init));
        s.apply(Update::Slice(Change::InitDone));
        let seventh = s.publish(node, &mut w);
        assert_eq!(named(&seventh, &sixth), None);
        let eighth = s.publish(node, &mut w);
        assert_eq!(
            named(&eighth, &seventh),
            Some(vec![]),
            "and then it does again"
        );
    }

    #[test]
    fn stores_listed_from_a_state_publish_that_state_and_name_an_endpoint_change() {
        let st = crate::model::fixtures::synthetic_state(5, 3);
        let mut s = Stores::listed_from(&st);
        let mut w = Vec::new();
        let first = s.publish("node1", &mut w);
        assert_eq!(first, st);
        let spn = st.services.keys().nth(2).unwrap().clone();
        let mut eps = st.endpoints_of(&spn).to_vec();
        eps.pop();
        s.set_endpoints(&spn, eps.clone());
        let second = s.publish("node1", &mut w);
        assert_eq!(second.endpoints_of(&spn), eps);
        assert_eq!(
            second
                .changes_since(&first)
                .map(|k| k.iter().collect::<Vec<_>>()),
            Some(vec![&spn])
        );
        assert_eq!(crate::model::count_changes(&first, &second), (0, 1));
    }

    /// A Service as the API server's text would decode: typed, or named with its error.
    fn lenient(json: serde_json::Value) -> Lenient<Service> {
        serde_json::from_str(&json.to_string()).unwrap()
    }

    fn web(port: serde_json::Value) -> Lenient<Service> {
        lenient(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": port}]}
        }))
    }

    #[test]
    fn the_pacer_publishes_a_lone_change_at_once_and_a_burst_once_per_interval() {
        use std::time::{Duration, Instant};
        let sec = Duration::from_secs(1);
        let t0 = Instant::now();
        let mut p = Pacer::new(sec);
        assert!(p.publish_now(t0), "the first change goes out at once");
        assert_eq!(p.held_until(), None);
        // A burst within the interval is held until it has passed.
        for ms in [10, 200, 900] {
            assert!(!p.publish_now(t0 + Duration::from_millis(ms)));
            assert_eq!(p.held_until(), Some(t0 + sec));
        }
        assert!(p.release(), "held changes fall due");
        assert!(p.publish_now(t0 + sec));
        assert!(!p.release(), "nothing more is held");
        // After a quiet spell the next change goes out at once again.
        assert!(p.publish_now(t0 + 5 * sec));
        // No minimum interval: every change at once.
        let mut p = Pacer::new(Duration::ZERO);
        assert!(p.publish_now(t0));
        assert!(p.publish_now(t0));
        assert_eq!(p.held_until(), None);
    }

    /// The store keeps a Service's ports for as long as the Service exists: the list holds
    /// no spare room (it had room for four, ~770 bytes a Service).
    #[test]
    fn a_stored_port_list_has_no_spare_room() {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80}]}
        }))
        .unwrap();
        let ports = logged(|w| service_ports(&svc, &ServiceSelection::default(), w));
        assert_eq!(ports.len(), 1);
        assert_eq!(ports.capacity(), ports.len());
    }

    #[test]
    fn an_undecodable_object_is_skipped_and_its_list_still_applies() {
        let before = UNDECODABLE_OBJECTS.get();
        let mut st: Store<Vec<Arc<ServicePort>>> = Store::default();
        let ports = |s: &Service| logged(|w| service_ports(s, &ServiceSelection::default(), w));
        for ev in [
            Event::Init,
            Event::InitApply(web(serde_json::json!(80))),
            Event::InitDone,
        ] {
            st.apply(decode_event("Service", ev, ports).unwrap());
        }
        assert_eq!(st.len(), 1);
        // A relist where web has become undecodable and another Service appeared: web keeps
        // its last known version, the other one applies.
        let mut other = web(serde_json::json!(53));
        other.meta_mut().name = Some("dns".into());
        for ev in [
            Event::Init,
            Event::InitApply(web(serde_json::json!("eighty"))),
            Event::InitApply(other),
            Event::InitDone,
        ] {
            st.apply(decode_event("Service", ev, ports).unwrap());
        }
        let got: Vec<_> = st.values().map(|p| p[0].port).collect();
        assert_eq!(got, [53, 80], "dns added, web kept at 80");
        // A watch event with a bad object is skipped; a delete of it still deletes.
        assert!(
            decode_event("Service", Event::Apply(web(serde_json::json!("x"))), ports).is_none()
        );
        let del = decode_event("Service", Event::Delete(web(serde_json::json!("x"))), ports);
        assert!(st.apply(del.unwrap()));
        assert_eq!(st.len(), 1);
        assert!(UNDECODABLE_OBJECTS.get() >= before + 2);
    }

    #[test]
    fn watch_errors_read_as_one_clear_line() {
        let garbled: kube::core::Status = serde_json::from_value(serde_json::json!({})).unwrap();
        let e = describe_watch_error(&watcher::Error::WatchError(Box::new(garbled)));
        assert_eq!(
            e,
            "the API server ended the watch: no code, reason (none): (no message)"
        );
        let gone: kube::core::Status = serde_json::from_value(serde_json::json!(
            {"code": 410, "reason": "Expired", "message": "too old resource version"}
        ))
        .unwrap();
        let e = describe_watch_error(&watcher::Error::WatchError(Box::new(gone)));
        assert!(
            e.ends_with("HTTP 410, reason Expired: too old resource version"),
            "{e}"
        );
    }

    fn status(code: u16) -> watcher::Error {
        let s: kube::core::Status = serde_json::from_value(serde_json::json!(
            {"code": code, "reason": "Invalid", "message": "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"}
        ))
        .unwrap();
        watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(s)))
    }

    fn obj(name: &str) -> Lenient<Service> {
        let mut o = Service::default();
        o.metadata.name = Some(name.into());
        o.metadata.namespace = Some("ns".into());
        Lenient::Decoded(o)
    }

    /// What a stream yields, as short labels (on a runtime with a clock: the fallback's
    /// wait uses it). A stream that does not end within 10 s fails the test.
    fn labels(s: EventStream<Service>) -> Vec<String> {
        let limit = std::time::Duration::from_secs(10);
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            // The timer is made inside the runtime: it needs its clock.
            .block_on(async move { tokio::time::timeout(limit, s.collect::<Vec<_>>()).await })
            .expect("the stream ends within 10 s")
            .into_iter()
            .map(|r| match r {
                Ok(Event::Init) => "init".to_string(),
                Ok(Event::InitApply(o)) => format!("list {}", o.name_any()),
                Ok(Event::InitDone) => "done".into(),
                Ok(Event::Apply(o)) => format!("apply {}", o.name_any()),
                Ok(Event::Delete(o)) => format!("delete {}", o.name_any()),
                Err(watcher::Error::WatchStartFailed(kube::Error::Api(s))) => {
                    format!("error {}", s.code)
                }
                Err(e) => format!("error {e}"),
            })
            .collect()
    }

    fn events(items: Vec<watcher::Result<Event<Lenient<Service>>>>) -> EventStream<Service> {
        stream::iter(items).boxed()
    }

    #[test]
    fn a_refused_streaming_list_falls_back_to_list_then_watch_once() {
        let listed = events(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(obj("a"))),
            Ok(Event::InitDone),
            // A later 422 is an error like any other: no second fallback.
            Err(status(422)),
            Ok(Event::Apply(obj("b"))),
        ]);
        let s = with_list_fallback(
            "Services",
            events(vec![Err(status(422))]),
            move || listed,
            END_WAIT,
        );
        assert_eq!(
            labels(s),
            ["init", "list a", "done", "error 422", "apply b"]
        );
    }

    #[test]
    fn a_streaming_list_that_works_is_kept_and_other_errors_do_not_fall_back() {
        let streamed = events(vec![
            Err(status(503)),
            Ok(Event::Init),
            Ok(Event::InitApply(obj("a"))),
            Ok(Event::InitDone),
            Err(status(400)),
            Ok(Event::Delete(obj("a"))),
        ]);
        let s = with_list_fallback(
            "Services",
            streamed,
            || panic!("no fallback: the server serves streaming lists"),
            END_WAIT,
        );
        assert_eq!(
            labels(s),
            [
                "error 503",
                "init",
                "list a",
                "done",
                "error 400",
                "delete a"
            ]
        );
    }

    /// The list a fallback gets: `a` and `b`, then its end.
    fn full_list() -> EventStream<Service> {
        events(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(obj("a"))),
            Ok(Event::InitApply(obj("b"))),
            Ok(Event::InitDone),
        ])
    }

    fn wait_ms(quiet: u64, total: u64) -> EndWait {
        EndWait {
            quiet: std::time::Duration::from_millis(quiet),
            total: std::time::Duration::from_millis(total),
        }
    }

    /// A server that ignores `sendInitialEvents` sends the objects and then nothing (or
    /// bookmarks without the end, which the watcher swallows): after `quiet` without an
    /// object the kind is listed then watched.
    #[test]
    fn a_streaming_list_that_never_ends_falls_back_after_a_quiet_spell() {
        let ignored = events(vec![Ok(Event::Init), Ok(Event::InitApply(obj("a")))])
            .chain(stream::pending())
            .boxed();
        let s = with_list_fallback("Services", ignored, full_list, wait_ms(50, 60_000));
        assert_eq!(
            labels(s),
            ["init", "list a", "init", "list a", "list b", "done"]
        );
    }

    /// Changes keep arriving as initial objects (MODIFIED before the end counts as one):
    /// the total bound still ends the wait.
    #[test]
    fn a_busy_streaming_list_that_never_ends_falls_back_at_the_total_bound() {
        let busy = stream::once(async { Ok(Event::Init) })
            .chain(
                stream::repeat_with(|| Ok(Event::InitApply(obj("a")))).then(|e| async move {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    e
                }),
            )
            .boxed();
        let s = with_list_fallback("Services", busy, full_list, wait_ms(1_000, 100));
        let got = labels(s);
        assert!(got.len() > 4, "{got:?}");
        assert_eq!(got[got.len() - 4..], ["init", "list a", "list b", "done"]);
    }

    /// Once the end came, silence is an ordinary quiet watch: no fallback, ever.
    #[test]
    fn a_streaming_list_that_ended_is_not_given_up_when_quiet() {
        let ended = events(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(obj("a"))),
            Ok(Event::InitDone),
        ])
        .chain(stream::pending())
        .boxed();
        let mut s = with_list_fallback(
            "Services",
            ended,
            || panic!("no fallback after the end"),
            wait_ms(10, 20),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            for _ in 0..3 {
                assert!(s.next().await.is_some());
            }
            let quiet = tokio::time::timeout(std::time::Duration::from_millis(200), s.next());
            assert!(quiet.await.is_err(), "still watching");
        });
    }

    fn stores_with(services: bool, slices: bool, nodes: bool, node: Option<&str>) -> Stores {
        let mut s = Stores::default();
        if services {
            s.apply(Update::Service(Change::Init));
            s.apply(Update::Service(Change::InitDone));
        }
        if slices {
            s.apply(Update::Slice(Change::Init));
            s.apply(Update::Slice(Change::InitDone));
        }
        if nodes {
            s.apply(Update::Node(Change::Init));
            if let Some(n) = node {
                let info = NodeInfo {
                    name: n.into(),
                    ..Default::default()
                };
                s.apply(Update::Node(Change::InitApply(("".into(), n.into()), info)));
            }
            s.apply(Update::Node(Change::InitDone));
        }
        s
    }

    #[test]
    fn the_first_state_waits_for_the_lists_then_for_the_node_up_to_its_limit() {
        use std::time::Duration;
        let (limit, early, late) = (
            Duration::from_secs(30),
            Duration::from_secs(5),
            Duration::from_secs(30),
        );
        let waits = NodeWaits {
            node: limit,
            pod_cidrs: None,
        };
        let wait = |s: &Stores, t| first_sync_wait(s, "node1", t, waits);
        assert_eq!(
            wait(&stores_with(true, false, false, None), late),
            FirstSync::Kinds(vec!["EndpointSlices", "Nodes"]),
            "missing lists are named even past the Node's limit"
        );
        let no_node = stores_with(true, true, true, Some("node2"));
        assert_eq!(wait(&no_node, early), FirstSync::Node);
        assert_eq!(wait(&no_node, late), FirstSync::NodeGivenUp);
        let ready = stores_with(true, true, true, Some("node1"));
        assert_eq!(wait(&ready, early), FirstSync::Ready);
        // NodeCIDR detection: the Node's podCIDRs too, up to their own limit.
        let by_pod_cidr = NodeWaits {
            node: limit,
            pod_cidrs: Some(Duration::from_secs(300)),
        };
        let wait = |s: &Stores, t| first_sync_wait(s, "node1", t, by_pod_cidr);
        assert_eq!(wait(&ready, late), FirstSync::PodCidrs);
        assert_eq!(
            wait(&ready, Duration::from_secs(300)),
            FirstSync::PodCidrsGivenUp
        );
        let mut with_cidrs = stores_with(true, true, true, None);
        let info = NodeInfo {
            name: "node1".into(),
            pod_cidrs: vec!["10.244.1.0/24".parse().unwrap()],
            ..Default::default()
        };
        with_cidrs.apply(Update::Node(Change::Apply(
            ("".into(), "node1".into()),
            info,
        )));
        assert_eq!(wait(&with_cidrs, early), FirstSync::Ready);
        assert_eq!(wait(&no_node, early), FirstSync::Node);
    }
}
