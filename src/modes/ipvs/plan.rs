//! The pure half of the IPVS mode: from the model to the virtual servers, real servers and
//! VIPs this node should have, with upstream's IPVS semantics (one virtual server per
//! ClusterIP, externalIP, LoadBalancer IP and node address × NodePort; real servers weight 1,
//! masquerading; traffic policies through the same endpoint categorisation as nftables mode).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::kernel::nft::Cidr;
use crate::model::net::Family;
use crate::model::topology::categorize_family;
use crate::model::{LoadBalancing, ProxyState, ServicePort, ServicePortName};
use crate::proxy::{FamilyNodePorts, NodePortAddresses};

use crate::kernel::ipvs::{RealServer, VirtualServer, VsKey};

/// Settings of the IPVS mode (`ipvs` section of the configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsConfig {
    /// Scheduler of every virtual server (`rr` unless configured).
    pub scheduler: String,
    /// Virtual servers inside these CIDRs are never deleted by us (upstream `excludeCIDRs`).
    pub exclude_cidrs: Vec<Cidr>,
    pub strict_arp: bool,
    pub tcp_timeout: u32,
    pub tcp_fin_timeout: u32,
    pub udp_timeout: u32,
    /// How long a removed real server may keep draining connections at weight 0.
    pub graceful_termination: std::time::Duration,
    /// The dummy link holding the VIPs.
    pub dummy_link: String,
    /// How service ports without the `kube-nlproxy.io/load-balancing` annotation pick a
    /// real server: `Maglev` is the `mh` scheduler, `Random` the configured one.
    pub load_balancing: LoadBalancing,
    /// Whether the kernel has the `mh` scheduler, as far as we know: cleared when it refused
    /// one (no `ip_vs_mh`), and Maglev service ports then use the configured scheduler.
    pub mh_scheduler: bool,
}

impl Default for IpvsConfig {
    fn default() -> Self {
        IpvsConfig {
            scheduler: "rr".into(),
            exclude_cidrs: Vec::new(),
            strict_arp: false,
            tcp_timeout: 0,
            tcp_fin_timeout: 0,
            udp_timeout: 0,
            graceful_termination: std::time::Duration::from_secs(15 * 60),
            dummy_link: DUMMY_LINK.into(),
            load_balancing: LoadBalancing::Random,
            mh_scheduler: true,
        }
    }
}

pub const DUMMY_LINK: &str = "kube-ipvs0";

/// The schedulers Linux ships (`ip_vs_<name>` modules).
pub const SCHEDULERS: &[&str] = &[
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos",
];

/// Why a virtual server exists (for logs and the companion table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum VsKind {
    ClusterIp,
    ExternalIp,
    LoadBalancer,
    NodePort,
}

/// One virtual server this node should have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredVs {
    pub vs: VirtualServer,
    pub kind: VsKind,
    pub service: ServicePortName,
    /// Real servers by (address, port).
    pub dests: BTreeMap<(IpAddr, u16), RealServer>,
}

/// Everything the IPVS mode programs for a state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsPlan {
    pub services: BTreeMap<VsKey, DesiredVs>,
    /// Addresses to bind on the dummy link.
    pub vips: BTreeSet<IpAddr>,
}

impl IpvsPlan {
    /// Keeps the virtual servers and addresses of `families` only.
    pub fn retain_families(&mut self, families: &[Family]) {
        self.services
            .retain(|k, _| families.contains(&Family::of(&k.addr)));
        self.vips.retain(|a| families.contains(&Family::of(a)));
    }
}

