//! Names of our nftables objects, one list for every mode's table (the nftables mode's
//! ruleset and the IPVS and userspace modes' companion tables share base chains, dispatch
//! chains and maps). Static names are constants; per-service names follow upstream nftables
//! mode (`service-<HASH8>-ns/svc/proto/port`), so operators who know
//! `nft list table ip kube-proxy` can read ours. Pure.

use sha2::{Digest, Sha256};

use crate::model::{Endpoint, ServicePortName};

pub use super::config::{DEFAULT_TABLE, TABLE_COMMENT};

pub const FILTER_PREROUTING_PRE_DNAT: &str = "filter-prerouting-pre-dnat";
pub const FILTER_OUTPUT_PRE_DNAT: &str = "filter-output-pre-dnat";
pub const FILTER_FORWARD: &str = "filter-forward";
/// The comment of the iptables-mode rule in [`FILTER_FORWARD`] that drops INVALID packets:
/// the kubeproxy_iptables_ct_state_invalid_dropped_packets_total metric reads its counter.
pub const INVALID_DROP_COMMENT: &str =
    "drop conntrack INVALID packets, kubernetes#74839 (nf_conntrack_tcp_be_liberal is 0)";
pub const FILTER_INPUT: &str = "filter-input";
/// iptables mode's copy of upstream's KUBE-FIREWALL: drops new connections to 127.0.0.0/8
/// from other sources unless DNATed (route_localnet=1 is set; kubernetes#90259).
pub const LOCALNET_GUARD: &str = "localnet-guard";
/// The comment of its drop rule (upstream's).
pub const LOCALNET_GUARD_COMMENT: &str = "block incoming localnet connections";
pub const FILTER_OUTPUT: &str = "filter-output";
pub const NAT_PREROUTING: &str = "nat-prerouting";
pub const NAT_OUTPUT: &str = "nat-output";
pub const NAT_POSTROUTING: &str = "nat-postrouting";
/// The userspace mode's pre-redirect filter chain on prerouting.
pub const FILTER_PREROUTING: &str = "filter-prerouting";
/// The IPVS and userspace modes' per-connection checks (firewall, no endpoints).
pub const SERVICE_CHECKS: &str = "service-checks";

pub const SERVICES: &str = "services";
pub const FIREWALL_CHECK: &str = "firewall-check";
pub const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
pub const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
pub const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
pub const REJECT_CHAIN: &str = "reject-chain";
pub const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";
pub const MASQUERADING: &str = "masquerading";

pub const CLUSTER_IPS: &str = "cluster-ips";
pub const SERVICE_IPS: &str = "service-ips";
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub const FIREWALL_IPS: &str = "firewall-ips";
pub const HAIRPIN: &str = "hairpin-endpoints";
/// nftables mode with upstream's gate `KubeProxyNFTablesLocalhostNodePorts`: the map from
/// `l4proto . dport` of a loopback NodePort that is rejected to its protocol's reject chain
/// (upstream's names).
pub const LOCALHOST_NODEPORT_REJECTS: &str = "localhost-nodeport-reject-ports";

/// The chain that counts and rejects loopback NodePort traffic of `proto` (upstream's
/// `localhostNodePortRejectChainName`).
pub fn localhost_reject_chain(proto: crate::model::Protocol) -> String {
    format!("localhost-nodeport-reject-{}", proto.lower())
}

/// The comment on that chain's counting rule: upstream's name of the named counter behind
/// `kubeproxy_nftables_localhost_nodeport_rejected_packets_total`
/// (`LocalhostNodePortRejectedCounterName`).
pub fn localhost_reject_counter(proto: crate::model::Protocol) -> String {
    format!("localhost-nodeport-rejected-{}", proto.lower())
}
/// The nftables mode's map from `daddr . l4proto . dport` to the one endpoint of a ClusterIP
/// service port that has one endpoint and nothing else of its own (no affinity, no external
/// address, Cluster traffic policy): such a service port needs no chain. The kernel walks
/// every chain of the table on each commit, whatever it changes: at 45k such service ports
/// that walk was ~6 ms of a one-endpoint change here (issue #18, kubernetes#139513's shape).
pub const ONE_ENDPOINT_SERVICES: &str = "one-endpoint-services";
/// The chain all of those share, reached through `service-ips` like any service chain.
pub const ONE_ENDPOINT_CHAIN: &str = "one-endpoint";
/// Most cluster endpoints of a service port that, with nothing else of its own, shares the
/// chain `balance-N` of its endpoint count N instead of having one: that chain's one rule
/// looks its endpoint up in `balance-N-services` by `daddr . l4proto . dport . numgen random
/// mod N`. At 100k service ports × 10 endpoints the kernel's walk over every chain on each
/// commit was 11 of a 12 ms one-endpoint change (issue #18). Wider service ports keep their
/// own chain (each distinct N is one more chain and map; `explain` follows N branches).
pub const MAX_BALANCED_ENDPOINTS: usize = 64;
/// The first part of the names of the `balance-N` chains and maps.
pub const BALANCE_PREFIX: &str = "balance-";

/// The chain of service ports with `n` endpoints and nothing else of their own.
pub fn balance_chain(n: usize) -> String {
    format!("{BALANCE_PREFIX}{n}")
}

/// Their endpoint map: `daddr . l4proto . dport . numgen random mod n` → endpoint.
pub fn balance_map(n: usize) -> String {
    format!("{BALANCE_PREFIX}{n}-services")
}

