//! One service port's objects in one family: [`service_port_rules`] runs the named steps of
//! [`PortRules`] (upstream's comment blocks: fast paths, policy chains, ClusterIP and external
//! dispatch, firewall). Pure.

use std::net::IpAddr;

use crate::model::topology::{categorize_family, CategorizedEndpoints};

use crate::kernel::nft::{
    shared_name, Chain, Cidr, CmpOp, ElemData, Element, Expr, Family, Field, Key, KeyValue, Name,
    Rule, Target, Verdict,
};
use crate::model::{Endpoint, LoadBalancing, NodeInfo, ServicePort};

use crate::proxy::names::*;
use crate::proxy::rules::{cidrs_of, from_pod, goto, jump, of_family};
use crate::proxy::{Fragment, ProxierConfig};

use super::super::SlotAllocator;
use super::balance::Balance;
use super::{elem, key};

/// Adds one service port's objects in `family` to `rs` (nothing when it has no ClusterIP
/// there): each step of [`PortRules`] in upstream's order.
pub(super) fn service_port_rules(
    rs: &mut Fragment,
    cfg: &ProxierConfig,
    node: &NodeInfo,
    sp: &ServicePort,
    endpoints: &[Endpoint],
    family: Family,
    slots: &mut SlotAllocator,
) {
    let Some(&cluster_ip) = of_family(&sp.cluster_ips, family).first() else {
        return; // not a service of this family
    };
    let p = PortRules {
        cfg,
        node,
        sp,
        family,
        cat: categorize_family(endpoints, sp, node, family == Family::Ip),
        cluster_ip,
        proto: sp.name.protocol.number(),
        // One copy for every element of this service port.
        comment: sp.name.to_string().into(),
        chains: ServiceChains::new(&sp.name),
    };
    p.shared_elements(rs);
    if p.one_endpoint_fast_path(rs) || p.balance_fast_path(rs) {
        return;
    }
    let reach = p.policy_chains(rs, slots);
    p.cluster_ip_dispatch(rs, &reach);
    let external_ips = of_family(&sp.external_ips, family);
    let lb_ips = of_family(&sp.load_balancer_ips, family);
    if sp.node_port.is_none() && external_ips.is_empty() && lb_ips.is_empty() {
        return; // no external destination
    }
    let uses_ext_chain = p.external_chain(rs, &reach);
    p.external_dispatch(rs, &reach, uses_ext_chain, &external_ips, &lb_ips);
    p.firewall(rs, &lb_ips);
}

/// What every step of one service port's rules reads: the port, its endpoints as each
/// traffic policy may use them, and the names its elements and chains carry.
struct PortRules<'a> {
    cfg: &'a ProxierConfig,
    node: &'a NodeInfo,
    sp: &'a ServicePort,
    family: Family,
    cat: CategorizedEndpoints,
    cluster_ip: IpAddr,
    proto: u8,
    comment: Name,
    chains: ServiceChains,
}

/// Which policy chains a service port has, and what traffic that no endpoint may take
/// meets.
struct Reach {
    has_cluster: bool,
    has_local: bool,
    /// Reject when there is no usable endpoint anywhere, drop when only the policy excludes
    /// them (upstream semantics).
    no_endpoint: Verdict,
}

