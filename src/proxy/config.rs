//! The settings every mode's tables share: table name, masquerade mark, local-traffic
//! detection, NodePort addresses. Pure.

use std::net::IpAddr;

use crate::model::net::Cidr;
use crate::model::{LoadBalancing, NodeInfo, Protocol};

/// Our table's default name (the nftables mode's table; other modes add a suffix).
pub const DEFAULT_TABLE: &str = "kube-nlproxy";
/// The comment on every table we create: cleanup never deletes a table without it.
pub const TABLE_COMMENT: &str = "rules for kube-nlproxy";

/// The configured local-traffic detection (`detectLocalMode`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DetectLocal {
    ClusterCidr(Vec<Cidr>),
    NodeCidr,
    BridgeInterface(String),
    InterfaceNamePrefix(String),
}

/// How traffic from pods on this node is told apart from traffic from elsewhere (which is
/// masqueraded when it reaches a ClusterIP).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LocalDetector {
    /// No detection: ClusterIP traffic is masqueraded only with `masquerade_all`.
    #[default]
    None,
    /// Sources inside these CIDRs are pods (`ClusterCIDR` or `NodeCIDR` mode).
    Cidrs(Vec<Cidr>),
    /// Packets arriving on this bridge come from pods (`BridgeInterface` mode).
    Bridge(String),
    /// Packets arriving on interfaces with this prefix come from pods
    /// (`InterfaceNamePrefix` mode).
    InterfacePrefix(String),
}

/// Which local addresses accept NodePort traffic: upstream's `nodePortAddresses` with its
/// keywords expanded (`all` → `0.0.0.0/0` and `::/0`, `localhost` → `127.0.0.0/8` and
/// `::1/128`, `primary` → the node's primary address of each family).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodePortAddresses {
    /// `primary`: the Node object's first address of each family.
    pub primary: bool,
    pub cidrs: Vec<Cidr>,
}

/// What one family's NodePorts answer on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FamilyNodePorts {
    /// Every local address but loopback.
    All,
    /// Local addresses in these (non-loopback) CIDRs, and these exact addresses.
    Only {
        cidrs: Vec<Cidr>,
        hosts: Vec<IpAddr>,
    },
}

impl NodePortAddresses {
    /// Every local address (iptables and ipvs modes' default).
    pub fn all() -> Self {
        Self::default()
    }
    pub fn cidrs(cidrs: Vec<Cidr>) -> Self {
        NodePortAddresses {
            primary: false,
            cidrs,
        }
    }
    /// The node's primary addresses (nftables mode's default).
    pub fn primary() -> Self {
        NodePortAddresses {
            primary: true,
            cidrs: Vec::new(),
        }
    }

    /// One family's share, as upstream's `NewNodePortAddresses` takes it: a family with no
    /// entry, or with a zero-length prefix, accepts NodePorts on every address.
    pub fn for_family(&self, v4: bool, node_addresses: &[IpAddr]) -> FamilyNodePorts {
        let cidrs: Vec<Cidr> = self
            .cidrs
            .iter()
            .filter(|c| c.is_ipv4() == v4)
            .cloned()
            .collect();
        let hosts: Vec<IpAddr> = if self.primary {
            node_addresses
                .iter()
                .filter(|a| a.is_ipv4() == v4 && !a.is_loopback())
                .take(1)
                .copied()
                .collect()
        } else {
            Vec::new()
        };
        if (cidrs.is_empty() && hosts.is_empty()) || cidrs.iter().any(|c| c.prefix() == 0) {
            return FamilyNodePorts::All;
        }
        // Loopback NodePorts need route_localnet; here they are served by the userspace
        // forwarder (`localhost_nodeports`), never by DNAT.
        let cidrs = cidrs
            .into_iter()
            .filter(|c| !c.addr().is_loopback())
            .collect();
        FamilyNodePorts::Only { cidrs, hosts }
    }

