//! The address plan of a real-node cluster in each IP family: the fabric, the control
//! plane's and the nodes' addresses, the Service and pod ranges, the DNS Service's
//! ClusterIPs, and the flags and configuration lines that carry them. IPv4 only is the
//! default and is exactly the plan the harness always had; dual-stack adds an IPv6 stack of
//! unique local prefixes that collide with nothing on the machine, and IPv6 only has that
//! stack alone:
//!
//! | what           | IPv4               | IPv6                 |
//! |----------------|--------------------|----------------------|
//! | fabric bridge  | 10.99.0.1/24       | fd00:99::1/64        |
//! | control plane  | 10.99.0.10         | fd00:99::10          |
//! | node N         | 10.99.0.1N         | fd00:99::1N          |
//! | Services       | 10.96.0.0/16       | fd00:96::/112        |
//! | pods           | 10.244.0.0/16, /24 | fd00:10:244::/56, /64 |
//! | DNS Service    | 10.96.0.10         | fd00:96::a           |
//!
//! An IPv6 Service range is at most /108 (`--service-cluster-ip-range` holds at most 2^20
//! addresses, `cmd/kube-apiserver/app/options/validation.go`), and a node mask at most 16
//! bits longer than the cluster mask (`pkg/controller/nodeipam/ipam/cidrset`).
//!
//! Pure.

/// One IP family of the cluster's addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    /// The fabric bridge's address (every namespace's default gateway).
    pub fn fabric_ip(self) -> &'static str {
        match self {
            IpFamily::V4 => "10.99.0.1",
            IpFamily::V6 => "fd00:99::1",
        }
    }

    /// The fabric's prefix length.
    pub fn fabric_prefix_len(self) -> u8 {
        match self {
            IpFamily::V4 => 24,
            IpFamily::V6 => 64,
        }
    }

    /// The control plane's address.
    pub fn cp_ip(self) -> &'static str {
        match self {
            IpFamily::V4 => "10.99.0.10",
            IpFamily::V6 => "fd00:99::10",
        }
    }

    /// Node `index`'s (1-based, at most 9) address: `…1N` in both families.
    pub fn node_ip(self, index: usize) -> String {
        match self {
            IpFamily::V4 => format!("10.99.0.{}", 10 + index),
            IpFamily::V6 => format!("fd00:99::{}", 10 + index),
        }
    }

    pub fn service_cidr(self) -> &'static str {
        match self {
            IpFamily::V4 => "10.96.0.0/16",
            IpFamily::V6 => "fd00:96::/112",
        }
    }

    pub fn cluster_cidr(self) -> &'static str {
        match self {
            IpFamily::V4 => "10.244.0.0/16",
            IpFamily::V6 => "fd00:10:244::/56",
        }
    }

    /// The prefix length of each node's pod CIDR.
    pub fn node_cidr_mask(self) -> u8 {
        match self {
            IpFamily::V4 => 24,
            IpFamily::V6 => 64,
        }
    }

    /// The ClusterIP of `kube-system/kube-dns` in this family.
    pub fn dns_ip(self) -> &'static str {
        match self {
            IpFamily::V4 => "10.96.0.10",
            IpFamily::V6 => "fd00:96::a",
        }
    }

    /// The address a server binds to listen on every address of the family.
    pub fn any(self) -> &'static str {
        match self {
            IpFamily::V4 => "0.0.0.0",
            IpFamily::V6 => "::",
        }
    }

    /// The default route's destination, as CNI's host-local writes it.
    pub fn default_dst(self) -> &'static str {
        match self {
            IpFamily::V4 => "0.0.0.0/0",
            IpFamily::V6 => "::/0",
        }
    }

    /// The family of an address or CIDR in text form.
    pub fn of(addr: &str) -> IpFamily {
        if addr.contains(':') {
            IpFamily::V6
        } else {
            IpFamily::V4
        }
    }
}

/// Which families a cluster's nodes, pods and Services have.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Family {
    /// IPv4 only: the harness as it always was.
    #[default]
    Ipv4,
    /// IPv4 primary, IPv6 secondary, everywhere.
    Dual,
    /// IPv6 only.
    Ipv6,
}