/// N of a `balance-N` chain's name.
pub fn balance_width(chain: &str) -> Option<usize> {
    chain.strip_prefix(BALANCE_PREFIX)?.parse().ok()
}

/// Most endpoint maps (slot → endpoint) the service chains' `dnat … map` rules use. The
/// kernel checks every rule bound to a map whenever an element is added to it, and walks every
/// element of a map whenever a rule binds to it: with one map, 10k services × 10 endpoints
/// cost 10⁹ checks (12 s). A full sync spreads the chains over about one map per 32 Services
/// (a power of two, at most this many), so each check touches a few dozen rules or a few
/// hundred elements, while creating the maps stays cheap (sets are found by name in a list).
pub const ENDPOINT_MAPS: u32 = 256;

/// Which of `maps` endpoint maps a chain uses: a stable hash of its name.
pub fn endpoint_map_index(chain: &str, maps: u32) -> u32 {
    // FNV-1a: deterministic across runs and builds, unlike std's hasher.
    let h = chain.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    });
    h % maps.max(1)
}

/// The name of endpoint map `i`.
pub fn endpoint_map_name(i: u32) -> String {
    format!("endpoints-{i:02x}")
}

/// Longest generated base (nft names are at most 255 bytes; leave room for prefixes).
const BASE_MAX: usize = 200;

const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

fn base32(data: &[u8]) -> String {
    let mut out = String::new();
    let (mut buf, mut bits) = (0u32, 0);
    for &b in data {
        buf = (buf << 8) | b as u32;
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(BASE32[((buf >> bits) & 31) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(BASE32[((buf << (5 - bits)) & 31) as usize] as char);
    }
    out
}

/// `HASH8-name`, truncated with `...` when long (upstream `hashAndTruncate`).
pub fn hash_and_truncate(name: &str) -> String {
    let hash = base32(&Sha256::digest(name.as_bytes()));
    let mut s = format!("{}-{}", &hash[..8], name);
    if s.len() > BASE_MAX {
        let mut cut = BASE_MAX - 3;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

fn service_base(spn: &ServicePortName) -> String {
    format!(
        "{}/{}/{}/{}",
        spn.namespace,
        spn.name,
        spn.protocol.lower(),
        spn.port
    )
}

/// The per-service chain names, hashed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceChains {
    pub service: String,
    pub local: String,
    pub external: String,
    pub firewall: String,
}

impl ServiceChains {
    pub fn new(spn: &ServicePortName) -> Self {
        let base = hash_and_truncate(&service_base(spn));
        ServiceChains {
            service: format!("service-{base}"),
            local: format!("local-{base}"),
            external: format!("external-{base}"),
            firewall: format!("firewall-{base}"),
        }
    }
}

/// Chain for Cluster-policy traffic.
pub fn service_chain(spn: &ServicePortName) -> String {
    format!("service-{}", hash_and_truncate(&service_base(spn)))
}

/// Chain for Local-policy traffic.
pub fn local_chain(spn: &ServicePortName) -> String {
    format!("local-{}", hash_and_truncate(&service_base(spn)))
}

/// Chain for traffic to external destinations (NodePort, externalIPs, LoadBalancer IPs).
pub fn external_chain(spn: &ServicePortName) -> String {
    format!("external-{}", hash_and_truncate(&service_base(spn)))
}

/// Chain enforcing loadBalancerSourceRanges.
pub fn firewall_chain(spn: &ServicePortName) -> String {
    format!("firewall-{}", hash_and_truncate(&service_base(spn)))
}

/// Userspace mode: the chain redirecting internal (`ext` false) or external traffic of a
/// service port to its listener.
pub fn userspace_chain(spn: &ServicePortName, ext: bool) -> String {
    let scope = if ext { "ext" } else { "int" };
    format!(
        "userspace-{scope}-{}",
        hash_and_truncate(&service_base(spn))
    )
}

/// Per-endpoint ClientIP affinity set.
pub fn affinity_set(spn: &ServicePortName, ep: &Endpoint) -> String {
    let ip = ep.ip.to_string().replace(':', ".");
    format!(
        "affinity-{}",
        hash_and_truncate(&format!("{}__{}/{}", service_base(spn), ip, ep.port))
    )
}

/// Whether a chain or set name is one we generate per service (so a stale one may go).
pub fn is_generated(name: &str) -> bool {
    [
        "service-",
        "local-",
        "external-",
        "firewall-",
        "affinity-",
        "userspace-",
    ]
    .iter()
    .any(|p| name.starts_with(p))
        && name.contains('/')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    #[test]
    fn base32_matches_rfc4648() {
        assert_eq!(base32(b"foobar"), "MZXW6YTBOI");
        assert_eq!(base32(b"f"), "MY");
    }

    #[test]
    fn chain_names_follow_upstream_shape() {
        let spn = ServicePortName {
            namespace: "ns1".into(),
            name: "svc1".into(),
            port: "p80".into(),
            protocol: Protocol::Tcp,
        };
        let c = service_chain(&spn);
        assert!(c.starts_with("service-"));
        assert!(c.ends_with("-ns1/svc1/tcp/p80"));
        assert_eq!(c.len(), "service-".len() + 9 + "ns1/svc1/tcp/p80".len());
        assert!(is_generated(&c));
        assert!(!is_generated(SERVICES));
    }

    #[test]
    fn long_names_are_truncated() {
        let long = "x".repeat(400);
        let h = hash_and_truncate(&long);
        assert_eq!(h.len(), BASE_MAX);
        assert!(h.ends_with("..."));
    }
}