    /// Whether 127.0.0.1 is covered (upstream's `ContainsIPv4Loopback`): no IPv4 entry at
    /// all, or a CIDR holding it.
    pub fn contains_ipv4_loopback(&self) -> bool {
        let v4: Vec<&Cidr> = self.cidrs.iter().filter(|c| c.is_ipv4()).collect();
        let lo: IpAddr = std::net::Ipv4Addr::LOCALHOST.into();
        (v4.is_empty() && !self.primary) || v4.iter().any(|c| c.contains(&lo))
    }

    /// Whether loopback is listed explicitly (`localhost` or a loopback CIDR), which
    /// nftables mode requires before serving localhost NodePorts.
    pub fn explicit_loopback(&self) -> bool {
        self.explicit_loopback_of(true) || self.explicit_loopback_of(false)
    }

    /// [`Self::explicit_loopback`] for one family's CIDRs (IPv4 when `v4`), as upstream's
    /// per-family `ContainsExplicitLoopback`: `127.0.0.0/8` alone leaves `::1` unlisted.
    pub fn explicit_loopback_of(&self, v4: bool) -> bool {
        self.cidrs
            .iter()
            .any(|c| c.is_ipv4() == v4 && c.prefix() > 0 && c.addr().is_loopback())
    }
}

/// What one family does with NodePort traffic to its loopback address in nftables mode
/// (upstream 1.37's alpha gate `KubeProxyNFTablesLocalhostNodePorts`; without it, or in
/// other modes, nothing: no rule, and nothing listens unless a forwarder is configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoopbackNodePorts {
    #[default]
    Untouched,
    /// Loopback listed explicitly in `nodePortAddresses`: TCP is proxied in userspace,
    /// UDP and SCTP are rejected and counted.
    ServeTcp,
    /// The gate is on but loopback is not listed: every protocol is rejected and counted.
    RejectAll,
}

impl LoopbackNodePorts {
    /// The protocols whose loopback NodePort traffic is rejected and counted (upstream's
    /// `localhostNodePortRejectProtocols`).
    pub fn rejects(self) -> &'static [Protocol] {
        match self {
            LoopbackNodePorts::Untouched => &[],
            LoopbackNodePorts::ServeTcp => &[Protocol::Udp, Protocol::Sctp],
            LoopbackNodePorts::RejectAll => &[Protocol::Tcp, Protocol::Udp, Protocol::Sctp],
        }
    }

    /// Upstream's choice for one family: `gate` on, loopback listed for that family or not.
    pub fn of(gate: bool, explicit_loopback: bool) -> LoopbackNodePorts {
        match (gate, explicit_loopback) {
            (false, _) => LoopbackNodePorts::Untouched,
            (true, true) => LoopbackNodePorts::ServeTcp,
            (true, false) => LoopbackNodePorts::RejectAll,
        }
    }
}

/// [`LoopbackNodePorts`] of each family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoopbackPolicy {
    pub v4: LoopbackNodePorts,
    pub v6: LoopbackNodePorts,
}

impl LoopbackPolicy {
    pub fn of(&self, v4: bool) -> LoopbackNodePorts {
        if v4 {
            self.v4
        } else {
            self.v6
        }
    }
}

/// The loopback listeners that forward NodePorts in userspace: the protocols served on
/// 127.0.0.1 and on ::1.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoopbackListeners {
    pub v4: Vec<Protocol>,
    pub v6: Vec<Protocol>,
}

impl LoopbackListeners {
    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }
    pub fn of(&self, v4: bool) -> &[Protocol] {
        if v4 {
            &self.v4
        } else {
            &self.v6
        }
    }
}

