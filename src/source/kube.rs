//! The Kubernetes API source: list/watch Services, EndpointSlices (with upstream's label
//! selector) and this node's Node through kube-rs, keep them in stores, and publish a complete
//! [`ProxyState`] whenever they change. A watch that ends resumes from its resourceVersion; a
//! `410 Gone` relists, and objects that are not listed again count as deleted — an ordinary
//! update, never a flush of the kernel state. While the API server is unreachable the last
//! state stays published and the watchers retry with backoff.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::{stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource};
use tokio::sync::{mpsc, watch};

use crate::model::convert::Collision;
use crate::model::convert::{
    assemble, convert_node, convert_service, convert_service_cidr, convert_slice, SliceEndpoints,
};
use crate::model::intern::ArcStr;
use crate::model::net::Cidr;
use crate::model::warning::ObjectWarning;
use crate::model::{Lineage, NodeInfo, ProxyState, ServicePort, ServicePortName};

/// Upstream's selector for Services and EndpointSlices: not handed to another proxy, not
/// headless.
pub const SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// An object's namespace and name: the namespace shared among objects (20k objects at 10k
/// Services held ~20k copies of a handful of namespaces).
type Key = (ArcStr, ArcStr);

fn key_of<K: Resource>(o: &K) -> Key {
    let m = o.meta();
    (
        crate::model::intern::shared(m.namespace.as_deref().unwrap_or_default()),
        m.name.as_deref().unwrap_or_default().into(),
    )
}

/// One watcher event after decoding and converting, per object: what a [`Store`] applies.
#[derive(Debug)]
pub enum Change<V> {
    /// A (re)list starts.
    Init,
    InitApply(Key, V),
    /// A listed object that could not be decoded: keep what the store had under this key.
    InitKeep(Key),
    InitDone,
    Apply(Key, V),
    /// Deleted: known by key alone, so even an undecodable object is removed.
    Delete(Key),
}

impl<V> Change<V> {
    /// A typed watcher event, each object converted by `convert`.
    pub fn of<K: Resource>(e: Event<K>, convert: impl Fn(&K) -> V) -> Self {
        match e {
            Event::Init => Change::Init,
            Event::InitApply(o) => Change::InitApply(key_of(&o), convert(&o)),
            Event::InitDone => Change::InitDone,
            Event::Apply(o) => Change::Apply(key_of(&o), convert(&o)),
            Event::Delete(o) => Change::Delete(key_of(&o)),
        }
    }
}

/// Objects of any kind skipped because they could not be decoded; served as
/// `kubeproxy_api_objects_skipped_total` (ours: upstream fails the whole list instead).
pub static UNDECODABLE_OBJECTS: std::sync::LazyLock<prometheus_client::metrics::counter::Counter> =
    std::sync::LazyLock::new(Default::default);

/// Decodes one watcher event of untyped objects into `K` and converts each object with
/// `convert`, object by object: a Service with `port: "eighty"` (schema skew with a newer
/// API server, or a broken object) is named in a warning, counted, and skipped; every other
/// object of its list still applies. The decoded object is dropped after conversion: the
/// stores keep what the model needs, not the object. Pure but for the log line and the
/// counter.
pub fn decode_event<K, V>(
    kind: &str,
    ev: Event<DynamicObject>,
    convert: impl Fn(&K) -> V,
) -> Option<Change<V>>
where
    K: Resource + for<'a> serde::Deserialize<'a>,
{
    let key = |o: &DynamicObject| key_of(o);
    let parse = |o: DynamicObject| -> Result<(Key, V), (Key, String)> {
        let k = key(&o);
        match o.try_parse::<K>() {
            Ok(obj) => Ok((k, convert(&obj))),
            Err(e) => Err((k, e.to_string())),
        }
    };
    let skipped = |(k, e): (Key, String), what: &str| {
        UNDECODABLE_OBJECTS.inc();
        let object = format!("{}/{}", k.0, k.1);
        tracing::warn!(kind, object = %object, err = %e, outcome = what, "cannot decode an object");
        k
    };
    Some(match ev {
        Event::Init => Change::Init,
        Event::InitDone => Change::InitDone,
        Event::InitApply(o) => match parse(o) {
            Ok((k, v)) => Change::InitApply(k, v),
            Err(e) => Change::InitKeep(skipped(e, "keeping its last known version")),
        },
        Event::Apply(o) => match parse(o) {
            Ok((k, v)) => Change::Apply(k, v),
            Err(e) => {
                skipped(e, "keeping its last known version");
                return None;
            }
        },
        Event::Delete(o) => Change::Delete(key(&o)),
    })
}

/// What the stores keep of each object, by kind, fed by watcher events: its conversion into
/// the model, never the object. Pure.
#[derive(Debug)]
pub struct Store<V> {
    objects: BTreeMap<Key, V>,
    relist: Option<BTreeMap<Key, V>>,
    synced: bool,
}

impl<V> Default for Store<V> {
    fn default() -> Self {
        Store {
            objects: BTreeMap::new(),
            relist: None,
            synced: false,
        }
    }
}

