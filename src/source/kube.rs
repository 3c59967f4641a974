//! The Kubernetes API source: list/watch Services, EndpointSlices (with upstream's label
//! selector) and this node's Node through kube-rs, keep them in stores, and publish a complete
//! [`ProxyState`] whenever they change. A watch that ends resumes from its resourceVersion; a
//! `410 Gone` relists, and objects that are not listed again count as deleted — an ordinary
//! update, never a flush of the kernel state. While the API server is unreachable the last
//! state stays published and the watchers retry with backoff.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource};
use tokio::sync::{mpsc, watch};

use crate::model::convert::{build_state, Snapshot};
use crate::model::ProxyState;

/// Upstream's selector for Services and EndpointSlices: not handed to another proxy, not
/// headless.
pub const SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

type Key = (String, String);

fn key_of<K: Resource>(o: &K) -> Key {
    let m = o.meta();
    (
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
}

/// The objects of one kind, fed by watcher events. Pure.
#[derive(Debug)]
pub struct Store<K> {
    objects: BTreeMap<Key, K>,
    relist: Option<BTreeMap<Key, K>>,
    synced: bool,
}

impl<K> Default for Store<K> {
    fn default() -> Self {
        Store {
            objects: BTreeMap::new(),
            relist: None,
            synced: false,
        }
    }
}

impl<K: Resource + Clone> Store<K> {
    /// Applies one event; returns whether the visible contents changed.
    pub fn apply(&mut self, ev: Event<K>) -> bool {
        match ev {
            Event::Init => {
                self.relist = Some(BTreeMap::new());
                false
            }
            Event::InitApply(o) => {
                if let Some(b) = self.relist.as_mut() {
                    b.insert(key_of(&o), o);
                }
                false
            }
            Event::InitDone => {
                // Swap atomically: what was not listed again was deleted meanwhile.
                if let Some(b) = self.relist.take() {
                    self.objects = b;
                }
                self.synced = true;
                true
            }
            Event::Apply(o) => {
                self.objects.insert(key_of(&o), o);
                true
            }
            Event::Delete(o) => self.objects.remove(&key_of(&o)).is_some(),
        }
    }
    /// Whether the initial list has completed.
    pub fn synced(&self) -> bool {
        self.synced
    }
    pub fn values(&self) -> impl Iterator<Item = &K> {
        self.objects.values()
    }
    pub fn len(&self) -> usize {
        self.objects.len()
    }
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

/// The three stores together.
#[derive(Debug, Default)]
pub struct Stores {
    pub services: Store<Service>,
    pub slices: Store<EndpointSlice>,
    pub nodes: Store<Node>,
}

/// One watcher event of any kind (boxed: Node objects are large).
pub enum Update {
    Service(Box<Event<Service>>),
    Slice(Box<Event<EndpointSlice>>),
    Node(Box<Event<Node>>),
}

impl Stores {
    pub fn apply(&mut self, u: Update) -> bool {
        match u {
            Update::Service(e) => self.services.apply(*e),
            Update::Slice(e) => self.slices.apply(*e),
            Update::Node(e) => self.nodes.apply(*e),
        }
    }
    /// All three kinds have been listed: the first sync may happen.
    pub fn synced(&self) -> bool {
        self.services.synced() && self.slices.synced() && self.nodes.synced()
    }
    pub fn snapshot(&self, node_name: &str) -> Snapshot {
        Snapshot {
            services: self.services.values().cloned().collect(),
            endpoint_slices: self.slices.values().cloned().collect(),
            node: self
                .nodes
                .values()
                .find(|n| n.metadata.name.as_deref() == Some(node_name))
                .cloned(),
        }
    }
}

/// A warning event for the API server (upstream emits these on the Node or Service).
#[derive(Debug, Clone)]
pub struct Warning {
    pub reference: ObjectReference,
    pub reason: String,
    pub note: String,
}

/// A reference to this node, as events need.
pub fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        uid: Some(node.into()),
        ..Default::default()
    }
}

/// Publishes the "Starting" event, then any warnings sent on `warnings`. Failures are logged.
pub async fn run_events(
    client: Client,
    node: String,
    mut warnings: mpsc::UnboundedReceiver<Warning>,
) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "kube-nlproxy".into(),
            instance: Some(node.clone()),
        },
    );
    let starting = KubeEvent {
        type_: EventType::Normal,
        reason: "Starting".into(),
        note: Some("Starting kube-nlproxy.".into()),
        action: "StartKubeProxy".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&starting, &node_ref(&node)).await {
        tracing::warn!("cannot publish the Starting event: {e}");
    }
    while let Some(w) = warnings.recv().await {
        let ev = KubeEvent {
            type_: EventType::Warning,
            reason: w.reason.clone(),
            note: Some(w.note.clone()),
            action: w.reason.clone(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&ev, &w.reference).await {
            tracing::warn!(reason = %w.reason, "cannot publish event: {e}");
        }
    }
}

