//! The userspace mode's nftables table: `nat-*` base chains send each service address and
//! NodePort through verdict maps to a per-listener chain that redirects to the listener's
//! port; no-endpoint rejects and loadBalancerSourceRanges are filtered before the redirect.
//! Pure.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::kernel::nft::{Chain, Expr, Family, Hook, KeyValue, Name, Rule, Set, Verdict};
use crate::model::{NodeInfo, ProxyState, ServicePortName};
use crate::proxy::names::{
    userspace_chain, FILTER_OUTPUT, FILTER_PREROUTING, FIREWALL_IPS, NO_ENDPOINT_NODEPORTS,
    NO_ENDPOINT_SERVICES, REJECT_CHAIN, SERVICES, SERVICE_CHECKS, SERVICE_IPS, SERVICE_NODEPORTS,
};
use crate::proxy::rules::{
    addr_key, element, guarded, nat_dispatch, nodeport_guards, port_key, pre_dnat_checks,
    reject_chain, service_checks, source_range_firewall, vmap,
};
use crate::proxy::{Fragment, ProxierConfig};

use super::listeners::ListenerKey;

/// The static part of the table.
pub fn build_base(cfg: &ProxierConfig, node: &NodeInfo, family: Family) -> Fragment {
    let mut f = Fragment::default();
    let r = |chain: &str, exprs: Vec<Expr>| Rule::new(chain, exprs);
    // Before the redirect (at dstnat) rewrites the destination.
    pre_dnat_checks(
        &mut f,
        [
            (FILTER_PREROUTING, Hook::Prerouting),
            (FILTER_OUTPUT, Hook::Output),
        ],
        SERVICE_CHECKS,
    );
    // NodePorts only on the addresses `nodePortAddresses` allows (one rule per guard).
    let guards = nodeport_guards(cfg, node, family);
    service_checks(&mut f, &guards);
    nat_dispatch(&mut f, SERVICES);
    let mut services = vec![r(SERVICES, vec![vmap(addr_key(), SERVICE_IPS)])];
    services.extend(guarded(
        &guards,
        SERVICES,
        &[vmap(port_key(), SERVICE_NODEPORTS)],
    ));
    f.chain(Chain::regular(SERVICES), services);
    reject_chain(&mut f);
    for m in [SERVICE_IPS, NO_ENDPOINT_SERVICES, FIREWALL_IPS] {
        f.set(Set::vmap(m, addr_key()));
    }
    for m in [SERVICE_NODEPORTS, NO_ENDPOINT_NODEPORTS] {
        f.set(Set::vmap(m, port_key()));
    }
    f
}

/// One service port's fragment for `family`, given its listeners' ports.
pub fn build_service(
    state: &ProxyState,
    spn: &ServicePortName,
    ports: &BTreeMap<ListenerKey, (u16, bool)>,
    family: Family,
) -> Option<Fragment> {
    let sp = state.services.get(spn)?;
    let v4 = family == Family::Ip;
    let mut f = Fragment {
        created: sp.created,
        ..Fragment::default()
    };
    let comment: Name = spn.to_string().into();
    let proto = KeyValue::Proto(spn.protocol.number());
    let of_family = |a: &&IpAddr| a.is_ipv4() == v4;
    let any_usable = state.endpoints.get(spn).is_some_and(|eps| {
        eps.iter()
            .any(|e| e.ip.is_ipv4() == v4 && (e.ready || (e.serving && e.terminating)))
    });
    let no_ep = if any_usable {
        Verdict::Drop
    } else {
        Verdict::Goto(REJECT_CHAIN.into())
    };
    for external in [false, true] {
        let key = ListenerKey {
            service: spn.clone(),
            external,
            v4,
        };
        let Some(&(port, has_endpoints)) = ports.get(&key) else {
            continue;
        };
        let chain = userspace_chain(spn, external);
        let target = if has_endpoints {
            f.chain(
                Chain::regular(&chain),
                vec![Rule::new(&chain, vec![Expr::Redirect { port }])],
            );
            (
                SERVICE_IPS,
                SERVICE_NODEPORTS,
                Verdict::Goto(chain.as_str().into()),
            )
        } else {
            (NO_ENDPOINT_SERVICES, NO_ENDPOINT_NODEPORTS, no_ep.clone())
        };
        let addrs: Vec<IpAddr> = if external {
            sp.external_ips
                .iter()
                .chain(&sp.load_balancer_ips)
                .filter(of_family)
                .copied()
                .collect()
        } else {
            sp.cluster_ips.iter().filter(of_family).copied().collect()
        };
        for a in addrs {
            let k = vec![KeyValue::Addr(a), proto, KeyValue::Port(sp.port)];
            f.element(element(
                target.0,
                k.clone(),
                Some(target.2.clone()),
                &comment,
            ));
            if external && sp.load_balancer_ips.contains(&a) {
                source_range_firewall(&mut f, sp, family, k, &comment);
            }
        }
        if let (true, Some(np)) = (external, sp.node_port) {
            f.element(element(
                target.1,
                vec![proto, KeyValue::Port(np)],
                Some(target.2.clone()),
                &comment,
            ));
        }
    }
    Some(f)
}
