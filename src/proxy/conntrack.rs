//! Which conntrack entries are stale (upstream `pkg/proxy/conntrack/cleanup.go` of v1.37.2,
//! and kubernetes#141371 after it): for UDP and SCTP service ports, an entry whose original
//! destination is a service IP and port (ClusterIP, externalIP, LoadBalancer IP), or whose
//! destination port is a NodePort, and whose reply source is not a serving endpoint of that
//! service port. That covers endpoints that went away or stopped serving, entries created
//! while a Service had no endpoints (their reply source is the service IP itself), and every
//! entry to the service IPs of a port that has no serving endpoint left (kubernetes#139628:
//! a one-way sender such as statsd refreshes its entry with every packet, so it would stay
//! DNATed to the dead endpoint and never meet the no-endpoints reject). A NodePort is judged
//! only while its port has a serving endpoint: it matches on the port number alone, so with
//! nothing to compare against it would take flows that are not ours. The service IPs and
//! ports of a service port that was deleted are judged the same way, with no endpoint at all
//! (kubernetes#141371), until one cleanup of their family and protocol has succeeded.
//! "Serving" is the endpoint's own condition, not where this node would send a new
//! connection: a flow to a pod that is terminating but still serving, or to an endpoint that
//! traffic policy or topology hints now route elsewhere, keeps going, as a TCP connection
//! would (issue #35.2). Every other entry is left alone. Pure, except
//! [`reconcile_conntrack`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::kernel::nft::Family;
use crate::model::{Protocol, ProxyState, ServicePort, ServicePortName};

use crate::kernel::conntrack::{Conntrack, Flow};

use super::SyncStats;

/// The protocols whose entries need cleaning (TCP connections reset on their own).
pub const PROTOCOLS: [Protocol; 2] = [Protocol::Udp, Protocol::Sctp];

/// Endpoints by address and port, as a conntrack entry's reply source names them.
pub(crate) type Endpoints = BTreeSet<(IpAddr, u16)>;

/// The serving endpoints per service destination, for one family and protocol.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ServiceDestinations {
    by_ip_port: BTreeMap<(IpAddr, u16), Endpoints>,
    by_node_port: BTreeMap<u16, Endpoints>,
}

impl ServiceDestinations {
    pub fn is_empty(&self) -> bool {
        self.by_ip_port.is_empty() && self.by_node_port.is_empty()
    }

    /// Adds `eps` to the endpoints of every destination of `sp` in `family`: its ClusterIPs,
    /// externalIPs and LoadBalancer IPs with its port, and its NodePort while `eps` is not
    /// empty (an empty set would judge every flow to that port number on any address).
    pub(crate) fn add(&mut self, sp: &ServicePort, family: Family, eps: &Endpoints) {
        for ip_port in service_ip_ports(sp, family) {
            self.by_ip_port.entry(ip_port).or_default().extend(eps);
        }
        if let Some(np) = sp.node_port.filter(|_| !eps.is_empty()) {
            self.by_node_port.entry(np).or_default().extend(eps);
        }
    }

    /// The endpoints of the service a flow was made to. A flow to a service IP and port is
    /// judged by that service alone, even when its port number is also some NodePort.
    pub(crate) fn of_flow(&self, f: &Flow) -> Option<&Endpoints> {
        self.by_ip_port
            .get(&(f.orig_dst, f.orig_dport))
            .or_else(|| self.by_node_port.get(&f.orig_dport))
    }
}

/// The service IPs of `sp` in `family` (ClusterIPs, externalIPs, LoadBalancer IPs), each with
/// the service port.
fn service_ip_ports(sp: &ServicePort, family: Family) -> impl Iterator<Item = (IpAddr, u16)> + '_ {
    sp.cluster_ips
        .iter()
        .chain(&sp.external_ips)
        .chain(&sp.load_balancer_ips)
        .filter(move |ip| Family::of(ip) == family)
        .map(|ip| (*ip, sp.port))
}