impl Family {
    /// Reads `ipv4`, `dual` or `ipv6` (`real-node-e2e --family`).
    pub fn parse(s: &str) -> Option<Family> {
        match s {
            "ipv4" => Some(Family::Ipv4),
            "dual" => Some(Family::Dual),
            "ipv6" => Some(Family::Ipv6),
            _ => None,
        }
    }

    /// The families, primary first.
    pub fn stacks(self) -> &'static [IpFamily] {
        match self {
            Family::Ipv4 => &[IpFamily::V4],
            Family::Dual => &[IpFamily::V4, IpFamily::V6],
            Family::Ipv6 => &[IpFamily::V6],
        }
    }

    pub fn is_dual(self) -> bool {
        self.stacks().len() == 2
    }

    /// The primary family: the one of the `kubernetes` Service, the API server's advertised
    /// address and `Node.status.addresses[0]`.
    pub fn primary(self) -> IpFamily {
        self.stacks()[0]
    }

    /// The API server's URL, at the control plane's primary address.
    pub fn apiserver_url(self) -> String {
        match self.primary() {
            IpFamily::V4 => format!("https://{}:6443", IpFamily::V4.cp_ip()),
            IpFamily::V6 => format!("https://[{}]:6443", IpFamily::V6.cp_ip()),
        }
    }

    fn join(self, f: impl Fn(IpFamily) -> String) -> String {
        self.stacks()
            .iter()
            .map(|&s| f(s))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `--service-cluster-ip-range` of kube-apiserver and kube-controller-manager.
    pub fn service_cidrs(self) -> String {
        self.join(|s| s.service_cidr().into())
    }

    /// kube-controller-manager's `--cluster-cidr` and kube-proxy's `clusterCIDR`.
    pub fn cluster_cidrs(self) -> String {
        self.join(|s| s.cluster_cidr().into())
    }

    /// Node `index`'s addresses, primary first (the kubelet's `--node-ip`).
    pub fn node_ips(self, index: usize) -> Vec<String> {
        self.stacks().iter().map(|s| s.node_ip(index)).collect()
    }

    /// The control plane's addresses, primary first.
    pub fn cp_ips(self) -> Vec<String> {
        self.stacks()
            .iter()
            .map(|s| s.cp_ip().to_string())
            .collect()
    }

    /// kube-controller-manager's node-CIDR flags: one mask for a single family, one per
    /// family for dual-stack (kcm refuses `--node-cidr-mask-size` there,
    /// `cmd/kube-controller-manager/app/core.go`).
    pub fn node_cidr_mask_flags(self) -> Vec<String> {
        match self {
            Family::Ipv4 | Family::Ipv6 => vec![format!(
                "--node-cidr-mask-size={}",
                self.primary().node_cidr_mask()
            )],
            Family::Dual => vec![
                format!(
                    "--node-cidr-mask-size-ipv4={}",
                    IpFamily::V4.node_cidr_mask()
                ),
                format!(
                    "--node-cidr-mask-size-ipv6={}",
                    IpFamily::V6.node_cidr_mask()
                ),
            ],
        }
    }

    /// The ClusterIPs of `kube-system/kube-dns`, primary first.
    pub fn dns_ips(self) -> Vec<&'static str> {
        self.stacks().iter().map(|s| s.dns_ip()).collect()
    }

    /// The `ipFamilyPolicy` of `kube-system/kube-dns`.
    pub fn dns_policy(self) -> &'static str {
        if self.is_dual() {
            "PreferDualStack"
        } else {
            "SingleStack"
        }
    }

    /// Whether a node's `spec.podCIDRs` (as listed) is complete: one CIDR per family.
    pub fn pod_cidrs_complete(self, cidrs: &[String]) -> bool {
        cidrs.len() == self.stacks().len()
            && self
                .stacks()
                .iter()
                .all(|&s| cidrs.iter().any(|c| IpFamily::of(c) == s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_is_the_plan_the_harness_always_had() {
        let f = Family::default();
        assert_eq!(f, Family::Ipv4);
        assert_eq!(f.service_cidrs(), "10.96.0.0/16");
        assert_eq!(f.cluster_cidrs(), "10.244.0.0/16");
        assert_eq!(f.node_ips(2), ["10.99.0.12"]);
        assert_eq!(f.cp_ips(), ["10.99.0.10"]);
        assert_eq!(f.node_cidr_mask_flags(), ["--node-cidr-mask-size=24"]);
        assert_eq!(f.dns_ips(), ["10.96.0.10"]);
        assert_eq!(f.dns_policy(), "SingleStack");
        assert_eq!(super::super::SERVICE_CIDR, f.service_cidrs());
        assert_eq!(super::super::CLUSTER_CIDR, f.cluster_cidrs());
        assert_eq!(super::super::CP_IP, f.primary().cp_ip());
        assert_eq!(super::super::FABRIC_IP, f.primary().fabric_ip());
        assert_eq!(super::super::DNS_IP, f.primary().dns_ip());
    }

    #[test]
    fn dual_stack_is_ipv4_primary_with_an_ipv6_twin_everywhere() {
        let f = Family::parse("dual").unwrap();
        assert_eq!(f.service_cidrs(), "10.96.0.0/16,fd00:96::/112");
        assert_eq!(f.cluster_cidrs(), "10.244.0.0/16,fd00:10:244::/56");
        assert_eq!(f.node_ips(1), ["10.99.0.11", "fd00:99::11"]);
        assert_eq!(f.cp_ips(), ["10.99.0.10", "fd00:99::10"]);
        assert_eq!(
            f.node_cidr_mask_flags(),
            [
                "--node-cidr-mask-size-ipv4=24",
                "--node-cidr-mask-size-ipv6=64"
            ]
        );
        assert_eq!(f.dns_ips(), ["10.96.0.10", "fd00:96::a"]);
        assert_eq!(f.dns_policy(), "PreferDualStack");
        assert_eq!(f.primary(), IpFamily::V4);
    }

    #[test]
    fn ipv6_is_the_ipv6_stack_alone() {
        let f = Family::parse("ipv6").unwrap();
        assert_eq!(f.service_cidrs(), "fd00:96::/112");
        assert_eq!(f.cluster_cidrs(), "fd00:10:244::/56");
        assert_eq!(f.node_ips(3), ["fd00:99::13"]);
        assert_eq!(f.node_cidr_mask_flags(), ["--node-cidr-mask-size=64"]);
        assert_eq!(f.dns_ips(), ["fd00:96::a"]);
        assert_eq!(f.dns_policy(), "SingleStack");
        assert_eq!(f.apiserver_url(), "https://[fd00:99::10]:6443");
        assert_eq!(Family::Ipv4.apiserver_url(), "https://10.99.0.10:6443");
        assert!(!f.is_dual());
        assert!(f.pod_cidrs_complete(&["fd00:10:244:1::/64".to_string()]));
        assert!(!f.pod_cidrs_complete(&["10.244.1.0/24".to_string()]));
    }

    #[test]
    fn the_ipv6_service_range_fits_the_api_servers_limit() {
        // At most 20 host bits: /108 or longer.
        let len: u32 = IpFamily::V6
            .service_cidr()
            .rsplit('/')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(len >= 108, "{len}");
        // The node mask is at most 16 bits longer than the cluster mask.
        let cluster: u8 = IpFamily::V6
            .cluster_cidr()
            .rsplit('/')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(IpFamily::V6.node_cidr_mask() - cluster <= 16);
    }

    #[test]
    fn pod_cidrs_are_complete_with_one_per_family() {
        let v = |s: &[&str]| s.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        assert!(Family::Ipv4.pod_cidrs_complete(&v(&["10.244.1.0/24"])));
        assert!(!Family::Ipv4.pod_cidrs_complete(&v(&[])));
        assert!(!Family::Dual.pod_cidrs_complete(&v(&["10.244.1.0/24"])));
        assert!(Family::Dual.pod_cidrs_complete(&v(&["10.244.1.0/24", "fd00:10:244:1::/64"])));
        assert!(!Family::Dual.pod_cidrs_complete(&v(&["10.244.1.0/24", "10.244.2.0/24"])));
        assert!(Family::parse("ipv5").is_none());
    }
}