/// Watches the API and publishes states until the streams end (they do not, in practice:
/// watchers retry forever with backoff).
/// Every `resync`, the current state is published again (like an informer resync: the
/// sync that follows finds nothing changed unless the kernel needs it).
pub async fn run(
    client: Client,
    node: String,
    tx: watch::Sender<Option<Arc<ProxyState>>>,
    resync: std::time::Duration,
) {
    let cfg = watcher::Config::default().labels(SELECTOR);
    let svc = watcher(Api::<Service>::all(client.clone()), cfg.clone())
        .default_backoff()
        .map(|r| r.map(|e| Update::Service(Box::new(e))))
        .boxed();
    let eps = watcher(Api::<EndpointSlice>::all(client.clone()), cfg)
        .default_backoff()
        .map(|r| r.map(|e| Update::Slice(Box::new(e))))
        .boxed();
    let nodes = watcher(
        Api::<Node>::all(client),
        watcher::Config::default().fields(&format!("metadata.name={node}")),
    )
    .default_backoff()
    .map(|r| r.map(|e| Update::Node(Box::new(e))))
    .boxed();
    let mut all = stream::select_all([svc, eps, nodes]).ready_chunks(4096);
    let mut stores = Stores::default();
    let mut announced = false;
    let mut ticker = tokio::time::interval(resync.max(std::time::Duration::from_secs(1)));
    ticker.tick().await;
    loop {
        let batch = tokio::select! {
            b = all.next() => match b {
                Some(b) => b,
                None => return,
            },
            _ = ticker.tick() => {
                if stores.synced() {
                    tx.send_modify(|_| {});
                }
                continue;
            }
        };
        let mut changed = false;
        for item in batch {
            match item {
                Ok(u) => changed |= stores.apply(u),
                Err(e) => tracing::warn!(
                    "watch failed, retrying with backoff; rules stay as they are: {e}"
                ),
            }
        }
        if !changed || !stores.synced() {
            continue;
        }
        if !announced {
            tracing::info!(
                services = stores.services.len(),
                slices = stores.slices.len(),
                "initial list complete"
            );
            announced = true;
        }
        let (state, warnings) = build_state(&stores.snapshot(&node), &node);
        for w in warnings {
            tracing::warn!("{w}");
        }
        if tx.send(Some(Arc::new(state))).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str) -> Service {
        let mut s = Service::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("ns".into());
        s
    }

    #[test]
    fn relist_replaces_and_drops_objects_deleted_meanwhile() {
        let mut st = Store::default();
        st.apply(Event::Init);
        st.apply(Event::InitApply(svc("a")));
        st.apply(Event::InitApply(svc("b")));
        assert!(!st.synced(), "not synced before InitDone");
        assert!(st.apply(Event::InitDone));
        assert_eq!(st.len(), 2);
        // A 410 relist in which "a" no longer exists.
        st.apply(Event::Init);
        st.apply(Event::InitApply(svc("b")));
        assert_eq!(st.len(), 2, "the old view stays until the relist completes");
        st.apply(Event::InitDone);
        let names: Vec<_> = st
            .values()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["b"]);
    }

    #[test]
    fn apply_and_delete() {
        let mut st = Store::default();
        st.apply(Event::Init);
        st.apply(Event::InitDone);
        assert!(st.apply(Event::Apply(svc("a"))));
        assert!(st.apply(Event::Delete(svc("a"))));
        assert!(
            !st.apply(Event::Delete(svc("a"))),
            "deleting an unknown object changes nothing"
        );
        assert!(st.is_empty());
    }

    #[test]
    fn first_sync_waits_for_all_three_kinds() {
        let mut s = Stores::default();
        s.apply(Update::Service(Box::new(Event::Init)));
        s.apply(Update::Service(Box::new(Event::InitDone)));
        s.apply(Update::Slice(Box::new(Event::Init)));
        s.apply(Update::Slice(Box::new(Event::InitDone)));
        assert!(!s.synced());
        s.apply(Update::Node(Box::new(Event::Init)));
        s.apply(Update::Node(Box::new(Event::InitDone)));
        assert!(s.synced());
    }
}