impl<V: Clone> Store<V> {
    /// Applies one event; returns whether the visible contents changed.
    pub fn apply(&mut self, ev: Change<V>) -> bool {
        match ev {
            Change::Init => {
                self.relist = Some(BTreeMap::new());
                false
            }
            Change::InitApply(k, v) => {
                if let Some(b) = self.relist.as_mut() {
                    b.insert(k, v);
                }
                false
            }
            Change::InitKeep(k) => {
                if let (Some(b), Some(o)) = (self.relist.as_mut(), self.objects.get(&k)) {
                    b.insert(k, o.clone());
                }
                false
            }
            Change::InitDone => {
                // Swap atomically: what was not listed again was deleted meanwhile.
                if let Some(b) = self.relist.take() {
                    self.objects = b;
                }
                self.synced = true;
                true
            }
            Change::Apply(k, v) => {
                self.objects.insert(k, v);
                true
            }
            Change::Delete(k) => self.objects.remove(&k).is_some(),
        }
    }
    /// Whether the initial list has completed.
    pub fn synced(&self) -> bool {
        self.synced
    }
    pub fn values(&self) -> impl Iterator<Item = &V> + Clone {
        self.objects.values()
    }
    /// The visible object under `k`.
    pub fn get(&self, k: &Key) -> Option<&V> {
        self.objects.get(k)
    }
    pub fn len(&self) -> usize {
        self.objects.len()
    }
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

/// The stores together: each Service's ports, each slice's endpoints, this Node's facts and
/// each ServiceCIDR's CIDRs, converted on arrival (at 10k Services × 10 endpoints the
/// objects themselves took ~165 MiB, and copying and converting all of them per change
/// ~0.25 s).
#[derive(Debug, Default)]
pub struct Stores {
    pub services: Store<Vec<Arc<ServicePort>>>,
    pub slices: Store<SliceEndpoints>,
    pub nodes: Store<NodeInfo>,
    /// ServiceCIDRs (Kubernetes 1.33+; an older API server has none to list).
    pub service_cidrs: Store<Vec<Cidr>>,
    /// The service ports that Service and slice events touched since the last published
    /// state; `None` when that is not known (nothing published yet, a relist, a Node or
    /// ServiceCIDR change): the next state then names none.
    touched: Option<BTreeSet<ServicePortName>>,
    /// The generation of the last published state (0: none).
    published: u64,
}

/// One decoded event of any kind.
pub enum Update {
    Service(Change<Vec<Arc<ServicePort>>>),
    Slice(Change<SliceEndpoints>),
    Node(Change<NodeInfo>),
    ServiceCidr(Change<Vec<Cidr>>),
}

impl Stores {
    pub fn apply(&mut self, u: Update) -> bool {
        self.note_touched(&u);
        match u {
            Update::Service(e) => self.services.apply(e),
            Update::Slice(e) => self.slices.apply(e),
            Update::Node(e) => self.nodes.apply(e),
            Update::ServiceCidr(e) => self.service_cidrs.apply(e),
        }
    }
    /// Adds the service ports `u` changes (the old version's and the new one's) to
    /// `touched`, before `u` is applied.
    fn note_touched(&mut self, u: &Update) {
        if self.touched.is_none() {
            return;
        }
        let names = match u {
            Update::Service(c) => {
                changed_names(&self.services, c, |v| v.iter().map(|sp| &sp.name).collect())
            }
            Update::Slice(c) => changed_names(&self.slices, c, |v| {
                v.ports.iter().map(|(spn, _)| spn).collect()
            }),
            Update::Node(_) | Update::ServiceCidr(_) => None,
        };
        match (names, self.touched.as_mut()) {
            (Some(names), Some(touched)) => touched.extend(names),
            _ => self.touched = None,
        }
    }
    /// Services, EndpointSlices and the Node have been listed: the first sync may happen.
    /// ServiceCIDRs do not hold it back: an API server before 1.33 does not serve them, and
    /// until they are known nothing is dropped, which is the safe side.
    pub fn synced(&self) -> bool {
        self.services.synced() && self.slices.synced() && self.nodes.synced()
    }
    /// Whether this node's Node object is known.
    pub fn has_node(&self, node_name: &str) -> bool {
        self.nodes.values().any(|n| n.name == node_name)
    }
    /// The whole model from what the stores hold; a missing Node's warning goes to `warnings`.
    pub fn state(&self, node_name: &str, warnings: &mut Vec<ObjectWarning>) -> ProxyState {
        let node = self
            .nodes
            .values()
            .find(|n| n.name == node_name)
            .cloned()
            .unwrap_or_else(|| convert_node(None, node_name, warnings));
        assemble(
            node,
            self.services.values().flatten(),
            self.slices.values(),
            self.service_cidrs.values().flatten().copied().collect(),
        )
    }
}

impl Stores {
    /// The state to publish: [`Self::state`], numbered, and naming the service ports
    /// changed since the state published before it (see [`crate::model::Lineage`]).
    pub fn publish(&mut self, node_name: &str, warnings: &mut Vec<ObjectWarning>) -> ProxyState {
        let mut state = self.state(node_name, warnings);
        let generation = Lineage::next_generation();
        let changed_since = match self.touched.replace(BTreeSet::new()) {
            Some(touched) if self.published != 0 => Some((self.published, Arc::new(touched))),
            _ => None,
        };
        state.lineage = Lineage {
            generation,
            changed_since,
        };
        self.published = generation;
        state
    }
}

#[cfg(any(test, feature = "testing"))]
impl Stores {
    /// Stores holding `state` as a finished first list would: its Node, one Service per
    /// Service name with its ports, one slice per service port (`<service>-<port>`). For
    /// benchmarks of the states the API source publishes.
    pub fn listed_from(state: &ProxyState) -> Stores {
        let mut s = Stores::default();
        s.apply(Update::Service(Change::Init));
        s.apply(Update::Slice(Change::Init));
        s.apply(Update::Node(Change::Init));
        let mut services: BTreeMap<Key, Vec<Arc<ServicePort>>> = BTreeMap::new();
        for (spn, sp) in &state.services {
            services
                .entry((spn.namespace.clone(), spn.name.clone()))
                .or_default()
                .push(sp.clone());
        }
        for (k, v) in services {
            s.apply(Update::Service(Change::InitApply(k, v)));
        }
        for (spn, eps) in &state.endpoints {
            let slice = Self::slice_of(spn, eps.clone());
            s.apply(Update::Slice(Change::InitApply(
                Self::slice_key(spn),
                slice,
            )));
        }
        let node = ("".into(), state.node.name.as_str().into());
        s.apply(Update::Node(Change::InitApply(node, state.node.clone())));
        s.apply(Update::Service(Change::InitDone));
        s.apply(Update::Slice(Change::InitDone));
        s.apply(Update::Node(Change::InitDone));
        s
    }