impl PortRules<'_> {
    /// `address . protocol . port` of this port at `ip`.
    fn key_at(&self, ip: IpAddr) -> Key {
        key(ip, self.proto, self.sp.port)
    }

    /// How this port picks an endpoint: its annotation, else the proxy's default.
    fn load_balancing(&self) -> LoadBalancing {
        self.sp.load_balancing.unwrap_or(self.cfg.load_balancing)
    }

    /// "From a local pod": a source prefix, or an input interface.
    fn pod_source(&self, op: CmpOp) -> Option<Expr> {
        from_pod(&self.cfg.local_detector, self.family, op)
    }

    /// Whether the port needs nothing of its own: no affinity, no Local policy, no
    /// external destination, no endpoint on this node, random load balancing (a Maglev
    /// table belongs to its chain).
    fn nothing_of_its_own(&self) -> bool {
        let sp = self.sp;
        sp.affinity_timeout.is_none()
            && self.load_balancing() == LoadBalancing::Random
            && !sp.internal_policy_local
            && !sp.externally_accessible()
            && self.cat.local.is_empty()
    }

    /// The hairpin pairs of every reachable endpoint and the ClusterIP in `cluster-ips`.
    fn shared_elements(&self, rs: &mut Fragment) {
        for ep in &self.cat.all_reachable {
            rs.element(Element::new(
                shared_name(HAIRPIN),
                vec![KeyValue::Addr(ep.ip), KeyValue::Addr(ep.ip)],
                ElemData::None,
                None,
            ));
        }
        rs.element(Element::new(
            shared_name(CLUSTER_IPS),
            vec![KeyValue::Addr(self.cluster_ip)],
            ElemData::None,
            None,
        ));
    }

    /// One endpoint and nothing of its own: an element of the one-endpoint map, and the
    /// shared chain that masquerades and DNATs through it as this port's chain would have.
    /// Whether it applied.
    fn one_endpoint_fast_path(&self, rs: &mut Fragment) -> bool {
        let ([ep], true) = (&self.cat.cluster[..], self.nothing_of_its_own()) else {
            return false;
        };
        rs.element(Element::new(
            shared_name(ONE_ENDPOINT_SERVICES),
            self.key_at(self.cluster_ip),
            ElemData::Target(Target::new(ep.ip, ep.port)),
            Some(self.comment.clone()),
        ));
        rs.element(elem(
            SERVICE_IPS,
            self.key_at(self.cluster_ip),
            Verdict::Goto(ONE_ENDPOINT_CHAIN.into()),
            &self.comment,
        ));
        true
    }

    /// Several, and nothing of its own: its endpoints are elements 0..N of its address and
    /// port in the `balance-N` map, which the shared `balance-N` chain picks from at random
    /// (one endpoint change is element updates: no chain of its own for the kernel to walk
    /// on every commit). No comment on those elements: `service-ips` names the service
    /// port, and ~20 bytes per endpoint add up (10⁶ endpoints at 100k × 10). Whether it
    /// applied.
    fn balance_fast_path(&self, rs: &mut Fragment) -> bool {
        let n = self.cat.cluster.len();
        if !self.nothing_of_its_own() || !(2..=MAX_BALANCED_ENDPOINTS).contains(&n) {
            return false;
        }
        let map = shared_name(&balance_map(n));
        for (i, ep) in self.cat.cluster.iter().enumerate() {
            let mut k = self.key_at(self.cluster_ip);
            k.push(KeyValue::Slot(i as u32));
            rs.element(Element::new(
                map.clone(),
                k,
                ElemData::Target(Target::new(ep.ip, ep.port)),
                None,
            ));
        }
        rs.element(elem(
            SERVICE_IPS,
            self.key_at(self.cluster_ip),
            Verdict::Goto(balance_chain(n).into()),
            &self.comment,
        ));
        true
    }

    /// Masquerading of ClusterIP traffic belongs to the chain ClusterIP traffic uses,
    /// whatever its policy (upstream puts it in the internal traffic chain): with
    /// internalTrafficPolicy Local the node itself, off-cluster sources routed here, and
    /// every source under masqueradeAll are masqueraded just as with Cluster.
    fn masquerade_cluster_ip(&self, chain: &str) -> Option<Rule> {
        let to_cluster_ip = Expr::Addr {
            field: Field::Daddr,
            op: CmpOp::Eq,
            value: Cidr::host(self.cluster_ip),
        };
        if self.cfg.masquerade_all {
            return Some(Rule::new(
                chain,
                vec![to_cluster_ip, jump(MARK_FOR_MASQUERADE)],
            ));
        }
        self.pod_source(CmpOp::Neq).map(|not_pod| {
            Rule::new(
                chain,
                vec![to_cluster_ip, not_pod, jump(MARK_FOR_MASQUERADE)],
            )
            .with_comment("masquerade traffic from outside the cluster")
        })
    }

    /// The Cluster-policy chain and the Local-policy chain, each when it has endpoints.
    fn policy_chains(&self, rs: &mut Fragment, slots: &mut SlotAllocator) -> Reach {
        let sp = self.sp;
        for (chain, eps, masquerades) in [
            (
                &self.chains.service,
                &self.cat.cluster,
                !sp.internal_policy_local,
            ),
            (
                &self.chains.local,
                &self.cat.local,
                sp.internal_policy_local,
            ),
        ] {
            if eps.is_empty() {
                continue;
            }
            let mut rules = Vec::new();
            if masquerades {
                rules.extend(self.masquerade_cluster_ip(chain));
            }
            let balance = Balance {
                chain,
                sp,
                eps,
                load_balancing: self.load_balancing(),
            };
            balance.rules(rs, &mut rules, slots);
            rs.chain(Chain::regular(chain), rules);
        }
        Reach {
            has_cluster: !self.cat.cluster.is_empty(),
            has_local: !self.cat.local.is_empty(),
            no_endpoint: if self.cat.has_any {
                Verdict::Drop
            } else {
                Verdict::Goto(REJECT_CHAIN.into())
            },
        }
    }

    /// The ClusterIP's element: to the chain of its internal traffic policy, or to the
    /// no-endpoint verdict.
    fn cluster_ip_dispatch(&self, rs: &mut Fragment, reach: &Reach) {
        let (internal_ok, internal_chain) = if self.sp.internal_policy_local {
            (reach.has_local, &self.chains.local)
        } else {
            (reach.has_cluster, &self.chains.service)
        };
        let k = self.key_at(self.cluster_ip);
        if internal_ok {
            let to = Verdict::Goto(internal_chain.as_str().into());
            rs.element(elem(SERVICE_IPS, k, to, &self.comment));
        } else {
            let v = reach.no_endpoint.clone();
            rs.element(elem(NO_ENDPOINT_SERVICES, k, v, &self.comment));
        }
    }

    /// The external chain, and whether the port uses it. As upstream: it is used whenever
    /// the Service has endpoints anywhere. With externalTrafficPolicy Local and none on
    /// this node it still short-circuits pods and the node itself to the cluster-wide
    /// endpoints; only traffic from elsewhere falls through it undNATed, to be dropped by
    /// the no-endpoint maps after DNAT.
    fn external_chain(&self, rs: &mut Fragment, reach: &Reach) -> bool {
        if !(self.cat.has_any && reach.has_cluster) {
            return false;
        }
        let ServiceChains {
            service,
            local,
            external,
            ..
        } = &self.chains;
        let mut rules = Vec::new();
        if self.sp.external_policy_local {
            if let Some(pod) = self.pod_source(CmpOp::Eq) {
                rules.push(
                    Rule::new(external, vec![pod, goto(service)])
                        .with_comment("short-circuit pod traffic"),
                );
            }
            let from_host = Expr::FibLocal(Field::Saddr);
            rules.push(
                Rule::new(external, vec![from_host.clone(), jump(MARK_FOR_MASQUERADE)])
                    .with_comment("masquerade local traffic"),
            );
            rules.push(
                Rule::new(external, vec![from_host, goto(service)])
                    .with_comment("short-circuit local traffic"),
            );
            if reach.has_local {
                rules.push(Rule::new(external, vec![goto(local)]));
            }
        } else {
            rules.push(Rule::new(external, vec![jump(MARK_FOR_MASQUERADE)]));
            rules.push(Rule::new(external, vec![goto(service)]));
        }
        rs.chain(Chain::regular(external), rules);
        true
    }

    /// The elements of the external destinations, written once for service IPs (external
    /// and LoadBalancer IPs) and NodePorts: to the external chain, to the no-endpoint
    /// verdict when external traffic has no endpoint under its policy, and a NodePort's
    /// localhost reject.
    fn external_dispatch(
        &self,
        rs: &mut Fragment,
        reach: &Reach,
        uses_ext_chain: bool,
        external_ips: &[IpAddr],
        lb_ips: &[IpAddr],
    ) {
        let external_ok = if self.sp.external_policy_local {
            reach.has_local
        } else {
            reach.has_cluster
        };
        let mut dispatch = |to_chain: &str, no_endpoint: &str, k: Key| {
            if uses_ext_chain {
                let to = Verdict::Goto(self.chains.external.as_str().into());
                rs.element(elem(to_chain, k, to, &self.comment));
            }
            if !external_ok {
                let v = reach.no_endpoint.clone();
                rs.element(elem(no_endpoint, k, v, &self.comment));
            }
        };
        for ip in external_ips.iter().chain(lb_ips) {
            dispatch(SERVICE_IPS, NO_ENDPOINT_SERVICES, self.key_at(*ip));
        }
        let Some(np) = self.sp.node_port else {
            return;
        };
        let k: Key = [KeyValue::Proto(self.proto), KeyValue::Port(np)].into();
        dispatch(SERVICE_NODEPORTS, NO_ENDPOINT_NODEPORTS, k);
        let protocol = self.sp.name.protocol;
        let loopback = self.cfg.loopback_nodeports.of(self.family == Family::Ip);
        if loopback.rejects().contains(&protocol) {
            let reject = localhost_reject_chain(protocol);
            let to = Verdict::Goto(reject.as_str().into());
            rs.element(elem(LOCALHOST_NODEPORT_REJECTS, k, to, &self.comment));
        }
    }

    /// loadBalancerSourceRanges: a firewall chain for the LB IPs, only when ranges are set.
    fn firewall(&self, rs: &mut Fragment, lb_ips: &[IpAddr]) {
        let sp = self.sp;
        if lb_ips.is_empty() || sp.load_balancer_source_ranges.is_empty() {
            return;
        }
        let fw = &self.chains.firewall;
        let mut allowed = cidrs_of(&sp.load_balancer_source_ranges, self.family);
        // A node reaching its own LB IP uses the LB IP as source (upstream allowFromNode).
        let node_allowed = self
            .node
            .addresses
            .iter()
            .any(|a| allowed.iter().any(|c| c.contains(a)));
        if node_allowed {
            allowed.extend(lb_ips.iter().map(|ip| Cidr::host(*ip)));
        }
        let mut rules: Vec<Rule> = allowed
            .into_iter()
            .map(|c| {
                let from = Expr::Addr {
                    field: Field::Saddr,
                    op: CmpOp::Eq,
                    value: c,
                };
                Rule::new(fw, vec![from, Expr::Verdict(Verdict::Return)])
            })
            .collect();
        rules.push(Rule::new(fw, vec![Expr::Verdict(Verdict::Drop)]));
        rs.chain(Chain::regular(fw), rules);
        for ip in lb_ips {
            let to = Verdict::Goto(fw.as_str().into());
            rs.element(elem(FIREWALL_IPS, self.key_at(*ip), to, &self.comment));
        }
    }
}
