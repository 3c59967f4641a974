//! The proxy's view of the cluster, independent of where objects come from: service ports and
//! their endpoints, with upstream kube-proxy's names. Pure: no sockets, no clocks.

pub mod collisions;
#[cfg(any(test, feature = "testing"))]
pub mod fixtures;
pub mod intern;
pub mod net;
pub mod topology;
pub mod warning;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

pub use imbl::OrdMap;
pub use intern::ArcStr;
use net::Cidr;

/// L4 protocol of a service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }
    /// Lower-case name as used in chain names (`tcp`).
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
    /// The API's spelling (`TCP`), as upstream's metric labels carry it.
    pub fn upper(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }
    pub fn parse(s: &str) -> Option<Protocol> {
        match s {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

/// Identifies one port of one Service: `namespace/name:port-name` plus protocol.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePortName {
    pub namespace: ArcStr,
    pub name: ArcStr,
    pub port: ArcStr,
    pub protocol: Protocol,
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}/{}", self.namespace, self.name)
        } else {
            write!(f, "{}/{}:{}", self.namespace, self.name, self.port)
        }
    }
}

/// Everything the data path needs to know about one service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub name: ServicePortName,
    /// ClusterIPs, at most one per family.
    pub cluster_ips: Vec<IpAddr>,
    pub port: u16,
    pub node_port: Option<u16>,
    pub external_ips: Vec<IpAddr>,
    /// LoadBalancer ingress IPs (those with `ipMode: Proxy` are left out).
    pub load_balancer_ips: Vec<IpAddr>,
    pub load_balancer_source_ranges: Vec<Cidr>,
    /// ClientIP session affinity timeout, in seconds.
    pub affinity_timeout: Option<u32>,
    pub external_policy_local: bool,
    pub internal_policy_local: bool,
    pub health_check_node_port: Option<u16>,
    /// The Service's `metadata.creationTimestamp` (Unix seconds): when two Services claim
    /// one address and port, the older one owns it.
    pub created: Option<i64>,
    /// How new connections pick an endpoint, as the Service's
    /// `kube-nlproxy.io/load-balancing` annotation says; `None` without the annotation (the
    /// proxy's default applies).
    pub load_balancing: Option<LoadBalancing>,
}

/// How a service port spreads new connections over its endpoints (our extension; upstream
/// has only [`LoadBalancing::Random`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum LoadBalancing {
    /// Each new connection to a uniformly random endpoint, as upstream kube-proxy.
    #[default]
    Random,
    /// Maglev consistent hashing of the connection's addresses and ports: every node picks
    /// the same endpoint for the same connection, and a change of one endpoint of N moves
    /// about 1/N of the connections.
    Maglev,
}

impl LoadBalancing {
    /// The annotation's and the flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LoadBalancing::Random => "random",
            LoadBalancing::Maglev => "maglev",
        }
    }
    /// Parses the annotation's or the flag's value; `None` for anything else.
    pub fn parse(s: &str) -> Option<LoadBalancing> {
        match s {
            "random" => Some(LoadBalancing::Random),
            "maglev" => Some(LoadBalancing::Maglev),
            _ => None,
        }
    }
}

impl fmt::Display for LoadBalancing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ServicePort {
    /// A ClusterIP service port with Cluster traffic policies and nothing external; callers
    /// set what else they need.
    pub fn new(name: ServicePortName, cluster_ip: IpAddr, port: u16) -> ServicePort {
        ServicePort {
            name,
            cluster_ips: vec![cluster_ip],
            port,
            node_port: None,
            external_ips: vec![],
            load_balancer_ips: vec![],
            load_balancer_source_ranges: vec![],
            affinity_timeout: None,
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: None,
            created: None,
            load_balancing: None,
        }
    }

    /// Reachable from outside the cluster (NodePort, externalIPs or LoadBalancer IPs).
    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some()
            || !self.external_ips.is_empty()
            || !self.load_balancer_ips.is_empty()
    }
    /// Some traffic uses cluster-wide endpoints (upstream `UsesClusterEndpoints`): internal
    /// traffic under the Cluster policy, and any externally accessible port whatever its
    /// external policy. With externalTrafficPolicy Local, pods and the node itself reaching
    /// a NodePort, externalIP or LoadBalancer IP are short-circuited to the cluster-wide
    /// endpoints (as if the packet had gone out to a load balancer and come back), so the
    /// external chain needs them even when internalTrafficPolicy is Local too (issue #35.1:
    /// leaving them out left iTP Local + eTP Local NodePorts with no element at all).
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }
    /// Some traffic uses node-local endpoints only (upstream `UsesLocalEndpoints`).
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.externally_accessible() && self.external_policy_local)
    }
}