    /// Replaces the endpoints of `spn`'s slice (one made by [`Self::listed_from`]), as a
    /// watch event would.
    pub fn set_endpoints(&mut self, spn: &ServicePortName, eps: Vec<crate::model::Endpoint>) {
        let slice = Self::slice_of(spn, Arc::new(eps));
        self.apply(Update::Slice(Change::Apply(Self::slice_key(spn), slice)));
    }

    fn slice_key(spn: &ServicePortName) -> Key {
        (
            spn.namespace.clone(),
            format!("{}-{}", spn.name, spn.port).into(),
        )
    }

    fn slice_of(spn: &ServicePortName, eps: Arc<Vec<crate::model::Endpoint>>) -> SliceEndpoints {
        SliceEndpoints {
            service: Some((spn.namespace.clone(), spn.name.clone())),
            trigger_time: None,
            ports: vec![(spn.clone(), eps)],
        }
    }
}

/// The service ports that `c` changes in `store` (the version it replaces or deletes, and
/// its own), or `None` when that cannot be said: the end of a (re)list, which changes
/// everything at once. `names` lists a value's service ports.
fn changed_names<V: Clone>(
    store: &Store<V>,
    c: &Change<V>,
    names: impl Fn(&V) -> Vec<&ServicePortName>,
) -> Option<Vec<ServicePortName>> {
    let old = |k: &Key| store.get(k).map(&names).unwrap_or_default();
    let mut out = match c {
        Change::Apply(k, v) => {
            let mut n = old(k);
            n.extend(names(v));
            n
        }
        Change::Delete(k) => old(k),
        // A (re)list becomes visible at its end.
        Change::Init | Change::InitApply(..) | Change::InitKeep(_) => Vec::new(),
        Change::InitDone => return None,
    };
    out.dedup();
    Some(out.into_iter().cloned().collect())
}

/// A Service's ports as the stores keep them: shared with every state assembled from them.
fn service_ports(o: &Service, warnings: &mut Vec<ObjectWarning>) -> Vec<Arc<ServicePort>> {
    let ports = convert_service(o, warnings);
    // Not `collect()`: that reuses the list of ports in place, kept as long as the Service
    // is, and a lone port had been pushed into room for four (~770 bytes a Service, 7.3
    // MiB at 10k; heaptrack of the daemon, issue #18).
    let mut kept = Vec::with_capacity(ports.len());
    kept.extend(ports.into_iter().map(Arc::new));
    kept
}

/// Converts as the stores need, logging each object's warnings once, when it arrives.
#[cfg(test)]
fn logged<T>(f: impl FnOnce(&mut Vec<ObjectWarning>) -> T) -> T {
    reported(&None, f)
}

/// [`logged`], and each warning also an Event on its object when `events` is given: the
/// same problem as one searchable line and one `kubectl describe` entry. An object's
/// warnings come once per change to it (conversions are kept while it is unchanged), and
/// the recorder folds repeats into one Event's series.
fn reported<T>(
    events: &Option<mpsc::UnboundedSender<Warning>>,
    f: impl FnOnce(&mut Vec<ObjectWarning>) -> T,
) -> T {
    let mut warnings = Vec::new();
    let out = f(&mut warnings);
    for w in &warnings {
        super::log_object_warning(w);
        if let Some(tx) = events {
            let _ = tx.send(object_event(w));
        }
    }
    out
}

/// The Event an object's warning is published as: on the object itself, reason
/// [`OBJECT_EVENT_REASON`], the problem as its note.
pub fn object_event(w: &ObjectWarning) -> Warning {
    let api_version = match w.kind {
        "EndpointSlice" => "discovery.k8s.io/v1",
        "ServiceCIDR" => "networking.k8s.io/v1",
        _ => "v1",
    };
    let (namespace, name) = match w.object.split_once('/') {
        Some((ns, name)) => (Some(ns.to_string()), name.to_string()),
        None => (None, w.object.clone()),
    };
    Warning {
        reference: ObjectReference {
            api_version: Some(api_version.into()),
            kind: Some(w.kind.into()),
            namespace,
            name: Some(name),
            ..Default::default()
        },
        reason: OBJECT_EVENT_REASON.into(),
        action: "ReadObject".into(),
        note: w.problem.clone(),
    }
}

/// The reason of an object's warning Event (the log line says "object not fully usable").
pub const OBJECT_EVENT_REASON: &str = "ObjectNotFullyUsable";

/// A warning event for the API server (upstream emits these on the Node or Service), with
/// upstream's reason and action (`Listen` for health-check ports, `StartKubeProxy` for
/// start-up failures).
#[derive(Debug, Clone)]
pub struct Warning {
    pub reference: ObjectReference,
    pub reason: String,
    pub action: String,
    pub note: String,
}

/// Upstream's `reportingController`: dashboards and alerts select kube-proxy's events by it.
pub const REPORTING_CONTROLLER: &str = "kube-proxy";

/// Upstream's `reportingInstance`: the controller and the host's name (client-go's
/// `events.NewRecorder`).
pub fn reporting_instance(hostname: &str) -> String {
    format!("{REPORTING_CONTROLLER}-{hostname}")
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

/// Publishes the "Starting" event (upstream's `birthCry`), then any warnings sent on
/// `warnings`. Failures are logged.
pub async fn run_events(
    client: Client,
    node: String,
    hostname: String,
    mut warnings: mpsc::UnboundedReceiver<Warning>,
) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: REPORTING_CONTROLLER.into(),
            instance: Some(reporting_instance(&hostname)),
        },
    );
    let starting = KubeEvent {
        type_: EventType::Normal,
        reason: "Starting".into(),
        note: None,
        action: "StartKubeProxy".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&starting, &node_ref(&node)).await {
        tracing::warn!(err = %e, "cannot publish the Starting event");
    }
    while let Some(w) = warnings.recv().await {
        let ev = KubeEvent {
            type_: EventType::Warning,
            reason: w.reason.clone(),
            note: Some(w.note.clone()),
            action: w.action.clone(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&ev, &w.reference).await {
            tracing::warn!(reason = %w.reason, err = %e, "cannot publish an event");
        }
    }
}

