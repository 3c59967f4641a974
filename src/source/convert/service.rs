//! Converts one Service into its service ports. Pure. Each value the Service carries is read
//! by a step of its own; a bad value is named in a warning on the Service and either skipped
//! (an address, a range, a port) or, when nothing could be proxied without it (the
//! ClusterIPs), skips the whole Service.

use std::collections::HashSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Service, ServicePort as ServicePortSpec, ServiceSpec};

use super::{obj_name, parse_ip, ObjectWarnings, ServiceSelection};
use crate::model::intern::{self, ArcStr};
use crate::model::net::Cidr;
use crate::model::warning::ObjectWarning;
use crate::model::{LoadBalancing, Protocol, ServicePort, ServicePortName};

/// The annotation that picks a Service's load balancing (our extension): `maglev` or
/// `random`.
pub const ANNOTATION_LOAD_BALANCING: &str = "kube-nlproxy.io/load-balancing";

/// Upstream's default ClientIP affinity timeout (three hours), also used in place of one out
/// of range.
const DEFAULT_AFFINITY_TIMEOUT: u32 = 10800;

/// Converts one Service to its service ports; none when it is not ours to proxy (another
/// proxy's by `selection`, headless, ExternalName).
pub fn convert_service(
    svc: &Service,
    selection: &ServiceSelection,
    warnings: &mut Vec<ObjectWarning>,
) -> Vec<ServicePort> {
    let meta = &svc.metadata;
    if !selection.selects_service(meta.labels.as_ref()) {
        return vec![];
    }
    let mut warn = ObjectWarnings::new("Service", obj_name(&meta.namespace, &meta.name), warnings);
    let Some(spec) = &svc.spec else {
        warn.push("no spec; skipped");
        return vec![];
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return vec![];
    }
    let raw_ips = raw_cluster_ips(spec);
    if raw_ips.iter().any(|s| s == "None") {
        return vec![]; // headless
    }
    let Some(cluster_ips) = cluster_ips_of(&raw_ips, &mut warn) else {
        return vec![];
    };
    let shared = SharedByPorts {
        external_ips: external_ips_of(spec, &mut warn),
        load_balancer_ips: load_balancer_ips_of(svc, &mut warn),
        source_ranges: source_ranges_of(spec, &mut warn),
        affinity_timeout: affinity_timeout_of(spec, &mut warn),
        health_check_node_port: health_check_node_port_of(spec, &mut warn),
        cluster_ips,
        external_policy_local: spec.external_traffic_policy.as_deref() == Some("Local"),
        internal_policy_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
        created: meta.creation_timestamp.as_ref().map(|t| t.0.as_second()),
        load_balancing: load_balancing_of(svc, &mut warn),
    };
    service_ports_of(svc, spec, &shared, &mut warn)
}

/// `spec.clusterIPs`, or `spec.clusterIP` when that list is missing or empty, as written.
fn raw_cluster_ips(spec: &ServiceSpec) -> Vec<String> {
    match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(v), _) if !v.is_empty() => v.clone(),
        (_, Some(ip)) => vec![ip.clone()],
        _ => vec![],
    }
}

/// The ClusterIPs, the first of each family. `None` (the Service is skipped, with a warning)
/// when one does not parse or there is none.
fn cluster_ips_of(raw_ips: &[String], warn: &mut ObjectWarnings) -> Option<Vec<IpAddr>> {
    let mut cluster_ips = Vec::new();
    for s in raw_ips {
        match parse_ip(s) {
            Some(ip)
                if !cluster_ips
                    .iter()
                    .any(|c: &IpAddr| c.is_ipv4() == ip.is_ipv4()) =>
            {
                cluster_ips.push(ip)
            }
            Some(ip) => warn.push(format!("second ClusterIP {ip} of the same family ignored")),
            None => {
                warn.push(format!("invalid ClusterIP {s:?}; Service skipped"));
                return None;
            }
        }
    }
    if cluster_ips.is_empty() {
        warn.push("no ClusterIP; skipped");
        return None;
    }
    Some(cluster_ips)
}

/// `spec.externalIPs` that parse; the others are named in warnings.
fn external_ips_of(spec: &ServiceSpec, warn: &mut ObjectWarnings) -> Vec<IpAddr> {
    let mut external_ips = Vec::new();
    for s in spec.external_ips.iter().flatten() {
        match parse_ip(s) {
            Some(ip) => external_ips.push(ip),
            None => warn.push(format!("invalid externalIP {s:?} ignored")),
        }
    }
    external_ips
}

