//! Stores of watched objects, each held as its conversion into the model: watcher events decoded
//! and converted object by object ([`decode_event`]), applied per kind ([`Store`], [`Stores`]),
//! and the service ports that changed since the last state. Pure.

use super::*;

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

/// Converts one watcher event's objects with `convert`, object by object: an object that
/// did not decode as `K` (a Service with `port: "eighty"`: schema skew with a newer API
/// server, or a broken object) is named in a warning, counted, and skipped; every other
/// object of its list still applies. The decoded object is dropped after conversion: the
/// stores keep what the model needs, not the object. Pure but for the log line and the
/// counter.
pub fn decode_event<K, V>(
    kind: &str,
    ev: Event<Lenient<K>>,
    convert: impl Fn(&K) -> V,
) -> Option<Change<V>>
where
    K: Resource,
{
    let parse = |o: Lenient<K>| -> Result<(Key, V), (Key, String)> {
        let k = key_of(&o);
        match o.decoded() {
            Ok(obj) => Ok((k, convert(&obj))),
            Err(e) => Err((k, e)),
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
        Event::Delete(o) => Change::Delete(key_of(&o)),
    })
}

/// What the stores keep of each object, by kind, fed by watcher events: its conversion into
/// the model, never the object. Pure.
#[derive(Debug)]
pub struct Store<V> {
    pub(super) objects: BTreeMap<Key, V>,
    pub(super) relist: Option<BTreeMap<Key, V>>,
    pub(super) synced: bool,
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
///
/// A published state is the last one patched where the events since touched it (issue
/// #36): its maps are persistent, so the copy shares everything else, and a one-endpoint
/// change costs the same at 1k and 100k Services. The end of a (re)list, and the first
/// state, are built whole ([`Self::state`]), the same function the patches are checked
/// against.
#[derive(Debug, Default)]
pub struct Stores {
    pub services: Store<Vec<Arc<ServicePort>>>,
    pub slices: Store<SliceEndpoints>,
    pub nodes: Store<NodeInfo>,
    /// ServiceCIDRs (Kubernetes 1.33+; an older API server has none to list).
    pub service_cidrs: Store<Vec<Cidr>>,
    /// The keys of each Service's slices (by the slice's namespace and
    /// `kubernetes.io/service-name`), sorted: a touched service port's endpoints are merged
    /// from these, not found by scanning every slice.
    slices_of: BTreeMap<Key, Vec<Key>>,
    /// What changed since the last published state.
    pending: Pending,
    /// The last published state: the next one is this one patched.
    last: Option<ProxyState>,
    /// The generation of the last published state (0: none).
    pub(super) published: u64,
}

/// What the events since the last published state touched.
#[derive(Debug, Default)]
struct Pending {
    /// Service ports whose Service or slices changed (the old version's and the new one's).
    ports: BTreeSet<ServicePortName>,
    /// Services whose ports or slices changed: their trigger times are worked out again.
    services: BTreeSet<Key>,
    /// This Node changed.
    node: bool,
    /// A ServiceCIDR changed.
    service_cidrs: bool,
    /// A (re)list ended: the next state is built whole.
    rebuild: bool,
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
        self.note_pending(&u);
        match u {
            Update::Service(e) => self.services.apply(e),
            Update::Slice(e) => {
                let (key, new) = match &e {
                    Change::Apply(k, v) => (Some(k.clone()), v.service.clone()),
                    Change::Delete(k) => (Some(k.clone()), None),
                    _ => (None, None),
                };
                let old = key
                    .as_ref()
                    .and_then(|k| self.slices.get(k))
                    .and_then(|v| v.service.clone());
                let relisted = matches!(e, Change::InitDone);
                let changed = self.slices.apply(e);
                if relisted {
                    self.index_all_slices();
                } else if let Some(k) = key {
                    self.index_slice(&k, old, new);
                }
                changed
            }
            Update::Node(e) => self.nodes.apply(e),
            Update::ServiceCidr(e) => self.service_cidrs.apply(e),
        }
    }
    /// Records what `u` touches, before it is applied: the service ports of the version it
    /// replaces or deletes and of its own, and their Services.
    fn note_pending(&mut self, u: &Update) {
        let p = &mut self.pending;
        let names = match u {
            Update::Service(c) => {
                changed_names(&self.services, c, |v| v.iter().map(|sp| &sp.name).collect())
            }
            Update::Slice(c) => {
                // The trigger time applies to every port of the slice's Service.
                let mut services: Vec<&Key> = Vec::new();
                if let Change::Apply(k, _) | Change::Delete(k) = c {
                    services.extend(self.slices.get(k).and_then(|v| v.service.as_ref()));
                }
                if let Change::Apply(_, v) = c {
                    services.extend(v.service.as_ref());
                }
                p.services.extend(services.into_iter().cloned());
                changed_names(&self.slices, c, |v| {
                    v.ports.iter().map(|(spn, _)| spn).collect()
                })
            }
            Update::Node(c) => {
                p.node |= !matches!(
                    c,
                    Change::Init | Change::InitApply(..) | Change::InitKeep(_)
                );
                return;
            }
            Update::ServiceCidr(c) => {
                p.service_cidrs |= !matches!(
                    c,
                    Change::Init | Change::InitApply(..) | Change::InitKeep(_)
                );
                return;
            }
        };
        match names {
            Some(names) => {
                p.services.extend(
                    names
                        .iter()
                        .map(|spn| (spn.namespace.clone(), spn.name.clone())),
                );
                p.ports.extend(names);
            }
            None => p.rebuild = true,
        }
    }
    /// Moves slice `k` from `old`'s list to `new`'s.
    fn index_slice(&mut self, k: &Key, old: Option<Key>, new: Option<Key>) {
        if old == new {
            return;
        }
        if let Some(o) = old {
            if let Some(v) = self.slices_of.get_mut(&o) {
                v.retain(|x| x != k);
                if v.is_empty() {
                    self.slices_of.remove(&o);
                }
            }
        }
        if let Some(n) = new {
            let v = self.slices_of.entry(n).or_default();
            if let Err(i) = v.binary_search(k) {
                v.insert(i, k.clone());
            }
        }
    }
    /// The index of slices by Service, anew (after a relist).
    fn index_all_slices(&mut self) {
        self.slices_of.clear();
        for (k, v) in &self.slices.objects {
            if let Some(svc) = &v.service {
                self.slices_of
                    .entry(svc.clone())
                    .or_default()
                    .push(k.clone());
            }
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
    /// This node's facts (only its name when its Node is not known, with a warning).
    fn node_info(&self, node_name: &str, warnings: &mut Vec<ObjectWarning>) -> NodeInfo {
        self.nodes
            .values()
            .find(|n| n.name == node_name)
            .cloned()
            .unwrap_or_else(|| convert_node(None, node_name, warnings))
    }
    /// The whole model from what the stores hold, built from scratch; a missing Node's
    /// warning goes to `warnings`.
    pub fn state(&self, node_name: &str, warnings: &mut Vec<ObjectWarning>) -> ProxyState {
        assemble(
            self.node_info(node_name, warnings),
            self.services.values().flatten(),
            self.slices.values(),
            self.service_cidrs.values().flatten().copied().collect(),
        )
    }
}

impl Stores {
    /// The state to publish: the last one patched where the events since touched it (or
    /// [`Self::state`] when nothing was published yet or a list ended), numbered, and naming
    /// the service ports changed since the state published before it (see
    /// [`crate::model::Lineage`]).
    pub fn publish(&mut self, node_name: &str, warnings: &mut Vec<ObjectWarning>) -> ProxyState {
        let pending = std::mem::take(&mut self.pending);
        let mut state = match self.last.take() {
            Some(last) if !pending.rebuild => self.patched(last, &pending, node_name, warnings),
            _ => self.state(node_name, warnings),
        };
        let generation = Lineage::next_generation();
        let described = !pending.rebuild && !pending.node && !pending.service_cidrs;
        let changed_since =
            (described && self.published != 0).then(|| (self.published, Arc::new(pending.ports)));
        state.lineage = Lineage {
            generation,
            changed_since,
        };
        self.published = generation;
        self.last = Some(state.clone());
        state
    }

    /// `state` with what `pending` names worked out again from the stores; everything else
    /// is shared with it. Equal to [`Self::state`] of the same stores (the property tests
    /// in `proptests.rs` hold it to that).
    fn patched(
        &self,
        mut state: ProxyState,
        pending: &Pending,
        node_name: &str,
        warnings: &mut Vec<ObjectWarning>,
    ) -> ProxyState {
        if pending.node {
            state.node = self.node_info(node_name, warnings);
        }
        if pending.service_cidrs {
            let mut cidrs: Vec<Cidr> = self.service_cidrs.values().flatten().copied().collect();
            cidrs.sort();
            cidrs.dedup();
            state.service_cidrs = cidrs;
        }
        for spn in &pending.ports {
            let svc: Key = (spn.namespace.clone(), spn.name.clone());
            // Of two ports of one name the later one stays, as in `assemble`.
            let port = self
                .services
                .get(&svc)
                .and_then(|ports| ports.iter().rev().find(|sp| sp.name == *spn));
            set_shared(&mut state.services, spn, port.cloned());
            let endpoints = port.and_then(|_| self.endpoints_of(&svc, spn));
            set_shared(&mut state.endpoints, spn, endpoints);
        }
        for svc in &pending.services {
            let latest = self
                .slices_of
                .get(svc)
                .into_iter()
                .flatten()
                .filter_map(|k| self.slices.get(k)?.trigger_time)
                .max();
            let first = ServicePortName {
                namespace: svc.0.clone(),
                name: svc.1.clone(),
                port: "".into(),
                protocol: crate::model::Protocol::Tcp,
            };
            let of_svc = |k: &&ServicePortName| *k.namespace == *svc.0 && *k.name == *svc.1;
            let stale: Vec<ServicePortName> = state
                .trigger_times
                .range(first.clone()..)
                .map(|(k, _)| k)
                .take_while(of_svc)
                .filter(|k| latest.is_none() || !state.services.contains_key(*k))
                .cloned()
                .collect();
            for k in stale {
                state.trigger_times.remove(&k);
            }
            let Some(t) = latest else { continue };
            let ports: Vec<ServicePortName> = state
                .services
                .range(first..)
                .map(|(k, _)| k)
                .take_while(of_svc)
                .cloned()
                .collect();
            for k in ports {
                if state.trigger_times.get(&k) != Some(&t) {
                    state.trigger_times.insert(k, t);
                }
            }
        }
        state
    }

    /// The endpoints of `spn` from its Service's slices, merged as `assemble` merges them
    /// (one list: shared as it is).
    fn endpoints_of(
        &self,
        svc: &Key,
        spn: &ServicePortName,
    ) -> Option<Arc<Vec<crate::model::Endpoint>>> {
        let lists: Vec<&Arc<Vec<crate::model::Endpoint>>> = self
            .slices_of
            .get(svc)?
            .iter()
            .filter_map(|k| self.slices.get(k))
            .flat_map(|s| s.ports.iter().filter(|(n, _)| n == spn).map(|(_, l)| l))
            .collect();
        match lists.as_slice() {
            [] => None,
            [one] => Some(Arc::clone(one)),
            _ => Some(Arc::new(crate::source::convert::merge_endpoints(
                lists.iter().flat_map(|l| l.iter()),
            ))),
        }
    }
}

/// Sets `k` to `v` in `map` (`None`: removes it), leaving the map untouched when it holds that
/// very allocation already: an untouched map stays shared with the state before, and
/// consumers compare it by pointer.
fn set_shared<V>(
    map: &mut crate::model::OrdMap<ServicePortName, Arc<V>>,
    k: &ServicePortName,
    v: Option<Arc<V>>,
) {
    match v {
        Some(v) => {
            if !map.get(k).is_some_and(|old| Arc::ptr_eq(old, &v)) {
                map.insert(k.clone(), v);
            }
        }
        None => {
            if map.contains_key(k) {
                map.remove(k);
            }
        }
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

    pub(super) fn slice_key(spn: &ServicePortName) -> Key {
        (
            spn.namespace.clone(),
            format!("{}-{}", spn.name, spn.port).into(),
        )
    }

    pub(super) fn slice_of(
        spn: &ServicePortName,
        eps: Arc<Vec<crate::model::Endpoint>>,
    ) -> SliceEndpoints {
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
pub(super) fn changed_names<V: Clone>(
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
pub(super) fn service_ports(
    o: &Service,
    selection: &ServiceSelection,
    warnings: &mut Vec<ObjectWarning>,
) -> Vec<Arc<ServicePort>> {
    let ports = convert_service(o, selection, warnings);
    // Not `collect()`: that reuses the list of ports in place, kept as long as the Service
    // is, and a lone port had been pushed into room for four (~770 bytes a Service, 7.3
    // MiB at 10k; heaptrack of the daemon, issue #18).
    let mut kept = Vec::with_capacity(ports.len());
    kept.extend(ports.into_iter().map(Arc::new));
    kept
}