/// One line for a watcher failure. An API `Status` is shown by its fields, with what is
/// missing said so (a garbled one used to print as `ApiError: : (Status { code: 0 … })`).
pub fn describe_watch_error(e: &watcher::Error) -> String {
    fn status(s: &kube::core::Status) -> String {
        let or = |v: &str, none: &str| {
            if v.is_empty() {
                none.to_string()
            } else {
                v.to_string()
            }
        };
        let code = if s.code == 0 {
            "no code".to_string()
        } else {
            format!("HTTP {}", s.code)
        };
        format!(
            "{code}, reason {}: {}",
            or(&s.reason, "(none)"),
            or(&s.message, "(no message)")
        )
    }
    match e {
        watcher::Error::WatchError(s) => format!("the API server ended the watch: {}", status(s)),
        watcher::Error::InitialListFailed(kube::Error::Api(s)) => {
            format!("list failed: {}", status(s))
        }
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) => {
            format!("watch failed to start: {}", status(s))
        }
        watcher::Error::WatchFailed(kube::Error::Api(s)) => format!("watch failed: {}", status(s)),
        other => other.to_string(),
    }
}

/// A watcher's stream of untyped objects.
type EventStream = futures::stream::BoxStream<'static, watcher::Result<Event<DynamicObject>>>;

/// Whether `e`, before a streaming list finished, says the server does not serve watch-list:
/// an API server without the WatchList feature (before 1.32, 1.33 by default, or disabled)
/// refuses `sendInitialEvents` with 422 Invalid; 400 from older or proxying servers. A
/// connection error, 403, 429 or 5xx is retried as it is.
fn watch_list_refused(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) => matches!(s.code, 400 | 422),
        _ => false,
    }
}