/// The LoadBalancer ingress IPs from the status that parse, except those of `ipMode: Proxy`.
fn load_balancer_ips_of(svc: &Service, warn: &mut ObjectWarnings) -> Vec<IpAddr> {
    let mut load_balancer_ips = Vec::new();
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    for ing in ingress.into_iter().flatten() {
        // ipMode Proxy: the load balancer delivers to the node with its own address as
        // destination, so the LB IP must not be short-circuited here (KEP-1860).
        if ing.ip_mode.as_deref() == Some("Proxy") {
            continue;
        }
        if let Some(s) = &ing.ip {
            match parse_ip(s) {
                Some(ip) => load_balancer_ips.push(ip),
                None => warn.push(format!("invalid LoadBalancer ingress IP {s:?} ignored")),
            }
        }
    }
    load_balancer_ips
}

/// `spec.loadBalancerSourceRanges` that parse; the others are named in warnings.
fn source_ranges_of(spec: &ServiceSpec, warn: &mut ObjectWarnings) -> Vec<Cidr> {
    let mut source_ranges = Vec::new();
    for s in spec.load_balancer_source_ranges.iter().flatten() {
        match s.parse::<Cidr>() {
            Ok(c) => source_ranges.push(c),
            Err(e) => warn.push(format!("invalid loadBalancerSourceRange ignored: {e}")),
        }
    }
    source_ranges
}

/// The ClientIP affinity timeout in seconds, `None` without ClientIP affinity. A timeout
/// outside 1-86400 (upstream's validation) is replaced by the default, with a warning.
fn affinity_timeout_of(spec: &ServiceSpec, warn: &mut ObjectWarnings) -> Option<u32> {
    if spec.session_affinity.as_deref() != Some("ClientIP") {
        return None;
    }
    let t = spec
        .session_affinity_config
        .as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds)
        .unwrap_or(DEFAULT_AFFINITY_TIMEOUT as i32);
    if (1..=86400).contains(&t) {
        return Some(t as u32);
    }
    warn.push(format!(
        "sessionAffinity timeoutSeconds {t} out of range; using {DEFAULT_AFFINITY_TIMEOUT}"
    ));
    Some(DEFAULT_AFFINITY_TIMEOUT)
}

/// `spec.healthCheckNodePort`; 0 means none, and one out of range is ignored with a warning.
fn health_check_node_port_of(spec: &ServiceSpec, warn: &mut ObjectWarnings) -> Option<u16> {
    match spec.health_check_node_port {
        Some(p) if (1..=65535).contains(&p) => Some(p as u16),
        Some(0) | None => None,
        Some(p) => {
            warn.push(format!("invalid healthCheckNodePort {p} ignored"));
            None
        }
    }
}

/// The `kube-nlproxy.io/load-balancing` annotation; `None` without it, and for a value
/// other than `maglev` or `random` (named in a warning: the proxy's default applies).
fn load_balancing_of(svc: &Service, warn: &mut ObjectWarnings) -> Option<LoadBalancing> {
    let value = svc
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_LOAD_BALANCING)?;
    let parsed = LoadBalancing::parse(value.trim());
    if parsed.is_none() {
        warn.push(format!(
            "annotation {ANNOTATION_LOAD_BALANCING}: unknown value {value:?} (want maglev or random); the default applies"
        ));
    }
    parsed
}

/// What every port of one Service carries alike.
struct SharedByPorts {
    cluster_ips: Vec<IpAddr>,
    external_ips: Vec<IpAddr>,
    load_balancer_ips: Vec<IpAddr>,
    source_ranges: Vec<Cidr>,
    affinity_timeout: Option<u32>,
    health_check_node_port: Option<u16>,
    /// `externalTrafficPolicy: Local`; it applies only to a port reachable from outside.
    external_policy_local: bool,
    internal_policy_local: bool,
    created: Option<i64>,
    load_balancing: Option<LoadBalancing>,
}

impl SharedByPorts {
    /// The service port of one checked entry of `spec.ports`.
    fn service_port(&self, name: ServicePortName, port: &CheckedPort) -> ServicePort {
        let externally = port.node_port.is_some()
            || !self.external_ips.is_empty()
            || !self.load_balancer_ips.is_empty();
        ServicePort {
            name,
            cluster_ips: self.cluster_ips.clone(),
            port: port.port,
            node_port: port.node_port,
            external_ips: self.external_ips.clone(),
            load_balancer_ips: self.load_balancer_ips.clone(),
            load_balancer_source_ranges: self.source_ranges.clone(),
            affinity_timeout: self.affinity_timeout,
            external_policy_local: externally && self.external_policy_local,
            internal_policy_local: self.internal_policy_local,
            health_check_node_port: self.health_check_node_port,
            created: self.created,
            load_balancing: self.load_balancing,
        }
    }
}