/// Settings of the nftables proxier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxierConfig {
    pub table: String,
    pub masquerade_bit: u8,
    pub masquerade_all: bool,
    pub local_detector: LocalDetector,
    pub nodeport_addresses: NodePortAddresses,
    /// Service CIDRs known besides the ServiceCIDR objects (`--service-cidrs`); a sync uses
    /// the union of both.
    pub service_cidrs: Vec<Cidr>,
    /// Drop new connections to the service CIDRs' unallocated addresses (upstream's). Off
    /// beside kube-proxy (`--service-proxy-name`): the ClusterIPs of the Services it serves
    /// are in the same CIDRs and unknown to ours.
    pub drop_unallocated: bool,
    /// Drop forwarded packets that conntrack marks INVALID, counting them (upstream's
    /// iptables mode when `nf_conntrack_tcp_be_liberal` reads 0 once the conntrack tuning is
    /// applied; kubernetes#74839, #117924). Its nftables and IPVS modes never do.
    pub drop_invalid: bool,
    /// Loopback NodePort traffic each family rejects and counts (nftables mode's gate).
    pub loopback_nodeports: LoopbackPolicy,
    /// iptables mode with localhost NodePorts: upstream sets route_localnet=1 and guards it
    /// with KUBE-FIREWALL's "block incoming localnet connections" rule (kubernetes#90259):
    /// new IPv4 connections to 127.0.0.0/8 from other sources that no DNAT made are dropped.
    pub localnet_guard: bool,
    /// How service ports without the `kube-nlproxy.io/load-balancing` annotation pick an
    /// endpoint (`--load-balancing`).
    pub load_balancing: LoadBalancing,
}

impl Default for ProxierConfig {
    fn default() -> Self {
        ProxierConfig {
            table: DEFAULT_TABLE.into(),
            masquerade_bit: 14,
            masquerade_all: false,
            local_detector: LocalDetector::None,
            nodeport_addresses: NodePortAddresses::all(),
            service_cidrs: Vec::new(),
            drop_unallocated: true,
            drop_invalid: false,
            loopback_nodeports: LoopbackPolicy::default(),
            localnet_guard: false,
            load_balancing: LoadBalancing::Random,
        }
    }
}

impl ProxierConfig {
    pub fn masquerade_mark(&self) -> u32 {
        1u32 << self.masquerade_bit
    }
}

/// Resolves `NodeCIDR` detection against the Node at each sync (its podCIDRs may appear
/// after start); the other modes are fixed in the config. Warns once when the Node has none.
#[derive(Debug, Clone)]
pub struct LocalDetectorResolver {
    detect_local: DetectLocal,
    warned_no_podcidr: bool,
}

impl LocalDetectorResolver {
    pub fn new(detect_local: DetectLocal) -> Self {
        LocalDetectorResolver {
            detect_local,
            warned_no_podcidr: false,
        }
    }

    /// `cfg` with the local detector in force for `node`.
    pub fn resolve(&mut self, cfg: &ProxierConfig, node: &NodeInfo) -> ProxierConfig {
        let mut cfg = cfg.clone();
        if self.detect_local == DetectLocal::NodeCidr {
            if node.pod_cidrs.is_empty() {
                if !self.warned_no_podcidr {
                    tracing::warn!(node = %node.name, "detect-local-mode NodeCIDR but the Node has no podCIDRs; local traffic is not detected");
                    self.warned_no_podcidr = true;
                }
                cfg.local_detector = LocalDetector::None;
            } else {
                cfg.local_detector = LocalDetector::Cidrs(node.pod_cidrs.clone());
            }
        }
        cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_cidr_detection_follows_the_node_and_others_stay_as_configured() {
        let base = ProxierConfig {
            local_detector: LocalDetector::Bridge("cbr0".into()),
            ..Default::default()
        };
        let mut node = NodeInfo::default();
        let mut fixed = LocalDetectorResolver::new(DetectLocal::BridgeInterface("cbr0".into()));
        assert_eq!(fixed.resolve(&base, &node), base);
        let mut by_node = LocalDetectorResolver::new(DetectLocal::NodeCidr);
        assert_eq!(
            by_node.resolve(&base, &node).local_detector,
            LocalDetector::None,
            "no podCIDRs yet: nothing is detected"
        );
        node.pod_cidrs = vec!["10.244.1.0/24".parse().unwrap()];
        assert_eq!(
            by_node.resolve(&base, &node).local_detector,
            LocalDetector::Cidrs(node.pod_cidrs.clone())
        );
    }
}