/// How long a streaming list may go without its end (the `k8s.io/initial-events-end`
/// bookmark) before the server is taken not to honour `sendInitialEvents`: an API server
/// before 1.27, or a proxy or aggregator that drops query parameters it does not know,
/// answers the watch with the current objects as ADDED events and then plain watch events,
/// never the end, and client-go's reflector then only warns every 10 s ("hasn't received
/// required bookmark event marking the end of initial events stream") and never syncs.
#[derive(Debug, Clone, Copy)]
pub struct EndWait {
    /// No initial object for this long: the list is over and its end will not come. A
    /// server that serves watch-list sends the end right after the last object
    /// (kubernetes#127012), and 10 s is client-go's period for the warning above.
    pub quiet: std::time::Duration,
    /// The end not within this long of the first streaming list, however busy: a server
    /// that ignores the parameter keeps sending ADDED and MODIFIED events for changes,
    /// which a 10k-Service cluster's churn does more often than `quiet`. A real server
    /// streams from its watch cache, ~100k objects in a few seconds; a false alarm costs
    /// one ordinary list.
    pub total: std::time::Duration,
}

/// The bounds the daemon uses.
pub const END_WAIT: EndWait = EndWait {
    quiet: std::time::Duration::from_secs(10),
    total: std::time::Duration::from_secs(60),
};

/// Why a streaming list is given up for list-then-watch.
enum Fallback<'a> {
    Refused(&'a watcher::Error),
    NoEnd(std::time::Duration),
}

/// The initial list as a streaming list (a watch with `sendInitialEvents`, as upstream's
/// client-go does by default since 1.35: the server streams the objects from its watch cache
/// instead of building one list response), falling back to list-then-watch for the rest of
/// the run, as client-go's reflector does, when the server refuses it before the first list
/// completed, or when the list does not end within `wait` (a server that ignores the
/// parameter; client-go waits forever there). `streaming` and `listing` build the two
/// watchers; the only effects are the log line and the clock.
pub fn with_list_fallback(
    kind: &'static str,
    streaming: EventStream,
    listing: impl FnOnce() -> EventStream + Send + 'static,
    wait: EndWait,
) -> EventStream {
    use tokio::time::Instant;
    let listing: Option<Box<dyn FnOnce() -> EventStream + Send>> = Some(Box::new(listing));
    // (when the first streaming list started, the last initial object) while one runs.
    let clock: Option<(Instant, Instant)> = None;
    stream::unfold(
        (streaming, listing, clock),
        move |(mut s, mut listing, mut clock)| async move {
            loop {
                let item = match (listing.is_some(), clock) {
                    (true, Some((first, last))) => {
                        let due = (last + wait.quiet).min(first + wait.total);
                        match tokio::time::timeout_at(due, s.next()).await {
                            Ok(item) => item?,
                            Err(_) => {
                                if let Some(list_then_watch) = listing.take() {
                                    log_fallback(kind, Fallback::NoEnd(first.elapsed()), wait);
                                    s = list_then_watch();
                                }
                                clock = None;
                                continue;
                            }
                        }
                    }
                    _ => s.next().await?,
                };
                let now = Instant::now();
                match &item {
                    // The watcher starts a streaming list again after a stream ends: the
                    // total bound counts from the first.
                    Ok(Event::Init) if listing.is_some() => {
                        clock = Some((clock.map_or(now, |(first, _)| first), now))
                    }
                    Ok(Event::InitApply(_)) => {
                        if let Some((_, last)) = clock.as_mut() {
                            *last = now;
                        }
                    }
                    Ok(Event::InitDone) => {
                        listing = None;
                        clock = None;
                    }
                    Err(e) if watch_list_refused(e) => {
                        if let Some(list_then_watch) = listing.take() {
                            log_fallback(kind, Fallback::Refused(e), wait);
                            s = list_then_watch();
                            continue;
                        }
                    }
                    // The server is not answering: the wait starts again with the next
                    // streaming list it serves.
                    Err(_) => clock = None,
                    _ => {}
                }
                return Some((item, (s, listing, clock)));
            }
        },
    )
    .boxed()
}

fn log_fallback(kind: &str, why: Fallback<'_>, wait: EndWait) {
    match why {
        Fallback::Refused(e) => tracing::info!(
            kind,
            reason = %describe_watch_error(e),
            "the API server does not serve streaming lists; listing then watching instead"
        ),
        Fallback::NoEnd(waited) => tracing::warn!(
            kind,
            waited_s = waited.as_secs(),
            quiet_s = wait.quiet.as_secs(),
            total_s = wait.total.as_secs(),
            "the API server never ended the streaming list (no k8s.io/initial-events-end \
             bookmark): it ignores sendInitialEvents; listing then watching instead"
        ),
    }
}

/// [`with_list_fallback`] over the API: `kind`'s objects selected by `cfg`.
fn list_and_watch(
    kind: &'static str,
    api: Api<DynamicObject>,
    cfg: watcher::Config,
) -> EventStream {
    let streaming = watcher(api.clone(), cfg.clone().streaming_lists()).boxed();
    with_list_fallback(kind, streaming, move || watcher(api, cfg).boxed(), END_WAIT)
}

/// When the API source publishes a state: at once for the first change after a quiet
/// spell, otherwise once `min_interval` has passed since the last one, with every change
/// held back in between. Pure: the caller passes the time.
#[derive(Debug)]
struct Pacer {
    min_interval: std::time::Duration,
    last: Option<std::time::Instant>,
    held: bool,
}