/// The service IPs and ports of deleted service ports, for one family and protocol: every
/// entry to them is stale unless a service port of the current state claims the same IP and
/// port.
pub type GoneFrontends = BTreeSet<(IpAddr, u16)>;

/// Collects service destinations of `proto` in `family`.
pub fn service_destinations(
    state: &ProxyState,
    family: Family,
    proto: Protocol,
) -> ServiceDestinations {
    let mut d = ServiceDestinations::default();
    for (spn, sp) in &state.services {
        if spn.protocol != proto {
            continue;
        }
        // Every serving endpoint of the family, whatever the policies, the topology or
        // terminating say (upstream: "Changes to the service should not affect existing
        // flows").
        let serving: Endpoints = state
            .endpoints_of(spn)
            .iter()
            .filter(|e| e.serving && Family::of(&e.ip) == family)
            .map(|e| (e.ip, e.port))
            .collect();
        // No serving endpoint: every entry to the service IPs is stale (v1.37's
        // TestServiceWithoutEndpoints); the NodePort is left out (see `add`).
        d.add(sp, family, &serving);
    }
    d
}

/// The entries to delete among `flows` (all of one family and protocol). A flow to a service
/// IP and port of the current state is judged by that service port; one to a deleted
/// service port's IP and port (`gone`) is stale; otherwise one to a NodePort is judged by
/// that NodePort's service port. The order matters where numbers collide: a flow to a
/// service IP belongs to that IP's service, even when its port is also some NodePort.
pub fn stale_flows(dests: &ServiceDestinations, gone: &GoneFrontends, flows: &[Flow]) -> Vec<Flow> {
    let is_stale = |f: &Flow| {
        let answered_by = (f.reply_src, f.reply_sport);
        if let Some(eps) = dests.by_ip_port.get(&(f.orig_dst, f.orig_dport)) {
            return !eps.contains(&answered_by);
        }
        if gone.contains(&(f.orig_dst, f.orig_dport)) {
            return true;
        }
        dests
            .by_node_port
            .get(&f.orig_dport)
            .is_some_and(|eps| !eps.contains(&answered_by))
    };
    flows.iter().filter(|f| is_stale(f)).cloned().collect()
}

/// [`service_destinations`] of each family and protocol, kept between syncs. A state whose
/// service ports changed since the last one only where they are TCP (the protocol is part
/// of a service port's key, and of its endpoints' key) has the same destinations, so they
/// are not worked out again: the walk of every service port, once per family and protocol,
/// was 15% of ours' CPU during churn at 100k service ports. The frontends of UDP and SCTP
/// service ports deleted since the state before are kept per family and protocol until a
/// cleanup of theirs succeeds ([`Destinations::cleaned`]), so a failed cleanup is retried at
/// the next sync as for the rest. Pure.
#[derive(Debug, Default)]
pub struct Destinations {
    /// The state they were last worked out for (or found the same for), and per family
    /// and protocol, in `families` × [`PROTOCOLS`] order, the destinations.
    last: Option<(ProxyState, Vec<Family>, Vec<ServiceDestinations>)>,
    /// The frontends of deleted service ports not yet cleaned.
    gone: DeletedFrontends,
}

/// The frontends of deleted service ports not yet cleaned, by family and protocol.
#[derive(Debug, Default)]
pub struct DeletedFrontends(BTreeMap<(Family, Protocol), GoneFrontends>);

impl DeletedFrontends {
    /// Those of `family` and `proto`.
    pub fn of(&self, family: Family, proto: Protocol) -> &GoneFrontends {
        static NONE: GoneFrontends = BTreeSet::new();
        self.0.get(&(family, proto)).unwrap_or(&NONE)
    }
}

