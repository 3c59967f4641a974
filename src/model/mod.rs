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

/// The service ports whose Service or endpoints differ between two states: the diffs of
/// their maps, which skip every subtree the two share (a state the API source publishes
/// shares all but the changed paths with the one before: microseconds at 100k service
/// ports, where a walk of both took milliseconds).
pub fn changed_service_ports<'a>(
    prev: &'a ProxyState,
    next: &'a ProxyState,
) -> BTreeSet<&'a ServicePortName> {
    use imbl::ordmap::DiffItem;
    fn key<'k, V>(d: DiffItem<'k, 'k, ServicePortName, V>) -> &'k ServicePortName {
        match d {
            DiffItem::Add(k, _) | DiffItem::Remove(k, _) => k,
            DiffItem::Update { new: (k, _), .. } => k,
        }
    }
    prev.services
        .diff(&next.services)
        .map(key)
        .chain(prev.endpoints.diff(&next.endpoints).map(key))
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
}