impl Pacer {
    fn new(min_interval: std::time::Duration) -> Self {
        Pacer {
            min_interval,
            last: None,
            held: false,
        }
    }
    /// A change is ready at `now`: whether to publish it now (and count it as published),
    /// or hold it until [`Self::held_until`].
    fn publish_now(&mut self, now: std::time::Instant) -> bool {
        if self.last.is_some_and(|t| now < t + self.min_interval) {
            self.held = true;
            return false;
        }
        self.held = false;
        self.last = Some(now);
        true
    }
    /// When held changes fall due, if any are held.
    fn held_until(&self) -> Option<std::time::Instant> {
        self.held
            .then(|| self.last.map(|t| t + self.min_interval))
            .flatten()
    }
    /// The held changes fell due: whether there were any (the caller publishes them).
    fn release(&mut self) -> bool {
        std::mem::take(&mut self.held)
    }
}

/// How often start-up says what it still waits for: the first list of a small cluster
/// completes well within one period, so the line appears only when something is missing,
/// and a streaming list the server never ends ([`END_WAIT`]'s 10 s) is named twice before
/// it is given up.
const WAIT_LOG_PERIOD: std::time::Duration = std::time::Duration::from_secs(5);

/// How long the first state waits for this node's Node object: upstream's getNodeIPs
/// polls with a 1 s backoff doubling over 6 steps (1+2+4+8+16 s = 31 s), and its
/// NodeManager waits ~30 s since kubernetes#133059, then both go on without the Node's
/// addresses ("Can't determine this node's IP, assuming loopback").
const NODE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long the first state waits for the Node's podCIDRs when local traffic is detected by
/// them (`NodeCIDR`): upstream's NodeManager waits 5 minutes "for allocators to assign a
/// PodCIDR to the node after it is registered" (and then fails start-up; we go on and pick
/// them up when they come, with the detector's warning at each sync meanwhile).
const POD_CIDR_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// One turn of the API source's loop.
enum Step {
    Batch(Vec<watcher::Result<Update>>),
    /// Held changes fell due.
    Held,
    /// Time to say what the first state still waits for.
    Progress,
}

/// What the first state waits for.
#[derive(Debug, PartialEq, Eq)]
enum FirstSync {
    /// The initial lists of these kinds.
    Kinds(Vec<&'static str>),
    /// This node's Node object, for less than the wait.
    Node,
    /// The Node wait is over: go on without it.
    NodeGivenUp,
    /// The Node's podCIDRs (`NodeCIDR` detection), for less than their wait.
    PodCidrs,
    /// The podCIDR wait is over: go on without them.
    PodCidrsGivenUp,
    Ready,
}

/// How long the first state waits for what it needs of this node's Node.
#[derive(Debug, Clone, Copy)]
struct NodeWaits {
    node: std::time::Duration,
    /// `Some` when local traffic is detected by the Node's podCIDRs.
    pod_cidrs: Option<std::time::Duration>,
}

/// What the first state waits for after `waited`. Pure.
fn first_sync_wait(
    stores: &Stores,
    node: &str,
    waited: std::time::Duration,
    waits: NodeWaits,
) -> FirstSync {
    let missing: Vec<&'static str> = [
        ("Services", stores.services.synced()),
        ("EndpointSlices", stores.slices.synced()),
        ("Nodes", stores.nodes.synced()),
    ]
    .into_iter()
    .filter(|(_, synced)| !synced)
    .map(|(kind, _)| kind)
    .collect();
    let this = stores.nodes.values().find(|n| n.name == node);
    match (missing.is_empty(), this, waits.pod_cidrs) {
        (false, _, _) => FirstSync::Kinds(missing),
        (true, None, _) if waited < waits.node => FirstSync::Node,
        (true, None, _) => FirstSync::NodeGivenUp,
        (true, Some(n), Some(limit)) if n.pod_cidrs.is_empty() => {
            if waited < limit {
                FirstSync::PodCidrs
            } else {
                FirstSync::PodCidrsGivenUp
            }
        }
        (true, Some(_), _) => FirstSync::Ready,
    }
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
    client: Client,
    node: String,
    tx: watch::Sender<Option<Arc<ProxyState>>>,
    resync: std::time::Duration,
    min_interval: std::time::Duration,
    wait_for_pod_cidrs: bool,
    events: Option<mpsc::UnboundedSender<Warning>>,
) -> super::SourceEnd {
    let mut all = watch_streams(&client, &node, &events);
    let mut stores = Stores::default();
    let mut first = FirstSyncWait::new(NodeWaits {
        node: NODE_WAIT,
        pod_cidrs: wait_for_pod_cidrs.then_some(POD_CIDR_WAIT),
    });
    let mut had_node = false;
    let mut ticker = tokio::time::interval(resync.max(std::time::Duration::from_secs(1)));
    ticker.tick().await;
    let mut pacer = Pacer::new(min_interval);
    let mut collisions = BTreeSet::new();
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
    watch: EventStream,
    events: &Option<mpsc::UnboundedSender<Warning>>,
    convert: impl Fn(&K, &mut Vec<ObjectWarning>) -> V + Clone + Send + Sync + 'static,
    wrap: fn(Change<V>) -> Update,
) -> futures::stream::BoxStream<'static, watcher::Result<Update>>
where
    K: Resource + for<'a> serde::Deserialize<'a>,
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
    watch: EventStream,
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
fn state_now(stores: &mut Stores, node: &str, collisions: &mut BTreeSet<Collision>) -> ProxyState {
    let t0 = std::time::Instant::now();
    let mut warnings = Vec::new();
    let state = stores.publish(node, &mut warnings);
    tracing::debug!(built = ?t0.elapsed(), "new state from the API");
    for w in &warnings {
        super::log_object_warning(w);
    }
    let now: BTreeSet<Collision> = crate::model::convert::collisions_of(&state)
        .into_iter()
        .collect();
    for c in now.difference(collisions) {
        super::log_object_warning(&c.warning());
    }
    *collisions = now;
    state
}