/// The node addresses that accept NodePort traffic, from the addresses of every link except
/// the dummy one: loopback (IPVS cannot serve it) and IPv6 link-local never do.
pub fn nodeport_addresses(
    local: &[IpAddr],
    mode: &NodePortAddresses,
    node_primary: &[IpAddr],
) -> Vec<IpAddr> {
    let usable = |a: &IpAddr| {
        !a.is_loopback()
            && match a {
                IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) != 0xfe80,
                IpAddr::V4(_) => true,
            }
    };
    let mut out: Vec<IpAddr> = Vec::new();
    for v4 in [true, false] {
        let of_family = local
            .iter()
            .copied()
            .filter(|a| a.is_ipv4() == v4 && usable(a));
        match mode.for_family(v4, node_primary) {
            FamilyNodePorts::All => out.extend(of_family),
            FamilyNodePorts::Only { cidrs, hosts } => {
                out.extend(of_family.filter(|a| cidrs.iter().any(|c| c.contains(a))));
                out.extend(hosts);
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

fn dests_of(eps: &[crate::model::Endpoint]) -> BTreeMap<(IpAddr, u16), RealServer> {
    eps.iter()
        .map(|e| ((e.ip, e.port), RealServer::masq(e.ip, e.port)))
        .collect()
}

/// The scheduler and its flags for `sp`: a Maglev service port (its annotation, or the
/// default) is IPVS's own Maglev, `mh`, hashing the source port too (`mh-port`, as nftables
/// mode's hash of both addresses and ports) and passing a weight-0 (draining) real server's
/// new flows to the next one (`mh-fallback`); any other, and every one on a kernel without
/// `mh`, the configured scheduler.
fn scheduler_of(sp: &ServicePort, cfg: &IpvsConfig) -> (String, u32) {
    use crate::kernel::ipvs::uapi::{IP_VS_SVC_F_SCHED1, IP_VS_SVC_F_SCHED2};
    match sp.load_balancing.unwrap_or(cfg.load_balancing) {
        LoadBalancing::Maglev if cfg.mh_scheduler => {
            (MH.into(), IP_VS_SVC_F_SCHED1 | IP_VS_SVC_F_SCHED2)
        }
        _ => (cfg.scheduler.clone(), 0),
    }
}

/// IPVS's Maglev scheduler (`ip_vs_mh`, Linux 4.18).
pub const MH: &str = "mh";

fn add(
    plan: &mut IpvsPlan,
    sp: &ServicePort,
    cfg: &IpvsConfig,
    addr: IpAddr,
    port: u16,
    kind: VsKind,
    dests: &BTreeMap<(IpAddr, u16), RealServer>,
) {
    let (scheduler, sched_flags) = scheduler_of(sp, cfg);
    let vs = VirtualServer {
        addr,
        port,
        protocol: sp.name.protocol.number(),
        scheduler,
        persistence: sp.affinity_timeout.unwrap_or(0),
        sched_flags,
    };
    let key = vs.key();
    // Two services claiming one address and port: the first in build_plan's order (older
    // Service, then name) keeps it, as the nftables rulesets do.
    plan.services.entry(key).or_insert_with(|| DesiredVs {
        vs,
        kind,
        service: sp.name.clone(),
        dests: dests.clone(),
    });
}

/// Builds the plan for `state`. `node_addrs` are the NodePort addresses from
/// [`nodeport_addresses`].
pub fn build_plan(state: &ProxyState, cfg: &IpvsConfig, node_addrs: &[IpAddr]) -> IpvsPlan {
    let mut plan = IpvsPlan::default();
    let mut ordered: Vec<_> = state.services.iter().collect();
    ordered.sort_by_key(|(n, sp)| (sp.created.is_none(), sp.created, *n));
    for (spn, sp) in ordered {
        let eps = state.endpoints_of(spn);
        for v4 in [true, false] {
            let cluster_ips: Vec<IpAddr> = sp
                .cluster_ips
                .iter()
                .copied()
                .filter(|a| a.is_ipv4() == v4)
                .collect();
            if cluster_ips.is_empty() {
                continue; // not a service of this family
            }
            let cat = categorize_family(eps, sp, &state.node, v4);
            let internal = dests_of(if sp.internal_policy_local {
                &cat.local
            } else {
                &cat.cluster
            });
            let external = dests_of(if sp.external_policy_local {
                &cat.local
            } else {
                &cat.cluster
            });
            for ip in cluster_ips {
                add(
                    &mut plan,
                    sp,
                    cfg,
                    ip,
                    sp.port,
                    VsKind::ClusterIp,
                    &internal,
                );
                plan.vips.insert(ip);
            }
            for ip in sp.external_ips.iter().filter(|a| a.is_ipv4() == v4) {
                add(
                    &mut plan,
                    sp,
                    cfg,
                    *ip,
                    sp.port,
                    VsKind::ExternalIp,
                    &external,
                );
                plan.vips.insert(*ip);
            }
            for ip in sp.load_balancer_ips.iter().filter(|a| a.is_ipv4() == v4) {
                add(
                    &mut plan,
                    sp,
                    cfg,
                    *ip,
                    sp.port,
                    VsKind::LoadBalancer,
                    &external,
                );
                plan.vips.insert(*ip);
            }
            if let Some(np) = sp.node_port {
                for a in node_addrs.iter().filter(|a| a.is_ipv4() == v4) {
                    add(&mut plan, sp, cfg, *a, np, VsKind::NodePort, &external);
                }
            }
        }
    }
    plan
}

/// The plan as `ipvsadm -Ln` would list it (for `--dry-run`).
pub fn render(plan: &IpvsPlan) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for d in plan.services.values() {
        let persist = if d.vs.persistence > 0 {
            format!(" persistent {}", d.vs.persistence)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "{} {}{persist}  # {}",
            d.vs.key(),
            d.vs.scheduler,
            d.service
        );
        for rs in d.dests.values() {
            let _ = writeln!(
                out,
                "  -> {} Masq {}",
                std::net::SocketAddr::new(rs.addr, rs.port),
                rs.weight
            );
        }
    }
    for v in &plan.vips {
        let _ = writeln!(out, "# {DUMMY_LINK}: {v}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, NodeInfo, Protocol};

    fn spn(name: &str) -> ServicePortName {
        ServicePortName {
            namespace: "default".into(),
            name: name.into(),
            port: "http".into(),
            protocol: Protocol::Tcp,
        }
    }

    fn state(svcs: Vec<(ServicePort, Vec<Endpoint>)>) -> ProxyState {
        let mut st = ProxyState {
            node: NodeInfo {
                name: "node1".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        for (sp, eps) in svcs {
            st.endpoints.insert(sp.name.clone(), eps.into());
            st.services.insert(sp.name.clone(), sp.into());
        }
        st
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn no_virtual_server_for_external_ips_when_the_gate_is_off() {
        let mut sp = ServicePort::new(spn("web"), ip("10.96.0.10"), 80);
        sp.external_ips = vec![ip("203.0.113.7")];
        let st = state(vec![(
            sp,
            vec![Endpoint::ready(ip("10.244.1.2"), 8080, true)],
        )]);
        let st = crate::model::without_external_ips(&st);
        let plan = build_plan(&st, &IpvsConfig::default(), &[ip("192.168.50.1")]);
        let keys: Vec<String> = plan.services.keys().map(|k| k.to_string()).collect();
        assert_eq!(keys, ["tcp 10.96.0.10:80"]);
    }

    #[test]
    fn a_maglev_service_port_is_scheduled_by_mh_with_port_and_fallback_the_others_as_configured() {
        use crate::kernel::ipvs::uapi::{IP_VS_SVC_F_SCHED1, IP_VS_SVC_F_SCHED2};
        let eps = || vec![Endpoint::ready(ip("10.244.1.2"), 8080, true)];
        let mut annotated = ServicePort::new(spn("maglev"), ip("10.96.0.10"), 80);
        annotated.load_balancing = Some(LoadBalancing::Maglev);
        let mut opted_out = ServicePort::new(spn("random"), ip("10.96.0.11"), 80);
        opted_out.load_balancing = Some(LoadBalancing::Random);
        let plain = ServicePort::new(spn("plain"), ip("10.96.0.12"), 80);
        let st = state(vec![(annotated, eps()), (opted_out, eps()), (plain, eps())]);
        let sched = |cfg: &IpvsConfig| -> Vec<(String, u32)> {
            build_plan(&st, cfg, &[])
                .services
                .values()
                .map(|d| (d.vs.scheduler.clone(), d.vs.sched_flags))
                .collect()
        };
        let mh = ("mh".to_string(), IP_VS_SVC_F_SCHED1 | IP_VS_SVC_F_SCHED2);
        let wlc = ("wlc".to_string(), 0);
        let mut cfg = IpvsConfig {
            scheduler: "wlc".into(),
            ..IpvsConfig::default()
        };
        assert_eq!(sched(&cfg), [mh.clone(), wlc.clone(), wlc.clone()]);
        cfg.load_balancing = LoadBalancing::Maglev;
        assert_eq!(
            sched(&cfg),
            [mh.clone(), wlc.clone(), mh],
            "the default applies to the plain one"
        );
        cfg.mh_scheduler = false;
        assert_eq!(
            sched(&cfg),
            [wlc.clone(), wlc.clone(), wlc],
            "a kernel without mh: the configured scheduler"
        );
    }

    #[test]
    fn one_virtual_server_per_address_and_port() {
        let mut sp = ServicePort::new(spn("web"), ip("10.96.0.10"), 80);
        sp.node_port = Some(30080);
        sp.external_ips = vec![ip("203.0.113.7")];
        sp.load_balancer_ips = vec![ip("198.51.100.9")];
        sp.affinity_timeout = Some(600);
        let eps = vec![
            Endpoint::ready(ip("10.244.1.2"), 8080, true),
            Endpoint::ready(ip("10.244.2.2"), 8080, false),
        ];
        let st = state(vec![(sp, eps)]);
        let cfg = IpvsConfig::default();
        let plan = build_plan(&st, &cfg, &[ip("192.168.50.1"), ip("fd00::1")]);
        let keys: Vec<String> = plan.services.keys().map(|k| k.to_string()).collect();
        assert_eq!(
            keys,
            [
                "tcp 10.96.0.10:80",
                "tcp 192.168.50.1:30080",
                "tcp 198.51.100.9:80",
                "tcp 203.0.113.7:80"
            ]
        );
        for d in plan.services.values() {
            assert_eq!(d.vs.scheduler, "rr");
            assert_eq!(d.vs.persistence, 600);
            assert_eq!(d.dests.len(), 2);
            assert!(d.dests.values().all(|r| r.weight == 1));
        }
        // NodePorts are served on node addresses, which are not bound to the dummy link.
        assert_eq!(
            plan.vips,
            [ip("10.96.0.10"), ip("198.51.100.9"), ip("203.0.113.7")]
                .into_iter()
                .collect()
        );
    }

    #[test]
    fn traffic_policies_pick_endpoints_per_kind() {
        let mut sp = ServicePort::new(spn("local"), ip("10.96.0.11"), 80);
        sp.node_port = Some(30081);
        sp.external_policy_local = true;
        let eps = vec![
            Endpoint::ready(ip("10.244.1.2"), 8080, true),
            Endpoint::ready(ip("10.244.2.2"), 8080, false),
        ];
        let st = state(vec![(sp, eps)]);
        let plan = build_plan(&st, &IpvsConfig::default(), &[ip("192.168.50.1")]);
        let cip = &plan.services[&VsKey {
            addr: ip("10.96.0.11"),
            port: 80,
            protocol: 6,
        }];
        assert_eq!(cip.dests.len(), 2, "ClusterIP uses every endpoint");
        let np = &plan.services[&VsKey {
            addr: ip("192.168.50.1"),
            port: 30081,
            protocol: 6,
        }];
        assert_eq!(
            np.dests.keys().copied().collect::<Vec<_>>(),
            [(ip("10.244.1.2"), 8080)],
            "externalTrafficPolicy Local keeps only this node's endpoints"
        );
    }

    #[test]
    fn no_endpoints_keeps_the_virtual_server_empty() {
        let sp = ServicePort::new(spn("empty"), ip("10.96.0.12"), 53);
        let st = state(vec![(sp, vec![])]);
        let plan = build_plan(&st, &IpvsConfig::default(), &[]);
        assert_eq!(plan.services.len(), 1);
        assert!(plan.services.values().next().unwrap().dests.is_empty());
    }

    #[test]
    fn families_stay_apart() {
        let mut sp = ServicePort::new(spn("dual"), ip("10.96.0.13"), 80);
        sp.cluster_ips.push(ip("fd00:96::13"));
        sp.node_port = Some(30083);
        let eps = vec![
            Endpoint::ready(ip("10.244.1.2"), 8080, true),
            Endpoint::ready(ip("fd00:10:244:1::2"), 8080, true),
        ];
        let st = state(vec![(sp, eps)]);
        let plan = build_plan(
            &st,
            &IpvsConfig::default(),
            &[ip("192.168.50.1"), ip("fd00:50::1")],
        );
        assert_eq!(plan.services.len(), 4);
        for d in plan.services.values() {
            assert!(d
                .dests
                .keys()
                .all(|(a, _)| a.is_ipv4() == d.vs.addr.is_ipv4()));
            assert_eq!(d.dests.len(), 1);
        }
        // A host without usable IPv6 keeps the IPv4 half alone.
        let mut v4 = plan.clone();
        v4.retain_families(&[Family::Ip]);
        assert_eq!(v4.services.len(), 2);
        assert!(v4.services.keys().all(|k| k.addr.is_ipv4()));
        assert!(!v4.vips.is_empty() && v4.vips.iter().all(IpAddr::is_ipv4));
        assert_eq!(
            v4.services.len() + plan.services.keys().filter(|k| k.addr.is_ipv6()).count(),
            plan.services.len()
        );
    }

    #[test]
    fn nodeport_addresses_skip_loopback_and_link_local() {
        let local = [
            ip("127.0.0.1"),
            ip("192.168.50.1"),
            ip("10.0.0.5"),
            ip("::1"),
            ip("fe80::1"),
            ip("fd00:50::1"),
        ];
        assert_eq!(
            nodeport_addresses(&local, &NodePortAddresses::all(), &[]),
            [ip("10.0.0.5"), ip("192.168.50.1"), ip("fd00:50::1")]
        );
        let only: Vec<Cidr> = vec!["192.168.50.0/24".parse().unwrap()];
        assert_eq!(
            nodeport_addresses(&local, &NodePortAddresses::cidrs(only), &[]),
            [ip("192.168.50.1"), ip("fd00:50::1")],
            "IPv6 has no entry: every address, as upstream"
        );
        assert_eq!(
            nodeport_addresses(
                &local,
                &NodePortAddresses::primary(),
                &[ip("10.0.0.5"), ip("fd00:50::1")]
            ),
            [ip("10.0.0.5"), ip("fd00:50::1")]
        );
    }
}