/// One endpoint of a service port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: u16,
    pub is_local: bool,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// Topology hints, usually none: one pointer, not two lists, so an endpoint is 32 bytes
    /// instead of 56 (10⁵ endpoints at 10k × 10, 10⁶ at 100k × 10: issue #18).
    pub hints: Option<Box<Hints>>,
}

/// An endpoint's topology hints (`hints.forZones`, `hints.forNodes`).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hints {
    pub zones: Box<[String]>,
    pub nodes: Box<[String]>,
}

impl Endpoint {
    /// A ready, serving, not terminating endpoint without topology hints.
    pub fn ready(ip: IpAddr, port: u16, is_local: bool) -> Endpoint {
        Endpoint {
            ip,
            port,
            is_local,
            ready: true,
            serving: true,
            terminating: false,
            hints: None,
        }
    }
    /// The zones this endpoint is hinted for (none without hints).
    pub fn zone_hints(&self) -> &[String] {
        self.hints.as_deref().map_or(&[], |h| &h.zones)
    }
    /// The nodes this endpoint is hinted for (none without hints).
    pub fn node_hints(&self) -> &[String] {
        self.hints.as_deref().map_or(&[], |h| &h.nodes)
    }
    /// Sets the hints; with neither zones nor nodes, none are kept.
    pub fn set_hints(&mut self, zones: Vec<String>, nodes: Vec<String>) {
        self.hints = (!zones.is_empty() || !nodes.is_empty()).then(|| {
            Box::new(Hints {
                zones: zones.into(),
                nodes: nodes.into(),
            })
        });
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(a) => write!(f, "{a}:{}", self.port),
            IpAddr::V6(a) => write!(f, "[{a}]:{}", self.port),
        }
    }
}

/// What this node knows about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// InternalIP/ExternalIP addresses from the Node's status, primary first.
    pub addresses: Vec<IpAddr>,
    pub pod_cidrs: Vec<Cidr>,
    /// Being deleted, or tainted `ToBeDeletedByClusterAutoscaler`: `/healthz` then reports
    /// the node as ineligible so load balancers drain it.
    pub being_deleted: bool,
}

impl NodeInfo {
    pub fn zone(&self) -> Option<&str> {
        self.labels
            .get("topology.kubernetes.io/zone")
            .map(String::as_str)
    }
}

/// The whole desired state: service ports and their endpoints, for both families.
///
/// Each service port and endpoint list is shared (`Arc`) with the source that converted it
/// and with the states built before: a state is assembled from what the source keeps, not
/// copied, and comparing two states (the proxier's change detector, once per sync) is a
/// pointer comparison for what did not change (`Arc`'s equality checks identity first for
/// `Eq` types). At 45k service ports the deep comparison took ~15 ms of a one-endpoint
/// change (issue #18).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyState {
    pub services: OrdMap<ServicePortName, Arc<ServicePort>>,
    pub endpoints: OrdMap<ServicePortName, Arc<Vec<Endpoint>>>,
    pub node: NodeInfo,
    /// `endpoints.kubernetes.io/last-change-trigger-time` of each service port's slices (the
    /// latest), for the network programming latency metric.
    pub trigger_times: OrdMap<ServicePortName, std::time::SystemTime>,
    /// The cluster's service CIDRs (the union of its ServiceCIDR objects): new connections to
    /// addresses inside them that no Service owns are dropped. Empty: nothing is dropped.
    pub service_cidrs: Vec<Cidr>,
    /// Which state this one follows and what changed since: lets a consumer that holds the
    /// state before look at the changed service ports only.
    pub lineage: Lineage,
}

impl ProxyState {
    /// The endpoints of `spn` (none when it has no slice).
    pub fn endpoints_of(&self, spn: &ServicePortName) -> &[Endpoint] {
        self.endpoints.get(spn).map_or(&[], |e| e.as_slice())
    }