/// What the first state waits for and has stopped waiting for: the initial lists, this
/// node's Node (up to [`NODE_WAIT`]) and its podCIDRs where they detect local traffic (up to
/// [`POD_CIDR_WAIT`]); a ruleset programmed without them is not this node's.
struct FirstSyncWait {
    waits: NodeWaits,
    started: std::time::Instant,
    /// The first state went out.
    announced: bool,
    node_given_up: bool,
    pod_cidrs_given_up: bool,
}

impl FirstSyncWait {
    fn new(waits: NodeWaits) -> Self {
        FirstSyncWait {
            waits,
            started: std::time::Instant::now(),
            announced: false,
            node_given_up: false,
            pod_cidrs_given_up: false,
        }
    }

    /// Says what the first state still waits for; whether a wait was given up now (the
    /// state may go out without it).
    fn progress(&mut self, stores: &Stores, node: &str) -> bool {
        let waited = self.started.elapsed();
        match first_sync_wait(stores, node, waited, self.waits) {
            FirstSync::Kinds(missing) => tracing::info!(
                missing = %missing.join(", "),
                waited_s = waited.as_secs(),
                "waiting for the initial list"
            ),
            FirstSync::Node => tracing::info!(
                node = %node,
                waited_s = waited.as_secs(),
                limit_s = NODE_WAIT.as_secs(),
                "waiting for this node's Node object (its addresses, podCIDR and labels)"
            ),
            FirstSync::NodeGivenUp if !self.node_given_up => {
                tracing::warn!(
                    node = %node,
                    waited_s = waited.as_secs(),
                    "no Node object by this name; proceeding without its addresses until it appears, as upstream kube-proxy does after its wait"
                );
                self.node_given_up = true;
                return true;
            }
            FirstSync::PodCidrs => tracing::info!(
                node = %node,
                waited_s = waited.as_secs(),
                limit_s = POD_CIDR_WAIT.as_secs(),
                "waiting for this node's podCIDRs (detect-local-mode NodeCIDR)"
            ),
            FirstSync::PodCidrsGivenUp if !self.pod_cidrs_given_up => {
                tracing::warn!(
                    node = %node,
                    waited_s = waited.as_secs(),
                    "the Node has no podCIDRs; proceeding without local traffic detection until it has"
                );
                self.pod_cidrs_given_up = true;
                return true;
            }
            FirstSync::NodeGivenUp | FirstSync::PodCidrsGivenUp | FirstSync::Ready => {}
        }
        false
    }

    /// Whether the first state is still held back for the Node or its podCIDRs.
    fn holds(&self, stores: &Stores, node: &str) -> bool {
        if self.announced {
            return false;
        }
        match first_sync_wait(stores, node, self.started.elapsed(), self.waits) {
            FirstSync::Node | FirstSync::NodeGivenUp => !self.node_given_up,
            FirstSync::PodCidrs | FirstSync::PodCidrsGivenUp => !self.pod_cidrs_given_up,
            FirstSync::Kinds(_) | FirstSync::Ready => false,
        }
    }

    /// The first state goes out: say so once.
    fn announce(&mut self, stores: &Stores) {
        if !self.announced {
            tracing::info!(
                services = stores.services.len(),
                slices = stores.slices.len(),
                "initial list complete"
            );
            self.announced = true;
        }
    }
}