/// The service port of each entry of `spec.ports` that passes [`port_of`], one per name and
/// protocol (a later duplicate is skipped with a warning).
fn service_ports_of(
    svc: &Service,
    spec: &ServiceSpec,
    shared: &SharedByPorts,
    warn: &mut ObjectWarnings,
) -> Vec<ServicePort> {
    let meta = &svc.metadata;
    let ns = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let name = meta.name.clone().unwrap_or_default();
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    // One copy of each name for all of the Service's ports.
    let (ns_shared, name_shared): (ArcStr, ArcStr) =
        (intern::shared(ns.as_str()), name.as_str().into());
    for p in spec.ports.iter().flatten() {
        let Some(port) = port_of(p, warn) else {
            continue;
        };
        let spn = ServicePortName {
            namespace: ns_shared.clone(),
            name: name_shared.clone(),
            port: intern::shared(port.name),
            protocol: port.protocol,
        };
        if !seen.insert(spn.clone()) {
            warn.push(format!(
                "duplicate port name {:?} for {}; later one skipped",
                port.name, port.protocol_text
            ));
            continue;
        }
        out.push(shared.service_port(spn, &port));
    }
    out
}

/// One entry of `spec.ports` whose protocol, port and NodePort are valid.
struct CheckedPort<'a> {
    /// The port's name, empty when it has none.
    name: &'a str,
    /// The protocol as written (`TCP` when left out), for warnings.
    protocol_text: &'a str,
    protocol: Protocol,
    port: u16,
    node_port: Option<u16>,
}