    /// The service ports whose Service or endpoints may differ from `prev`, when this state
    /// says it follows `prev` directly (a superset: each still needs comparing). `None`:
    /// unknown, compare everything.
    pub fn changes_since(&self, prev: &ProxyState) -> Option<&BTreeSet<ServicePortName>> {
        let (since, keys) = self.lineage.changed_since.as_ref()?;
        (prev.lineage.generation != 0 && *since == prev.lineage.generation).then_some(&**keys)
    }
}

/// Where a state comes from: its number, and the service ports a source changed since the
/// state it published before. At 45k service ports, walking both states' maps to find one
/// changed endpoint took ~3.4 ms of a ~10 ms sync (cache misses over ~16k map nodes);
/// looking up the named ones takes microseconds (issue #18).
///
/// Bookkeeping, not content: two states with the same content are equal whatever their
/// lineage. A source that cannot say what changed (a relist, a Node or ServiceCIDR change,
/// the manifest source) leaves `changed_since` empty and consumers compare everything.
#[derive(Debug, Clone, Default)]
pub struct Lineage {
    /// Unique in the process; 0: not numbered.
    pub generation: u64,
    /// The generation of the state this one follows, and every service port whose Service
    /// or EndpointSlices changed since (Node and ServiceCIDR changes are not covered: a
    /// source sends none then).
    pub changed_since: Option<(u64, Arc<BTreeSet<ServicePortName>>)>,
}

impl Lineage {
    /// A number no other state of this process has.
    pub fn next_generation() -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }
}

impl PartialEq for Lineage {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for Lineage {}

/// The state as every mode sees it with upstream's `AllowServiceExternalIPs` gate off: no
/// service port has externalIPs (upstream's `ServicePort.ExternalIPs()` answers none then,
/// so no proxier, conntrack cleanup or health check sees them). Ports without externalIPs
/// keep their `Arc`, so a partial sync still finds them unchanged. One state alone; the
/// daemon's relay follows a sequence of states with [`ExternalIpsOff`]. Pure.
pub fn without_external_ips(state: &ProxyState) -> ProxyState {
    ExternalIpsOff::default().apply(state)
}

/// [`without_external_ips`] for a sequence of states, in proportion to what changed: the
/// relay every state passes through when `AllowServiceExternalIPs` is off. The first state
/// is walked whole; each later one is diffed against the one before (the API source's
/// states share all but the changed paths: microseconds at 100k service ports, where the
/// walk of every port was milliseconds per change), and only the ports that have
/// externalIPs are replaced, each by the same stripped copy until the diff says the port
/// changed, so the states downstream see no change where there was none. Pure.
#[derive(Debug, Default)]
pub struct ExternalIpsOff {
    /// The last input, and the stripped copy of each of its ports with externalIPs.
    last: Option<(ProxyState, Stripped)>,
}

impl ExternalIpsOff {
    /// `state` without externalIPs: the same as a fresh one would give, where the first
    /// state walks every port and the later ones follow the diff.
    pub fn apply(&mut self, state: &ProxyState) -> ProxyState {
        let stripped = match self.last.take() {
            Some((prev, mut stripped)) => {
                use imbl::ordmap::DiffItem;
                for d in prev.services.diff(&state.services) {
                    match d {
                        DiffItem::Add(k, sp) | DiffItem::Update { new: (k, sp), .. } => {
                            if sp.external_ips.is_empty() {
                                stripped.remove(k);
                            } else {
                                stripped.insert(k.clone(), strip(sp));
                            }
                        }
                        DiffItem::Remove(k, _) => {
                            stripped.remove(k);
                        }
                    }
                }
                stripped
            }
            None => state
                .services
                .iter()
                .filter(|(_, sp)| !sp.external_ips.is_empty())
                .map(|(k, sp)| (k.clone(), strip(sp)))
                .collect(),
        };
        let mut out = state.clone();
        for (k, off) in &stripped {
            out.services.insert(k.clone(), off.clone());
        }
        self.last = Some((state.clone(), stripped));
        out
    }
}

type Stripped = BTreeMap<ServicePortName, Arc<ServicePort>>;

fn strip(sp: &Arc<ServicePort>) -> Arc<ServicePort> {
    let mut p = (**sp).clone();
    p.external_ips.clear();
    Arc::new(p)
}

/// The change detector of every step of a sync that follows a change (the proxiers, the
/// stale-flow cleanup's destinations, the health-check and localhost plans, the
/// no-local-endpoint counts): the service ports whose Service or endpoints differ between
/// `prev` and `state`, or that only one of them has, in order, each once. An absent endpoint
/// list and an empty one are the same, and endpoints of a service port neither state has
/// change nothing.
///
/// When `state` names the service ports its source changed since `prev` (its [`Lineage`]),
/// only those are looked up and compared: at 45k service ports a walk over both states'
/// maps was ~3.4 ms of a one-endpoint change, the lookups are microseconds. Otherwise the
/// maps' diffs, which skip every subtree the two share (a state the API source publishes
/// shares all but the changed paths with the one before).
pub fn changed_service_ports<'a>(
    prev: &'a ProxyState,
    state: &'a ProxyState,
) -> Vec<&'a ServicePortName> {
    if std::ptr::eq(prev, state) {
        return Vec::new();
    }
    if let Some(named) = state.changes_since(prev) {
        return named
            .iter()
            .filter(|k| {
                let programmed = prev.services.contains_key(*k) || state.services.contains_key(*k);
                prev.services.get(*k) != state.services.get(*k)
                    || (programmed && prev.endpoints_of(k) != state.endpoints_of(k))
            })
            .collect();
    }
    let services = changed_keys(&prev.services, &state.services, |_| true);
    // An absent list and an empty one mean the same: no endpoints.
    let endpoints = changed_keys(&prev.endpoints, &state.endpoints, |e| !e.is_empty());
    let mut out = Vec::with_capacity(services.len() + endpoints.len());
    let (mut s, mut e) = (services.into_iter().peekable(), endpoints.into_iter());
    for k in e.by_ref() {
        while s.peek().is_some_and(|x| *x < k) {
            out.extend(s.next());
        }
        if s.peek() == Some(&k) {
            s.next();
        }
        // Endpoints of a service port that neither state has change nothing.
        if prev.services.contains_key(k) || state.services.contains_key(k) {
            out.push(k);
        }
    }
    out.extend(s);
    out
}