/// The API source's watches (Services, EndpointSlices, this node's Node, ServiceCIDRs) as
/// one stream of updates, in batches as they are ready. Untyped watchers, decoded object by
/// object: one undecodable object must not fail its whole list (and with it every sync).
fn watch_streams(
    client: &Client,
    node: &str,
    events: &Option<mpsc::UnboundedSender<Warning>>,
) -> futures::stream::BoxStream<'static, Vec<watcher::Result<Update>>> {
    let api = |ar: ApiResource| Api::<DynamicObject>::all_with(client.clone(), &ar);
    let cfg = watcher::Config::default().labels(SELECTOR);
    let svc = converted(
        "Service",
        list_and_watch(
            "Services",
            api(ApiResource::erase::<Service>(&())),
            cfg.clone(),
        ),
        events,
        service_ports,
        Update::Service,
    );
    // Endpoints on this node are marked local as they arrive.
    let here: ArcStr = node.into();
    let eps = converted(
        "EndpointSlice",
        list_and_watch(
            "EndpointSlices",
            api(ApiResource::erase::<EndpointSlice>(&())),
            cfg,
        ),
        events,
        move |o: &EndpointSlice, w: &mut Vec<ObjectWarning>| convert_slice(o, &here, w),
        Update::Slice,
    );
    let nodes = converted(
        "Node",
        list_and_watch(
            "Nodes",
            api(ApiResource::erase::<Node>(&())),
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
        list_and_watch(
            "ServiceCIDRs",
            api(ApiResource::erase::<ServiceCIDR>(&())),
            watcher::Config::default(),
        ),
        events.clone(),
    );
    stream::select_all([svc, eps, nodes, cidrs])
        .ready_chunks(4096)
        .boxed()
}

/// The API client (the daemon's, and the tools'): `--kubeconfig`, else the inferred config (in-cluster, $KUBECONFIG,
/// ~/.kube/config); `--master` overrides the server address either way.
pub async fn client(
    kubeconfig: Option<&std::path::Path>,
    master: Option<&str>,
) -> Result<kube::Client, String> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut config = match (kubeconfig, master) {
        (Some(path), _) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| format!("{}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| err(&e))?
        }
        // Inside a pod keep the service account's token and CA, only the address changes.
        (None, Some(m)) => match kube::Config::incluster() {
            Ok(c) => c,
            Err(_) => kube::Config::new(m.parse().map_err(|e| err(&e))?),
        },
        (None, None) => kube::Config::infer().await.map_err(|e| err(&e))?,
    };
    if let Some(m) = master {
        config.cluster_url = m.parse().map_err(|e| err(&e))?;
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
    let builder = kube::client::ClientBuilder::try_from(config).map_err(|e| err(&e))?;
    Ok(builder
        .with_layer(&crate::source::rest_client::MetricsLayer { host })
        .build())
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
    fn objects() -> crate::model::convert::Snapshot {
        fn v<T: serde::de::DeserializeOwned>(j: serde_json::Value) -> T {
            serde_json::from_value(j).unwrap()
        }
        use crate::model::fixtures::slices::{endpoint_slice, slice_endpoint};
        let slice = |name: &str, svc: &str, ips: &[&str], node: &str| {
            endpoint_slice("ns", svc, name)
                .port("http", 8080)
                .endpoints(ips.iter().map(|ip| slice_endpoint(ip).node(node)))
        };
        crate::model::convert::Snapshot {
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
    fn listed(fx: &crate::model::convert::Snapshot, node: &str) -> Stores {
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
                logged(|w| service_ports(o, w)),
            )));
        }
        for o in &fx.endpoint_slices {
            s.apply(Update::Slice(Change::InitApply(
                key_of(o),
                logged(|w| convert_slice(o, node, w)),
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
        let (built, _) = crate::model::convert::build_state(&fx, node);
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
            logged(|w| convert_slice(&web2, node, w)),
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
            logged(|w| service_ports(&api, w)),
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

    fn dynamic(json: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json).unwrap()
    }

    fn web(port: serde_json::Value) -> DynamicObject {
        dynamic(serde_json::json!({
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
        let ports = logged(|w| service_ports(&svc, w));
        assert_eq!(ports.len(), 1);
        assert_eq!(ports.capacity(), ports.len());
    }

    #[test]
    fn an_undecodable_object_is_skipped_and_its_list_still_applies() {
        let before = UNDECODABLE_OBJECTS.get();
        let mut st: Store<Vec<Arc<ServicePort>>> = Store::default();
        let ports = |s: &Service| logged(|w| service_ports(s, w));
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
        other.metadata.name = Some("dns".into());
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

    fn obj(name: &str) -> DynamicObject {
        let mut o = DynamicObject::new(name, &ApiResource::erase::<Service>(&()));
        o.metadata.namespace = Some("ns".into());
        o
    }

    /// What a stream yields, as short labels (on a runtime with a clock: the fallback's
    /// wait uses it). A stream that does not end within 10 s fails the test.
    fn labels(s: EventStream) -> Vec<String> {
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
                Ok(Event::InitApply(o)) => format!("list {}", o.metadata.name.unwrap()),
                Ok(Event::InitDone) => "done".into(),
                Ok(Event::Apply(o)) => format!("apply {}", o.metadata.name.unwrap()),
                Ok(Event::Delete(o)) => format!("delete {}", o.metadata.name.unwrap()),
                Err(watcher::Error::WatchStartFailed(kube::Error::Api(s))) => {
                    format!("error {}", s.code)
                }
                Err(e) => format!("error {e}"),
            })
            .collect()
    }

    fn events(items: Vec<watcher::Result<Event<DynamicObject>>>) -> EventStream {
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
    fn full_list() -> EventStream {
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