impl Destinations {
    /// The destinations of `state` in `families` × [`PROTOCOLS`] order, and the frontends
    /// of service ports deleted since then that are not cleaned yet.
    pub fn of(
        &mut self,
        state: &ProxyState,
        families: &[Family],
    ) -> (&[ServiceDestinations], &DeletedFrontends) {
        let last = self.last.take();
        let same = last.as_ref().is_some_and(|(prev, fams, _)| {
            let changed: Vec<&ServicePortName> = crate::model::changed_service_ports(prev, state)
                .into_iter()
                .filter(|k| PROTOCOLS.contains(&k.protocol))
                .collect();
            self.note_deleted(prev, state, &changed, families);
            fams == families && changed.is_empty()
        });
        let last = match last {
            Some((_, fams, dests)) if same => (state.clone(), fams, dests),
            _ => {
                let dests = families
                    .iter()
                    .flat_map(|f| PROTOCOLS.map(|p| service_destinations(state, *f, p)))
                    .collect();
                (state.clone(), families.to_vec(), dests)
            }
        };
        (&self.last.insert(last).2, &self.gone)
    }

    /// The cleanup of `family` and `proto` succeeded: their deleted frontends are done.
    pub fn cleaned(&mut self, family: Family, proto: Protocol) {
        self.gone.0.remove(&(family, proto));
    }

    /// Remembers the service IPs and ports in `families` of the service ports among `changed`
    /// that `prev` had and `now` has not.
    fn note_deleted(
        &mut self,
        prev: &ProxyState,
        now: &ProxyState,
        changed: &[&ServicePortName],
        families: &[Family],
    ) {
        for spn in changed {
            let (Some(sp), None) = (prev.services.get(*spn), now.services.get(*spn)) else {
                continue;
            };
            for &family in families {
                let gone = self.gone.0.entry((family, spn.protocol)).or_default();
                gone.extend(service_ip_ports(sp, family));
            }
        }
        self.gone.0.retain(|_, g| !g.is_empty());
    }
}