/// The keys of two maps whose values differ, or that only one has (counted only when
/// `counts` says its value matters): their diff, which skips every subtree the two maps
/// share, so states that share all but a few paths compare in O(changes × log n).
fn changed_keys<'a, V: Eq>(
    prev: &'a OrdMap<ServicePortName, Arc<V>>,
    next: &'a OrdMap<ServicePortName, Arc<V>>,
    counts: impl Fn(&V) -> bool,
) -> Vec<&'a ServicePortName> {
    use imbl::ordmap::DiffItem;
    prev.diff(next)
        .filter_map(|d| match d {
            DiffItem::Add(k, v) | DiffItem::Remove(k, v) => counts(v).then_some(k),
            DiffItem::Update { new: (k, _), .. } => Some(k),
        })
        .collect()
}

/// How many service ports changed between two states: (services, endpoint sets). These are
/// the counts behind the `sync_proxy_rules_*_changes` metrics.
pub fn count_changes(prev: &ProxyState, next: &ProxyState) -> (usize, usize) {
    if let Some(keys) = next.changes_since(prev) {
        let count =
            |differs: &dyn Fn(&ServicePortName) -> bool| keys.iter().filter(|k| differs(k)).count();
        return (
            count(&|k| prev.services.get(k) != next.services.get(k)),
            count(&|k| prev.endpoints.get(k) != next.endpoints.get(k)),
        );
    }
    (
        differing(&prev.services, &next.services),
        differing(&prev.endpoints, &next.endpoints),
    )
}

/// How many keys two maps disagree on (present in one only, or with other values): their
/// diff, which skips the subtrees two states share (a state the API source publishes
/// shares all but the changed paths with the one before).
fn differing<K: Ord + Clone, V: PartialEq + Clone>(a: &OrdMap<K, V>, b: &OrdMap<K, V>) -> usize {
    a.diff(b).count()
}

#[cfg(test)]
mod tests {
    use super::fixtures::synthetic_state;