/// Checks one entry of `spec.ports`: `None` (with a warning) for an unknown protocol, a port
/// outside 1-65535 or a NodePort outside it (0 means none).
fn port_of<'a>(p: &'a ServicePortSpec, warn: &mut ObjectWarnings) -> Option<CheckedPort<'a>> {
    let pname = p.name.as_deref().unwrap_or_default();
    let proto_s = p.protocol.as_deref().unwrap_or("TCP");
    let Some(protocol) = Protocol::parse(proto_s) else {
        warn.push(format!(
            "port {pname:?}: unknown protocol {proto_s:?}; port skipped"
        ));
        return None;
    };
    if !(1..=65535).contains(&p.port) {
        warn.push(format!(
            "port {pname:?}: port {} out of range 1-65535; port skipped",
            p.port
        ));
        return None;
    }
    let node_port = match p.node_port {
        None | Some(0) => None,
        Some(n) if (1..=65535).contains(&n) => Some(n as u16),
        Some(n) => {
            warn.push(format!(
                "port {pname:?}: nodePort {n} out of range; port skipped"
            ));
            return None;
        }
    };
    Some(CheckedPort {
        name: pname,
        protocol_text: proto_s,
        protocol,
        port: p.port as u16,
        node_port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::convert::tests::{parse, svc};
    use crate::source::convert::LABEL_SERVICE_PROXY_NAME;

    #[test]
    fn bad_ports_are_skipped_with_warnings_and_good_ones_kept() {
        let s = svc(
            "  clusterIP: 10.0.0.1\n  ports:\n  - {name: a, port: 0}\n  - {name: b, port: 70000}\n  - {name: c, port: 80, protocol: ICMP}\n  - {name: d, port: 81, protocol: UDP}\n",
        );
        let mut w = Vec::new();
        let ports = convert_service(&s, &ServiceSelection::default(), &mut w);
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].name.port, "d");
        assert_eq!(ports[0].name.protocol, Protocol::Udp);
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(
            w.iter()
                .all(|m| m.to_string().starts_with("Service ns/s: port")),
            "{w:?}"
        );
    }

    #[test]
    fn invalid_cluster_ip_skips_the_service() {
        let s = svc("  clusterIP: 10.0.0.300\n  ports: [{port: 80}]\n");
        let mut w = Vec::new();
        assert!(convert_service(&s, &ServiceSelection::default(), &mut w).is_empty());
        assert!(w[0].to_string().contains("invalid ClusterIP"), "{w:?}");
    }

    #[test]
    fn headless_external_name_and_other_proxies_produce_nothing() {
        let mut w = Vec::new();
        assert!(convert_service(
            &svc("  clusterIP: None\n  ports: [{port: 80}]\n"),
            &ServiceSelection::default(),
            &mut w
        )
        .is_empty());
        assert!(convert_service(
            &svc("  type: ExternalName\n  externalName: x.example\n"),
            &ServiceSelection::default(),
            &mut w
        )
        .is_empty());
        let mut s = svc("  clusterIP: 10.0.0.1\n  ports: [{port: 80}]\n");
        s.metadata.labels = Some([(LABEL_SERVICE_PROXY_NAME.to_string(), "x".to_string())].into());
        assert!(convert_service(&s, &ServiceSelection::default(), &mut w).is_empty());
        // With `--service-proxy-name x` that one is ours, and an unlabelled one is not.
        let x = ServiceSelection::from_flag("x").unwrap();
        assert_eq!(convert_service(&s, &x, &mut w).len(), 1);
        let unlabelled = svc("  clusterIP: 10.0.0.1\n  ports: [{port: 80}]\n");
        assert!(convert_service(&unlabelled, &x, &mut w).is_empty());
        assert!(w.is_empty(), "these are not errors: {w:?}");
    }

    #[test]
    fn policies_affinity_and_external_addresses() {
        let mut s = svc(
            "  type: LoadBalancer\n  clusterIPs: [10.0.0.1, 'fd00::1']\n  externalTrafficPolicy: Local\n  internalTrafficPolicy: Local\n  sessionAffinity: ClientIP\n  externalIPs: [1.2.3.4, nope]\n  loadBalancerSourceRanges: [1.2.3.0/24]\n  ports: [{port: 80, nodePort: 30080}]\n",
        );
        s.status = Some(parse(
            "loadBalancer: {ingress: [{ip: 5.6.7.8}, {ip: 9.9.9.9, ipMode: Proxy}]}",
        ));
        let mut w = Vec::new();
        let p = &convert_service(&s, &ServiceSelection::default(), &mut w)[0];
        assert_eq!(p.cluster_ips.len(), 2);
        assert!(p.external_policy_local && p.internal_policy_local);
        assert_eq!(p.affinity_timeout, Some(10800));
        assert_eq!(p.external_ips, vec!["1.2.3.4".parse::<IpAddr>().unwrap()]);
        assert_eq!(
            p.load_balancer_ips,
            vec!["5.6.7.8".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(p.node_port, Some(30080));
        assert_eq!(w.len(), 1, "{w:?}");
    }

    #[test]
    fn the_load_balancing_annotation_picks_maglev_or_random_and_warns_on_anything_else() {
        let with = |value: Option<&str>| {
            let mut s = svc("  clusterIP: 10.0.0.1\n  ports: [{port: 80}, {name: b, port: 81}]\n");
            s.metadata.annotations =
                value.map(|v| [(ANNOTATION_LOAD_BALANCING.to_string(), v.to_string())].into());
            let mut w = Vec::new();
            let ports = convert_service(&s, &ServiceSelection::default(), &mut w);
            let lb: Vec<_> = ports.iter().map(|p| p.load_balancing).collect();
            (lb, w)
        };
        let (lb, w) = with(Some("maglev"));
        assert_eq!(lb, vec![Some(LoadBalancing::Maglev); 2], "every port");
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(with(Some("random")).0, vec![Some(LoadBalancing::Random); 2]);
        assert_eq!(
            with(None).0,
            vec![None; 2],
            "no annotation: the default applies"
        );
        let (lb, w) = with(Some("Maglev-ish"));
        assert_eq!(lb, vec![None; 2], "the Service stays, with the default");
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(
            w[0].to_string(),
            "Service ns/s: annotation kube-nlproxy.io/load-balancing: unknown value \"Maglev-ish\" (want maglev or random); the default applies"
        );
    }

    /// The conversion half of upstream's TestLoadBalancerIngressRouteTypeProxy and
    /// TestLoadBalancer: an ingress IP with `ipMode: Proxy` is left out, `VIP` and none are
    /// kept; a source range written with a leading space is read.
    #[test]
    fn load_balancer_ingress_ip_modes_and_a_spaced_source_range() {
        let mut s = svc(
            "  type: LoadBalancer\n  clusterIP: 172.30.0.41\n  loadBalancerSourceRanges: ['192.168.0.0/24', ' 203.0.113.0/25']\n  ports: [{name: p80, port: 80, nodePort: 3001}]\n",
        );
        s.status = Some(parse(
            "loadBalancer: {ingress: [{ip: 1.2.3.4, ipMode: Proxy}, {ip: 1.2.3.5, ipMode: VIP}, {ip: 1.2.3.6}]}",
        ));
        let mut w = Vec::new();
        let p = &convert_service(&s, &ServiceSelection::default(), &mut w)[0];
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(
            p.load_balancer_ips,
            ["1.2.3.5", "1.2.3.6"].map(|a| a.parse::<IpAddr>().unwrap())
        );
        assert_eq!(
            p.load_balancer_source_ranges,
            ["192.168.0.0/24", "203.0.113.0/25"].map(|c| c.parse::<Cidr>().unwrap())
        );
    }
}