/// Deletes conntrack entries that point at endpoints the state no longer serves. A failure
/// is logged and retried at the next sync; it never undoes the rules.
pub fn reconcile_conntrack(
    ct: &mut (dyn Conntrack + Send),
    state: &ProxyState,
    (families, destinations): (&[Family], &mut Destinations),
    stats: &mut SyncStats,
) {
    let t0 = std::time::Instant::now();
    let (all, deleted) = destinations.of(state, families);
    let each = families
        .iter()
        .flat_map(|f| PROTOCOLS.map(|p| (*f, p)))
        .zip(all);
    let mut cleaned = Vec::new();
    for ((family, proto), dests) in each {
        let gone = deleted.of(family, proto);
        if dests.is_empty() && gone.is_empty() {
            continue;
        }
        let res = ct
            .list(family, proto.number())
            .and_then(|flows| ct.delete(&stale_flows(dests, gone, &flows)));
        match res {
            Ok(n) => {
                stats.count_conntrack_deleted(family, n);
                cleaned.push((family, proto));
            }
            Err(e) => {
                tracing::warn!(%family, proto = proto.lower(), err = %e, "conntrack cleanup failed")
            }
        }
    }
    for (family, proto) in cleaned {
        destinations.cleaned(family, proto);
    }
    stats.conntrack_duration = Some(t0.elapsed());
    if stats.conntrack_deleted > 0 {
        tracing::info!(
            deleted = stats.conntrack_deleted,
            "deleted stale conntrack entries"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, NodeInfo, ServicePort, ServicePortName};

    fn state(eps: &[&str]) -> ProxyState {
        let spn = ServicePortName {
            namespace: "ns".into(),
            name: "dns".into(),
            port: "dns".into(),
            protocol: Protocol::Udp,
        };
        let mut st = ProxyState {
            node: NodeInfo {
                name: "n1".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        st.services.insert(
            spn.clone(),
            ServicePort {
                node_port: Some(30053),
                ..ServicePort::new(spn.clone(), "10.96.0.53".parse().unwrap(), 53)
            }
            .into(),
        );
        st.endpoints.insert(
            spn,
            eps.iter()
                .map(|ip| Endpoint::ready(ip.parse().unwrap(), 5353, true))
                .collect::<Vec<_>>()
                .into(),
        );
        st
    }

    /// No service port deleted.
    static NO_GONE: GoneFrontends = BTreeSet::new();

    fn flow(dst: &str, dport: u16, reply_src: &str, reply_sport: u16) -> Flow {
        crate::kernel::conntrack::test_flow(17, dst, dport, reply_src, reply_sport)
    }

    #[test]
    fn destinations_are_kept_across_tcp_changes_and_worked_out_again_on_udp_ones() {
        let fams = [Family::Ip, Family::Ip6];
        let whole = |st: &ProxyState| -> Vec<ServiceDestinations> {
            fams.iter()
                .flat_map(|f| PROTOCOLS.map(|p| service_destinations(st, *f, p)))
                .collect()
        };
        let mut cache = Destinations::default();
        let mut st = state(&["10.244.2.2"]);
        assert_eq!(cache.of(&st, &fams).0, whole(&st));
        // A TCP port with endpoints comes and goes: the same destinations.
        let tcp = ServicePortName {
            namespace: "ns".into(),
            name: "web".into(),
            port: "http".into(),
            protocol: Protocol::Tcp,
        };
        st.services.insert(
            tcp.clone(),
            ServicePort::new(tcp.clone(), "10.96.0.80".parse().unwrap(), 80).into(),
        );
        st.endpoints.insert(
            tcp.clone(),
            vec![Endpoint::ready("10.244.3.3".parse().unwrap(), 8080, true)].into(),
        );
        assert_eq!(cache.of(&st, &fams).0, whole(&st));
        st.endpoints.remove(&tcp);
        assert_eq!(cache.of(&st, &fams).0, whole(&st));
        // The UDP port's endpoints move: worked out again.
        let udp = st.endpoints.keys().next().unwrap().clone();
        st.endpoints.insert(
            udp,
            vec![Endpoint::ready("10.244.9.9".parse().unwrap(), 5353, true)].into(),
        );
        let got = cache.of(&st, &fams).0;
        assert_eq!(got, whole(&st));
        assert!(got[0]
            .of_flow(&flow("10.96.0.53", 53, "10.244.9.9", 5353))
            .is_some_and(|eps| eps.contains(&("10.244.9.9".parse().unwrap(), 5353))));
        // Other families: worked out for them.
        assert_eq!(cache.of(&st, &fams[..1]).0, &whole(&st)[..2]);
    }

    #[test]
    fn entries_to_removed_endpoints_are_stale() {
        let d = service_destinations(&state(&["10.244.2.2"]), Family::Ip, Protocol::Udp);
        let gone = flow("10.96.0.53", 53, "10.244.1.2", 5353);
        let live = flow("10.96.0.53", 53, "10.244.2.2", 5353);
        assert_eq!(stale_flows(&d, &NO_GONE, &[gone.clone(), live]), vec![gone]);
    }

    #[test]
    fn entries_from_when_there_were_no_endpoints_are_stale() {
        let d = service_destinations(&state(&["10.244.2.2"]), Family::Ip, Protocol::Udp);
        let unnatted = flow("10.96.0.53", 53, "10.96.0.53", 53);
        assert_eq!(
            stale_flows(&d, &NO_GONE, std::slice::from_ref(&unnatted)),
            vec![unnatted]
        );
    }

    #[test]
    fn node_port_entries_are_checked_too() {
        let d = service_destinations(&state(&["10.244.2.2"]), Family::Ip, Protocol::Udp);
        let gone = flow("192.168.0.2", 30053, "10.244.1.2", 5353);
        let live = flow("192.168.0.2", 30053, "10.244.2.2", 5353);
        assert_eq!(stale_flows(&d, &NO_GONE, &[gone.clone(), live]), vec![gone]);
    }

    #[test]
    fn a_service_port_equal_to_some_node_port_is_judged_by_its_own_service() {
        let mut st = state(&["10.244.2.2"]);
        // A second UDP service whose port happens to equal the first one's NodePort.
        let mut other = (**st.services.values().next().unwrap()).clone();
        other.name.name = "other".into();
        other.cluster_ips = vec!["10.96.0.99".parse().unwrap()];
        other.port = 30053;
        other.node_port = None;
        st.endpoints.insert(
            other.name.clone(),
            st.endpoints
                .values()
                .next()
                .unwrap()
                .iter()
                .map(|e| {
                    let mut e = e.clone();
                    e.ip = "10.244.9.9".parse().unwrap();
                    e
                })
                .collect::<Vec<_>>()
                .into(),
        );
        st.services.insert(other.name.clone(), other.into());
        let d = service_destinations(&st, Family::Ip, Protocol::Udp);
        let live = flow("10.96.0.99", 30053, "10.244.9.9", 5353);
        assert!(stale_flows(&d, &NO_GONE, &[live]).is_empty());
    }

    /// Upstream's `pkg/proxy/conntrack/cleanup_test.go` fixture: the addresses and ports of
    /// its one service port, `test/cleanup-test`.
    mod upstream_fixture {
        pub const CLUSTER_IP: &str = "172.30.1.1";
        pub const EXTERNAL_IP: &str = "192.168.99.100";
        pub const LB_IP: &str = "1.2.3.4";
        pub const SERVING: &str = "10.240.0.4";
        pub const NOT_SERVING: &str = "10.240.1.5";
        pub const DELETED: &str = "10.240.2.6";
        // The endpoint moved from 8080 to 9090 keeping its address (upstream's
        // testOldEndpointPort); 3000 is a port of the service IPs that is not the service's.
        pub const OLD_EP_PORT: u16 = 8080;
        pub const EP_PORT: u16 = 9090;
        pub const SVC_PORT: u16 = 8000;
        pub const NODE_PORT: u16 = 32000;
        pub const OTHER_PORT: u16 = 3000;
    }

    /// A state with upstream's fixture service port of `proto` (ClusterIP, externalIP,
    /// LoadBalancer IP, NodePort) and no endpoints yet; its name.
    fn upstream_service(proto: Protocol) -> (ProxyState, ServicePortName) {
        use upstream_fixture::*;
        let spn = ServicePortName {
            namespace: "test".into(),
            name: "cleanup-test".into(),
            port: "test".into(),
            protocol: proto,
        };
        let mut st = ProxyState::default();
        let sp = ServicePort {
            node_port: Some(NODE_PORT),
            external_ips: vec![EXTERNAL_IP.parse().unwrap()],
            load_balancer_ips: vec![LB_IP.parse().unwrap()],
            ..ServicePort::new(spn.clone(), CLUSTER_IP.parse().unwrap(), SVC_PORT)
        };
        st.services.insert(spn.clone(), sp.into());
        (st, spn)
    }

    /// Upstream's `TestCleanStaleEntries` (`pkg/proxy/conntrack/cleanup_test.go`): one
    /// service port with a ClusterIP, an externalIP, a LoadBalancer IP and a NodePort; a
    /// serving endpoint, a not-serving one and one deleted. For each protocol we clean (UDP,
    /// SCTP), entries to the service port answered by anything but the serving endpoint
    /// (also by it on its old port, and by the service IP itself: never DNATed) go; entries
    /// to another port of those addresses stay.
    #[test]
    fn upstream_clean_stale_entries_table() {
        use upstream_fixture::*;
        for proto in PROTOCOLS {
            let (mut st, spn) = upstream_service(proto);
            let not_serving = Endpoint {
                ready: false,
                serving: false,
                ..Endpoint::ready(NOT_SERVING.parse().unwrap(), EP_PORT, false)
            };
            st.endpoints.insert(
                spn,
                vec![
                    Endpoint::ready(SERVING.parse().unwrap(), EP_PORT, false),
                    not_serving,
                ]
                .into(),
            );
            let f = |dst: &str, dport, reply: &str, rport| Flow {
                proto: proto.number(),
                ..flow(dst, dport, reply, rport)
            };
            let (mut stale, mut kept) = (Vec::new(), Vec::new());
            for dst in [CLUSTER_IP, LB_IP, EXTERNAL_IP] {
                stale.push(f(dst, SVC_PORT, SERVING, OLD_EP_PORT));
                for reply in [SERVING, NOT_SERVING, DELETED] {
                    let e = f(dst, SVC_PORT, reply, EP_PORT);
                    if reply == SERVING {
                        kept.push(e)
                    } else {
                        stale.push(e)
                    }
                    kept.push(f(dst, OTHER_PORT, reply, EP_PORT));
                }
                stale.push(f(dst, SVC_PORT, dst, SVC_PORT));
                kept.push(f(dst, OTHER_PORT, dst, OTHER_PORT));
            }
            for reply in [SERVING, NOT_SERVING, DELETED] {
                let e = f("192.168.0.2", NODE_PORT, reply, EP_PORT);
                if reply == SERVING {
                    kept.push(e)
                } else {
                    stale.push(e)
                }
            }
            let d = service_destinations(&st, Family::Ip, proto);
            let all: Vec<Flow> = stale.iter().chain(&kept).cloned().collect();
            assert_eq!(stale_flows(&d, &NO_GONE, &all), stale, "{proto:?}");
            // TCP entries are never judged: the service port is not TCP.
            assert!(service_destinations(&st, Family::Ip, Protocol::Tcp).is_empty());
        }
    }

    /// v1.37.2's `TestServiceWithoutEndpoints` (kubernetes#139628, fixed by #139629): a UDP
    /// service port with no serving endpoint (its only slice names another Service) loses
    /// every entry to its ClusterIP, LoadBalancer IP and externalIP, whoever answers them;
    /// entries to another port of those addresses and to its NodePort (matched on the port
    /// alone) stay.
    #[test]
    fn upstream_service_without_endpoints_table() {
        use upstream_fixture::*;
        for proto in PROTOCOLS {
            let (st, _) = upstream_service(proto);
            let f = |dst: &str, dport, reply: &str| Flow {
                proto: proto.number(),
                ..flow(dst, dport, reply, EP_PORT)
            };
            let mut stale = Vec::new();
            for dst in [CLUSTER_IP, LB_IP, EXTERNAL_IP] {
                for reply in [SERVING, DELETED] {
                    stale.push(f(dst, SVC_PORT, reply));
                }
            }
            let kept = [
                f(EXTERNAL_IP, OTHER_PORT, DELETED),
                f("192.168.0.2", NODE_PORT, DELETED),
            ];
            let d = service_destinations(&st, Family::Ip, proto);
            let all: Vec<Flow> = stale.iter().chain(&kept).cloned().collect();
            assert_eq!(stale_flows(&d, &NO_GONE, &all), stale, "{proto:?}");
        }
    }

    /// A service port with endpoints that are all not serving is a service port without
    /// serving endpoints.
    #[test]
    fn a_service_whose_endpoints_all_stopped_serving_loses_its_entries() {
        let mut st = state(&["10.244.2.2"]);
        for e in crate::model::fixtures::first_endpoints_mut(&mut st) {
            (e.ready, e.serving, e.terminating) = (false, false, true);
        }
        let d = service_destinations(&st, Family::Ip, Protocol::Udp);
        let to_it = flow("10.96.0.53", 53, "10.244.2.2", 5353);
        assert_eq!(
            stale_flows(&d, &NO_GONE, std::slice::from_ref(&to_it)),
            vec![to_it]
        );
    }

    /// kubernetes#141371 (after v1.37.2): a deleted UDP service port's entries to its service
    /// IPs go, its NodePort's stay; until one cleanup of the family and protocol succeeds.
    #[test]
    fn a_deleted_service_port_loses_its_entries_until_a_cleanup_succeeds() {
        let fams = [Family::Ip, Family::Ip6];
        let mut cache = Destinations::default();
        let before = state(&["10.244.2.2"]);
        let (_, deleted) = cache.of(&before, &fams);
        assert!(deleted.of(Family::Ip, Protocol::Udp).is_empty());
        let mut after = before.clone();
        after.services.clear();
        after.endpoints.clear();
        let (dests, deleted) = cache.of(&after, &fams);
        let gone = deleted.of(Family::Ip, Protocol::Udp);
        assert_eq!(
            gone,
            &GoneFrontends::from([("10.96.0.53".parse().unwrap(), 53)])
        );
        assert!(deleted.of(Family::Ip6, Protocol::Udp).is_empty());
        assert!(deleted.of(Family::Ip, Protocol::Sctp).is_empty());
        let to_service = flow("10.96.0.53", 53, "10.244.2.2", 5353);
        let to_node_port = flow("192.168.0.2", 30053, "10.244.2.2", 5353);
        let other_port = flow("10.96.0.53", 54, "10.244.2.2", 5353);
        assert_eq!(
            stale_flows(
                &dests[0],
                gone,
                &[to_service.clone(), to_node_port, other_port]
            ),
            vec![to_service]
        );
        // A failed cleanup keeps them for the next sync; a successful one ends them.
        assert!(!cache
            .of(&after, &fams)
            .1
            .of(Family::Ip, Protocol::Udp)
            .is_empty());
        cache.cleaned(Family::Ip, Protocol::Udp);
        assert!(cache
            .of(&after, &fams)
            .1
            .of(Family::Ip, Protocol::Udp)
            .is_empty());
    }

    #[test]
    fn a_deleted_service_ports_address_claimed_again_is_judged_by_the_new_one() {
        let fams = [Family::Ip];
        let mut cache = Destinations::default();
        let before = state(&["10.244.2.2"]);
        cache.of(&before, &fams);
        // The Service is deleted and one named otherwise takes its ClusterIP and port.
        let mut after = state(&["10.244.7.7"]);
        let (spn, sp) = after.services.iter().next().unwrap();
        let (mut spn, sp) = (spn.clone(), (**sp).clone());
        let eps = after.endpoints.remove(&spn).unwrap();
        after.services.clear();
        spn.name = "dns-again".into();
        after.services.insert(spn.clone(), sp.into());
        after.endpoints.insert(spn, eps);
        let (dests, deleted) = cache.of(&after, &fams);
        let gone = deleted.of(Family::Ip, Protocol::Udp);
        assert!(!gone.is_empty(), "the old one was deleted");
        let to_new = flow("10.96.0.53", 53, "10.244.7.7", 5353);
        let to_old = flow("10.96.0.53", 53, "10.244.2.2", 5353);
        assert_eq!(
            stale_flows(&dests[0], gone, &[to_new, to_old.clone()]),
            vec![to_old]
        );
    }

    /// The whole cleanup over a fake table: entries of a deleted Service go in the sync after
    /// its deletion; one whose cleanup failed goes in the next successful one.
    #[test]
    fn reconcile_deletes_a_deleted_services_entries_and_retries_after_a_failure() {
        struct Flaky {
            table: crate::kernel::conntrack::FakeConntrack,
            fail: bool,
        }
        impl Conntrack for Flaky {
            fn list(
                &mut self,
                family: Family,
                proto: u8,
            ) -> Result<Vec<Flow>, crate::kernel::conntrack::Error> {
                if self.fail {
                    return Err(crate::kernel::netlink::Error::Io {
                        op: "recv",
                        source: std::io::Error::from_raw_os_error(libc::ENOBUFS),
                    }
                    .into());
                }
                self.table.list(family, proto)
            }
            fn delete(&mut self, flows: &[Flow]) -> Result<usize, crate::kernel::conntrack::Error> {
                self.table.delete(flows)
            }
        }
        let fams = [Family::Ip];
        let mut dests = Destinations::default();
        let before = state(&["10.244.2.2"]);
        let live = flow("10.96.0.53", 53, "10.244.2.2", 5353);
        let mut ct = Flaky {
            table: crate::kernel::conntrack::FakeConntrack {
                flows: vec![live.clone()],
            },
            fail: false,
        };
        let mut stats = SyncStats::default();
        reconcile_conntrack(&mut ct, &before, (&fams, &mut dests), &mut stats);
        assert_eq!(
            ct.table.flows,
            vec![live.clone()],
            "a serving endpoint's flow"
        );
        let mut after = before.clone();
        after.services.clear();
        after.endpoints.clear();
        ct.fail = true;
        reconcile_conntrack(&mut ct, &after, (&fams, &mut dests), &mut stats);
        assert_eq!(ct.table.flows, vec![live], "the listing failed");
        ct.fail = false;
        let mut stats = SyncStats::default();
        reconcile_conntrack(&mut ct, &after, (&fams, &mut dests), &mut stats);
        assert!(ct.table.flows.is_empty(), "retried: {:?}", ct.table.flows);
        assert_eq!(stats.conntrack_deleted, 1);
    }

    /// Issue #35.2: what this node would pick for a new connection (ready before
    /// terminating, local under a Local policy, this zone's hints) never deletes a flow to
    /// an endpoint that is still serving. One remote endpoint, one local; each test moves
    /// the remote one out of what new connections may use.
    fn mixed(
        edit: impl FnOnce(&mut ServicePort, &mut Endpoint, &mut ProxyState),
    ) -> ServiceDestinations {
        let mut st = state(&["10.244.2.2"]);
        let spn = st.services.keys().next().unwrap().clone();
        let mut sp = (*st.services[&spn]).clone();
        let mut remote = Endpoint::ready("10.244.3.3".parse().unwrap(), 5353, false);
        edit(&mut sp, &mut remote, &mut st);
        let mut eps = st.endpoints[&spn].to_vec();
        eps.push(remote);
        st.endpoints.insert(spn.clone(), eps.into());
        st.services.insert(spn, sp.into());
        service_destinations(&st, Family::Ip, Protocol::Udp)
    }

    fn keeps_remote_flows(d: &ServiceDestinations) {
        let to_remote = [
            flow("10.96.0.53", 53, "10.244.3.3", 5353),
            flow("192.168.0.2", 30053, "10.244.3.3", 5353),
        ];
        assert!(stale_flows(d, &NO_GONE, &to_remote).is_empty());
        // and still judges: an address that serves nothing is stale
        let gone = flow("10.96.0.53", 53, "10.244.4.4", 5353);
        assert_eq!(
            stale_flows(d, &NO_GONE, std::slice::from_ref(&gone)),
            vec![gone]
        );
    }

    #[test]
    fn a_terminating_but_serving_endpoint_keeps_its_flows() {
        keeps_remote_flows(&mixed(|_, e, _| {
            (e.ready, e.serving, e.terminating) = (false, true, true);
        }));
    }

    #[test]
    fn an_endpoint_hinted_for_another_zone_keeps_its_flows() {
        keeps_remote_flows(&mixed(|_, e, st| {
            st.node
                .labels
                .insert("topology.kubernetes.io/zone".into(), "zone-a".into());
            let eps = crate::model::fixtures::first_endpoints_mut(st);
            eps[0].set_hints(vec!["zone-a".into()], vec![]);
            e.set_hints(vec!["zone-b".into()], vec![]);
        }));
    }

    #[test]
    fn a_remote_endpoint_under_local_policies_keeps_its_flows() {
        keeps_remote_flows(&mixed(|sp, _, _| {
            sp.internal_policy_local = true;
            sp.external_policy_local = true;
        }));
    }

    #[test]
    fn an_endpoint_no_longer_serving_loses_its_flows() {
        let d = mixed(|_, e, _| {
            (e.ready, e.serving, e.terminating) = (false, false, true);
        });
        let to_remote = flow("10.96.0.53", 53, "10.244.3.3", 5353);
        assert_eq!(
            stale_flows(&d, &NO_GONE, std::slice::from_ref(&to_remote)),
            vec![to_remote]
        );
    }

    #[test]
    fn unrelated_entries_are_never_touched() {
        let d = service_destinations(&state(&[]), Family::Ip, Protocol::Udp);
        let other_service = flow("10.96.0.54", 53, "10.244.1.2", 5353);
        let direct = flow("10.244.1.2", 5353, "10.244.1.2", 5353);
        assert!(stale_flows(&d, &NO_GONE, &[other_service, direct]).is_empty());
        let tcp = service_destinations(&state(&[]), Family::Ip, Protocol::Tcp);
        assert!(tcp.is_empty());
    }
}