    #[test]
    fn without_external_ips_clears_them_and_keeps_other_ports_shared() {
        let mut st = super::fixtures::web_state(Some(30080));
        let (name, web) = st
            .services
            .iter()
            .next()
            .map(|(k, v)| (k.clone(), v.clone()))
            .unwrap();
        let mut other = (*web).clone();
        other.name.name = "api".into();
        let other_name = other.name.clone();
        st.services.insert(other_name.clone(), Arc::new(other));
        let mut sp = (*web).clone();
        sp.external_ips = vec!["203.0.113.7".parse().unwrap()];
        st.services.insert(name.clone(), Arc::new(sp));
        let off = without_external_ips(&st);
        assert!(off.services[&name].external_ips.is_empty());
        assert_eq!(off.services[&name].node_port, Some(30080));
        assert!(Arc::ptr_eq(
            &off.services[&other_name],
            &st.services[&other_name]
        ));
    }

    use super::*;

    #[test]
    fn external_ips_off_follows_a_sequence_of_states_as_the_whole_walk_does() {
        let with_ips = |sp: &ServicePort, ip: &str| {
            let mut p = sp.clone();
            p.external_ips = vec![ip.parse().unwrap()];
            Arc::new(p)
        };
        let mut st = fixtures::synthetic_state(6, 2);
        let keys: Vec<ServicePortName> = st.services.keys().cloned().collect();
        let mut off = ExternalIpsOff::default();
        let mut states = Vec::new();
        // 0: one port with externalIPs from the start.
        st.services.insert(
            keys[0].clone(),
            with_ips(&st.services[&keys[0]], "203.0.113.1"),
        );
        states.push(st.clone());
        // 1: another gains them; 2: the first loses them; 3: the second's Service is
        // removed; 4: it comes back with others; 5: only endpoints change.
        st.services.insert(
            keys[1].clone(),
            with_ips(&st.services[&keys[1]], "203.0.113.2"),
        );
        states.push(st.clone());
        let mut plain = (*st.services[&keys[0]]).clone();
        plain.external_ips.clear();
        st.services.insert(keys[0].clone(), Arc::new(plain));
        states.push(st.clone());
        let removed = st.services.remove(&keys[1]).unwrap();
        states.push(st.clone());
        st.services
            .insert(keys[1].clone(), with_ips(&removed, "203.0.113.3"));
        states.push(st.clone());
        st.endpoints.remove(&keys[2]);
        states.push(st.clone());
        let mut last: Option<ProxyState> = None;
        for (i, s) in states.iter().enumerate() {
            let got = off.apply(s);
            assert_eq!(got, without_external_ips(s), "state {i}");
            assert!(got.services.values().all(|sp| sp.external_ips.is_empty()));
            if let Some(prev) = &last {
                // A port that did not change keeps its stripped copy.
                if s.services.get(&keys[1]) == states[i - 1].services.get(&keys[1]) {
                    if let (Some(a), Some(b)) =
                        (prev.services.get(&keys[1]), got.services.get(&keys[1]))
                    {
                        assert!(Arc::ptr_eq(a, b), "state {i}: the same copy");
                    }
                }
            }
            last = Some(got);
        }
    }

    #[test]
    fn count_changes_counts_added_removed_and_changed_ports_once_each() {
        let prev = fixtures::synthetic_state(5, 2);
        let mut next = prev.clone();
        let first = prev.services.keys().next().unwrap().clone();
        let last = prev.services.keys().next_back().unwrap().clone();
        next.services.remove(&first); // removed: its endpoints too
        next.endpoints.remove(&first);
        std::sync::Arc::make_mut(next.services.get_mut(&last).unwrap()).port = 81; // changed
        let mut added = ServicePort::new(
            ServicePortName {
                port: "extra".into(),
                ..last.clone()
            },
            fixtures::cluster_ip(9).into(),
            80,
        );
        added.node_port = Some(30080);
        next.services.insert(added.name.clone(), added.into());
        std::sync::Arc::make_mut(next.endpoints.get_mut(&last).unwrap()).pop(); // changed endpoints
        assert_eq!(count_changes(&prev, &next), (3, 2));
        assert_eq!(count_changes(&next, &prev), (3, 2));
        assert_eq!(count_changes(&prev, &prev), (0, 0));
    }

    /// 10⁵ endpoints at 10k × 10, in every state: each stays within 32 bytes (56 with its
    /// hints as two boxed slices, 72 as two vectors).
    #[test]
    fn an_endpoint_is_small() {
        assert!(std::mem::size_of::<Endpoint>() <= 32);
    }

    #[test]
    fn an_endpoint_without_hints_keeps_none() {
        let mut e = Endpoint::ready("10.0.0.1".parse().unwrap(), 80, false);
        e.set_hints(vec![], vec![]);
        assert!(e.hints.is_none());
        e.set_hints(vec!["zone-a".into()], vec![]);
        assert_eq!(e.zone_hints(), ["zone-a"]);
        assert!(e.node_hints().is_empty());
    }

    #[test]
    fn the_change_detector_reports_each_changed_service_port_once_and_nothing_else() {
        let prev = synthetic_state(6, 2);
        let keys: Vec<ServicePortName> = prev.services.keys().cloned().collect();
        // A copy shares every service port and list: nothing changed.
        assert!(changed_service_ports(&prev, &prev.clone()).is_empty());
        // Equal content in new allocations is no change either.
        let mut rebuilt = prev.clone();
        rebuilt.services = prev
            .services
            .iter()
            .map(|(k, v)| (k.clone(), Arc::new((**v).clone())))
            .collect();
        rebuilt.endpoints = prev
            .endpoints
            .iter()
            .map(|(k, v)| (k.clone(), Arc::new((**v).clone())))
            .collect();
        assert!(changed_service_ports(&prev, &rebuilt).is_empty());
        // An absent endpoint list and an empty one are the same.
        let mut emptied = prev.clone();
        emptied.endpoints.insert(keys[0].clone(), Arc::new(vec![]));
        let mut absent = prev.clone();
        absent.endpoints.remove(&keys[0]);
        assert!(changed_service_ports(&emptied, &absent).is_empty());
        // Removed, changed Service, changed endpoints (also on a removed one), added.
        let mut next = prev.clone();
        next.services.remove(&keys[1]);
        next.endpoints.remove(&keys[1]);
        Arc::make_mut(next.services.get_mut(&keys[2]).unwrap()).port = 81;
        Arc::make_mut(next.endpoints.get_mut(&keys[4]).unwrap()).pop();
        Arc::make_mut(next.services.get_mut(&keys[4]).unwrap()).port = 82;
        let added = ServicePortName {
            port: "extra".into(),
            ..keys[5].clone()
        };
        next.services.insert(
            added.clone(),
            Arc::new(crate::model::ServicePort::new(
                added.clone(),
                "10.96.9.9".parse().unwrap(),
                80,
            )),
        );
        // Endpoints for a service port neither state has: nothing to program.
        let orphan = ServicePortName {
            name: "no-such-service".into(),
            ..keys[0].clone()
        };
        next.endpoints
            .insert(orphan, Arc::new(prev.endpoints[&keys[0]].to_vec()));
        let mut want = vec![&keys[1], &keys[2], &keys[4], &added];
        want.sort();
        assert_eq!(changed_service_ports(&prev, &next), want);
        let mut back = changed_service_ports(&next, &prev);
        back.sort();
        assert_eq!(back, want);
    }

    #[test]
    fn a_state_that_names_its_changes_since_the_last_one_is_compared_there_only() {
        use crate::model::Lineage;
        let mut prev = synthetic_state(6, 2);
        prev.lineage.generation = Lineage::next_generation();
        let keys: Vec<ServicePortName> = prev.services.keys().cloned().collect();
        let mut next = prev.clone();
        next.lineage.generation = Lineage::next_generation();
        Arc::make_mut(next.endpoints.get_mut(&keys[2]).unwrap()).pop();
        Arc::make_mut(next.services.get_mut(&keys[4]).unwrap()).port = 81;
        let names = |ks: &[&ServicePortName]| {
            Some((
                prev.lineage.generation,
                Arc::new(ks.iter().map(|k| (*k).clone()).collect()),
            ))
        };
        // Named: the changed ones and one that did not change (names are a superset).
        next.lineage.changed_since = names(&[&keys[2], &keys[3], &keys[4]]);
        assert_eq!(changed_service_ports(&prev, &next), [&keys[2], &keys[4]]);
        // Only what is named is looked at: the names are the source's word.
        next.lineage.changed_since = names(&[&keys[4]]);
        assert_eq!(changed_service_ports(&prev, &next), [&keys[4]]);
        // Names relative to another state are no use: everything is compared.
        next.lineage.changed_since = Some((Lineage::next_generation(), Arc::default()));
        assert_eq!(changed_service_ports(&prev, &next), [&keys[2], &keys[4]]);
        // The same state again: nothing to compare.
        assert!(changed_service_ports(&next, &next).is_empty());
    }
}
