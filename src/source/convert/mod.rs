//! Converts Kubernetes objects (k8s-openapi types) into the model. Pure. Bad values are
//! reported as warnings naming the object and skipped: one broken Service never stops the
//! others from being programmed. Services are converted in `service.rs`, EndpointSlices in
//! `slices.rs`; here are the Node and ServiceCIDRs, the whole state put together from them,
//! and the service ports that claim one address.

mod selection;
mod service;
mod slices;

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;

pub use self::selection::ServiceSelection;
pub use self::service::convert_service;
pub use self::slices::merge_endpoints;
pub use self::slices::{convert_slice, parse_rfc3339, SliceEndpoints, ANNOTATION_TRIGGER_TIME};
use crate::model::collisions::collisions;
use crate::model::net::Cidr;
use crate::model::warning::ObjectWarning;
use crate::model::{Endpoint, NodeInfo, Protocol, ProxyState, ServicePort, ServicePortName};

/// Label that hands a Service to another proxy.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label the EndpointSlice controller puts on slices of headless Services.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Label joining a slice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";

/// The Kubernetes objects the proxy consumes, as one consistent snapshot.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub services: Vec<Service>,
    pub endpoint_slices: Vec<EndpointSlice>,
    pub node: Option<Node>,
    /// `networking.k8s.io/v1` ServiceCIDRs (Kubernetes 1.33+).
    pub service_cidrs: Vec<ServiceCIDR>,
}

fn obj_name(ns: &Option<String>, name: &Option<String>) -> String {
    format!(
        "{}/{}",
        ns.as_deref().unwrap_or("default"),
        name.as_deref().unwrap_or("<unnamed>")
    )
}

/// Parses an IP the way kube-proxy accepts them (no leading zeros, no zone).
fn parse_ip(s: &str) -> Option<IpAddr> {
    s.parse().ok()
}

/// The warnings about one object, each naming it: the conversions of one object push
/// their problems here.
struct ObjectWarnings<'w> {
    /// `Service`, `EndpointSlice`, ...
    kind: &'static str,
    /// The object's name (`namespace/name` when it has a namespace).
    object: String,
    out: &'w mut Vec<ObjectWarning>,
}

impl<'w> ObjectWarnings<'w> {
    fn new(kind: &'static str, object: String, out: &'w mut Vec<ObjectWarning>) -> Self {
        ObjectWarnings { kind, object, out }
    }

    /// Adds one problem of the object.
    fn push(&mut self, problem: impl Into<String>) {
        self.out
            .push(ObjectWarning::new(self.kind, self.object.clone(), problem));
    }
}

/// Converts the Node object (or just the name when there is none).
pub fn convert_node(
    node: Option<&Node>,
    node_name: &str,
    warnings: &mut Vec<ObjectWarning>,
) -> NodeInfo {
    let mut info = NodeInfo {
        name: node_name.to_string(),
        ..Default::default()
    };
    let Some(n) = node else { return info };
    info.labels = n.metadata.labels.clone().unwrap_or_default();
    let tainted = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == "ToBeDeletedByClusterAutoscaler"));
    info.being_deleted = n.metadata.deletion_timestamp.is_some() || tainted;
    if let Some(addrs) = n.status.as_ref().and_then(|s| s.addresses.as_ref()) {
        for kind in ["InternalIP", "ExternalIP"] {
            for a in addrs.iter().filter(|a| a.type_ == kind) {
                match parse_ip(&a.address) {
                    Some(ip) if !info.addresses.contains(&ip) => info.addresses.push(ip),
                    Some(_) => {}
                    None => warnings.push(ObjectWarning::new(
                        "Node",
                        node_name.to_string(),
                        format!("invalid address {:?} ignored", a.address),
                    )),
                }
            }
        }
    }
    if let Some(spec) = &n.spec {
        let cidrs: Vec<String> = match (&spec.pod_cidrs, &spec.pod_cidr) {
            (Some(v), _) if !v.is_empty() => v.clone(),
            (_, Some(c)) => vec![c.clone()],
            _ => vec![],
        };
        for c in cidrs {
            match c.parse::<Cidr>() {
                Ok(c) => info.pod_cidrs.push(c),
                Err(e) => warnings.push(ObjectWarning::new(
                    "Node",
                    node_name.to_string(),
                    format!("invalid podCIDR: {e}"),
                )),
            }
        }
    }
    info
}

/// Builds the whole model from a snapshot, of the Services and slices `selection` takes.
/// Returns the state and the warnings to log.
pub fn build_state(
    snap: &Snapshot,
    node_name: &str,
    selection: &ServiceSelection,
) -> (ProxyState, Vec<ObjectWarning>) {
    let mut warnings = Vec::new();
    let node = convert_node(snap.node.as_ref(), node_name, &mut warnings);
    let mut seen = std::collections::BTreeSet::new();
    let mut ports: Vec<Arc<ServicePort>> = Vec::with_capacity(snap.services.len());
    for svc in &snap.services {
        let m = &svc.metadata;
        let id = (m.namespace.as_deref(), m.name.as_deref());
        if !seen.insert(id) {
            warnings.push(ObjectWarning::new(
                "Service",
                format!("{}/{}", id.0.unwrap_or_default(), id.1.unwrap_or_default()),
                "defined more than once; the last definition is used",
            ));
        }
        ports.extend(
            convert_service(svc, selection, &mut warnings)
                .into_iter()
                .map(Arc::new),
        );
    }
    let cidrs: Vec<Cidr> = snap
        .service_cidrs
        .iter()
        .flat_map(|o| convert_service_cidr(o, &mut warnings))
        .collect();
    let slices: Vec<SliceEndpoints> = snap
        .endpoint_slices
        .iter()
        .map(|s| convert_slice(s, node_name, selection, &mut warnings))
        .collect();
    let state = assemble(node, ports.iter(), slices.iter(), cidrs);
    warnings.extend(collisions(&state));
    (state, warnings)
}

/// Puts converted objects together into the whole model: service ports (a later one of the
/// same name replaces an earlier one), their endpoints from every slice (one copy of an
/// endpoint that two slices list, the ready one when they disagree), trigger times, and the
/// union of the service CIDRs. Collisions between service ports are left to the caller
/// ([`collisions_of`](crate::model::collisions::collisions_of)): the API source assembles a state per change and names only new
/// ones.
pub fn assemble<'a>(
    node: NodeInfo,
    services: impl IntoIterator<Item = &'a Arc<ServicePort>>,
    slices: impl IntoIterator<Item = &'a SliceEndpoints> + Clone,
    mut service_cidrs: Vec<Cidr>,
) -> ProxyState {
    let mut state = ProxyState {
        node,
        ..Default::default()
    };
    // Built in bulk from a sorted sequence (not entry by entry): this runs once per state
    // the API source publishes, over every service port. Of equal names the later one
    // stays.
    state.services = services
        .into_iter()
        .map(|sp| (sp.name.clone(), sp.clone()))
        .collect();
    service_cidrs.sort();
    service_cidrs.dedup();
    state.service_cidrs = service_cidrs;
    // Every slice's lists by service port; the stable sort keeps the slices' order among
    // lists of one service port, which merging relies on.
    let mut lists: Vec<(&ServicePortName, &Arc<Vec<Endpoint>>)> = slices
        .clone()
        .into_iter()
        .flat_map(|s| s.ports.iter().map(|(k, l)| (k, l)))
        .collect();
    lists.sort_by(|a, b| a.0.cmp(b.0));
    let mut known = state.services.keys().peekable();
    let mut merged = Vec::with_capacity(lists.len());
    for group in lists.chunk_by(|a, b| a.0 == b.0) {
        let spn = group[0].0;
        // Only service ports that exist: a walk beside the (sorted) services.
        while known.peek().is_some_and(|k| *k < spn) {
            known.next();
        }
        if known.peek() != Some(&spn) {
            continue;
        }
        // The same endpoint may appear in two slices while a slice is being rebalanced:
        // keep one. A lone list was merged by `convert_slice`: shared, not copied.
        let eps = match group {
            [(_, one)] => Arc::clone(one),
            _ => Arc::new(merge_endpoints(group.iter().flat_map(|(_, l)| l.iter()))),
        };
        merged.push((spn.clone(), eps));
    }
    state.endpoints = merged.into_iter().collect();
    for slice in slices {
        let (Some(t), Some((ns, svc))) = (slice.trigger_time, &slice.service) else {
            continue;
        };
        // The Service's ports are adjacent in the map (ordered by namespace, name, port):
        // a range, not a scan of every port (the EndpointSlice controller stamps every
        // slice, and a scan per slice made 10k Services take 1.9 s instead of ~0.1 s).
        let first = ServicePortName {
            namespace: ns.clone(),
            name: svc.clone(),
            port: "".into(),
            protocol: Protocol::Tcp,
        };
        let ports: Vec<ServicePortName> = state
            .services
            .range(first..)
            .map(|(k, _)| k)
            .take_while(|k| *k.namespace == **ns && *k.name == **svc)
            .cloned()
            .collect();
        for spn in ports {
            let slot = state.trigger_times.entry(spn).or_insert(t);
            *slot = (*slot).max(t);
        }
    }
    state
}

/// One ServiceCIDR object's `spec.cidrs`; a CIDR that does not parse is named in a warning
/// and skipped. [`assemble`] takes the union. Pure.
pub fn convert_service_cidr(o: &ServiceCIDR, warnings: &mut Vec<ObjectWarning>) -> Vec<Cidr> {
    let name = o.metadata.name.as_deref().unwrap_or("");
    let mut out = Vec::new();
    for c in o
        .spec
        .as_ref()
        .and_then(|s| s.cidrs.as_ref())
        .into_iter()
        .flatten()
    {
        match c.parse::<Cidr>() {
            Ok(c) => out.push(c),
            Err(e) => warnings.push(ObjectWarning::new(
                "ServiceCIDR",
                name.to_string(),
                format!("field spec.cidrs: {c:?}: {e}; skipped"),
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn parse<T: serde::de::DeserializeOwned>(y: &str) -> T {
        serde_saphyr::from_str(y).unwrap()
    }

    pub(super) fn svc(spec: &str) -> Service {
        parse(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: s, namespace: ns}}\nspec:\n{spec}"
        ))
    }

    /// Upstream's selection and `--service-proxy-name` partition the Services, and each
    /// takes exactly its Services' slices (the slices carry their Service's labels).
    #[test]
    fn a_selection_takes_its_services_and_their_slices_only() {
        let svc = |name: &str, proxy: Option<&str>| -> Service {
            let labels = proxy.map_or(String::new(), |p| {
                format!(", labels: {{service.kubernetes.io/service-proxy-name: {p}}}")
            });
            parse(&format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns{labels}}}\nspec: {{clusterIP: 10.0.0.{}, ports: [{{port: 80}}]}}\n",
                name.len()
            ))
        };
        let slice = |name: &str, proxy: Option<&str>| -> EndpointSlice {
            let label = proxy.map_or(String::new(), |p| {
                format!(", service.kubernetes.io/service-proxy-name: {p}")
            });
            parse(&format!(
                "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: ns, labels: {{kubernetes.io/service-name: {name}{label}}}}}\naddressType: IPv4\nports: [{{port: 8080}}]\nendpoints: [{{addresses: [10.1.0.{}]}}]\n",
                name.len()
            ))
        };
        let snap = Snapshot {
            services: vec![
                svc("a", None),
                svc("bb", Some("ours")),
                svc("ccc", Some("theirs")),
            ],
            endpoint_slices: vec![
                slice("a", None),
                slice("bb", Some("ours")),
                slice("ccc", Some("theirs")),
            ],
            ..Default::default()
        };
        let served = |sel: &ServiceSelection| {
            let (st, w) = build_state(&snap, "n1", sel);
            assert!(w.is_empty(), "{w:?}");
            let names: Vec<String> = st.services.keys().map(|k| k.name.to_string()).collect();
            let with_endpoints: Vec<String> = st
                .endpoints
                .iter()
                .filter(|(_, eps)| !eps.is_empty())
                .map(|(k, _)| k.name.to_string())
                .collect();
            (names, with_endpoints)
        };
        let upstreams = served(&ServiceSelection::default());
        assert_eq!(upstreams, (vec!["a".to_string()], vec!["a".to_string()]));
        let ours = served(&ServiceSelection::from_flag("ours").unwrap());
        assert_eq!(ours, (vec!["bb".to_string()], vec!["bb".to_string()]));
    }

    #[test]
    fn trigger_times_reach_every_port_of_their_service_only() {
        let svc = |name: &str, ports: &str| -> Service {
            parse(&format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\nspec: {{clusterIP: 10.0.0.1, ports: [{ports}]}}\n"
            ))
        };
        let slice = |svc: &str, t: &str| -> EndpointSlice {
            parse(&format!(
                "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {svc}-1, namespace: ns, labels: {{kubernetes.io/service-name: {svc}}}, annotations: {{endpoints.kubernetes.io/last-change-trigger-time: '{t}'}}}}\naddressType: IPv4\nendpoints: []\n"
            ))
        };
        let snap = Snapshot {
            services: vec![
                svc(
                    "a",
                    "{name: x, port: 80}, {name: y, port: 81, protocol: UDP}",
                ),
                // Sorts between a's ports and after them: must not be picked up.
                svc("a-b", "{name: x, port: 80}"),
                svc("b", "{name: x, port: 80}"),
            ],
            endpoint_slices: vec![
                slice("a", "2026-12-01T17:00:00Z"),
                slice("a", "2026-12-01T17:00:05Z"),
            ],
            ..Default::default()
        };
        let (st, _) = build_state(&snap, "node1", &ServiceSelection::default());
        let mut got: Vec<(String, String)> = st
            .trigger_times
            .keys()
            .map(|k| (k.name.to_string(), k.port.to_string()))
            .collect();
        got.sort();
        assert_eq!(got, [("a".into(), "x".into()), ("a".into(), "y".into())]);
        let latest = parse_rfc3339("2026-12-01T17:00:05Z").unwrap();
        assert!(
            st.trigger_times.values().all(|t| *t == latest),
            "the latest wins"
        );
    }

    #[test]
    fn objects_at_the_limits() {
        // 100 ports, names at their maximum length, colliding port names across protocols.
        let ns = "n".repeat(63);
        let name = "s".repeat(63);
        let mut ports = String::new();
        for i in 0..100 {
            ports += &format!("  - {{name: p{i}, port: {}, protocol: TCP}}\n", 1000 + i);
        }
        ports += "  - {name: p0, port: 53, protocol: UDP}\n";
        let s: Service = parse(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  clusterIP: 10.0.0.1\n  ports:\n{ports}"
        ));
        // One slice with 1,000 endpoints, one of them IPv4-mapped IPv6 in an IPv6 slice.
        let eps: Vec<String> = (0..1000)
            .map(|i| format!("{{addresses: [10.1.{}.{}]}}", i / 250, i % 250))
            .collect();
        let big: EndpointSlice = parse(&format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: a, namespace: {ns}, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: p0, port: 8080}}]\nendpoints: [{}]\n",
            eps.join(", ")
        ));
        let mapped: EndpointSlice = parse(&format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: b, namespace: {ns}, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv6\nports: [{{name: p0, port: 8080}}]\nendpoints: [{{addresses: ['::ffff:10.9.9.9']}}]\n"
        ));
        let snap = Snapshot {
            services: vec![s],
            endpoint_slices: vec![big, mapped],
            node: None,
            ..Default::default()
        };
        let (st, w) = build_state(&snap, "node1", &ServiceSelection::default());
        assert_eq!(
            st.services.len(),
            101,
            "100 TCP ports and one UDP port of the same name"
        );
        let tcp0 = st
            .services
            .keys()
            .find(|k| k.port == "p0" && k.protocol == Protocol::Tcp)
            .unwrap();
        assert_eq!(st.endpoints[tcp0].len(), 1000);
        assert!(
            w.iter().any(|m| m.to_string().contains("IPv4-mapped")),
            "{w:?}"
        );
    }

    #[test]
    fn slices_join_services_skip_bad_addresses_and_dedupe() {
        let snap = Snapshot {
            services: vec![svc("  clusterIP: 10.0.0.1\n  ports: [{name: p, port: 80}]\n")],
            endpoint_slices: vec![
                parse(
                    "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: a, namespace: ns, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{name: p, port: 8080}]\nendpoints:\n- {addresses: [10.1.0.1], nodeName: n1}\n- {addresses: ['fd00::9']}\n- {addresses: [10.1.0.2], conditions: {ready: false, serving: true, terminating: true}}\n",
                ),
                parse(
                    "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: b, namespace: ns, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{name: p, port: 8080}]\nendpoints:\n- {addresses: [10.1.0.1], nodeName: n1}\n",
                ),
            ],
            node: None,
            ..Default::default()
        };
        let (st, w) = build_state(&snap, "n1", &ServiceSelection::default());
        let eps = st.endpoints.values().next().unwrap();
        assert_eq!(eps.len(), 2, "{eps:?}");
        assert!(eps[0].is_local && eps[0].ready);
        assert!(!eps[1].ready && eps[1].serving && eps[1].terminating);
        assert_eq!(w.len(), 1);
        assert!(
            w[0].to_string().contains("does not match addressType"),
            "{w:?}"
        );
    }

    #[test]
    fn states_assembled_from_the_same_conversions_share_them() {
        let mut w = Vec::new();
        let ports: Vec<Arc<ServicePort>> = [svc(
            "  clusterIP: 10.0.0.1\n  ports: [{name: p, port: 80}, {name: q, port: 81}]\n",
        )]
        .iter()
        .flat_map(|s| convert_service(s, &ServiceSelection::default(), &mut w))
        .map(Arc::new)
        .collect();
        let mut slice = |name: &str, eps: &str| -> SliceEndpoints {
            let o: EndpointSlice = parse(&format!(
                "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: ns, labels: {{kubernetes.io/service-name: s}}}}\naddressType: IPv4\nports: [{{name: p, port: 8080}}, {{name: q, port: 8081}}]\nendpoints: [{eps}]\n"
            ));
            convert_slice(&o, "n1", &ServiceSelection::default(), &mut w)
        };
        // One slice, its endpoints out of order and one listed twice (not ready, then ready).
        let one = [slice(
            "a",
            "{addresses: [10.1.0.2]}, {addresses: [10.1.0.1], conditions: {ready: false}}, {addresses: [10.1.0.1]}",
        )];
        let assemble_one = || assemble(NodeInfo::default(), ports.iter(), one.iter(), vec![]);
        let (x, y) = (assemble_one(), assemble_one());
        assert_eq!(x.services.len(), 2);
        for (k, sp) in &x.services {
            assert!(Arc::ptr_eq(sp, &y.services[k]), "{k}: the same allocation");
            assert!(Arc::ptr_eq(&x.endpoints[k], &y.endpoints[k]), "{k}");
        }
        // The slice's own list, merged on arrival: sorted, one copy, the ready one.
        let p = x.endpoints.keys().next().unwrap();
        let got: Vec<(String, bool)> = x.endpoints[p]
            .iter()
            .map(|e| (e.ip.to_string(), e.ready))
            .collect();
        assert_eq!(got, [("10.1.0.1".into(), true), ("10.1.0.2".into(), true)]);
        assert!(Arc::ptr_eq(&x.endpoints[p], &one[0].ports[0].1));
        // Two slices of one service port are merged anew, with the same rule.
        let two = [
            slice("a", "{addresses: [10.1.0.2]}, {addresses: [10.1.0.1]}"),
            slice(
                "b",
                "{addresses: [10.1.0.1], conditions: {ready: false}}, {addresses: [10.1.0.3]}",
            ),
        ];
        let z = assemble(NodeInfo::default(), ports.iter(), two.iter(), vec![]);
        let got: Vec<(String, bool)> = z.endpoints[p]
            .iter()
            .map(|e| (e.ip.to_string(), e.ready))
            .collect();
        assert_eq!(
            got,
            [
                ("10.1.0.1".into(), true),
                ("10.1.0.2".into(), true),
                ("10.1.0.3".into(), true)
            ],
            "the ready copy wins though the not-ready one came later"
        );
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn duplicate_names_and_shared_addresses_are_named_in_warnings() {
        let a = svc("  clusterIP: 10.0.0.1\n  externalIPs: [1.2.3.4]\n  type: NodePort\n  ports: [{name: p, port: 80, nodePort: 30080}]\n");
        let mut b = svc("  clusterIP: 10.0.0.2\n  externalIPs: [1.2.3.4, 1.2.3.4]\n  type: NodePort\n  ports: [{name: p, port: 80, nodePort: 30080}]\n");
        b.metadata.name = Some("other".into());
        let again = a.clone();
        let snap = Snapshot {
            services: vec![a, b, again],
            ..Default::default()
        };
        let (_, w) = build_state(&snap, "n", &ServiceSelection::default());
        let text = w
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        assert!(text.contains("defined more than once"), "{text}");
        assert!(
            text.contains("both claim 1.2.3.4:80/tcp")
                && text.contains("both claim NodePort 30080/tcp"),
            "{text}"
        );
        assert_eq!(
            w.iter()
                .filter(|l| l.to_string().contains("1.2.3.4"))
                .count(),
            1,
            "{text}"
        );
    }

    #[test]
    fn the_older_service_is_named_as_the_owner() {
        let mut a = svc(
            "  clusterIP: 10.0.0.1\n  externalIPs: [1.2.3.4]\n  ports: [{name: p, port: 80}]\n",
        );
        let mut b = svc(
            "  clusterIP: 10.0.0.2\n  externalIPs: [1.2.3.4]\n  ports: [{name: p, port: 80}]\n",
        );
        b.metadata.name = Some("b-older".into());
        a.metadata.name = Some("a-newer".into());
        a.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-02T00:00:00Z".parse().unwrap(),
        ));
        b.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().unwrap(),
        ));
        let snap = Snapshot {
            services: vec![a, b],
            ..Default::default()
        };
        let (state, _) = build_state(&snap, "n", &ServiceSelection::default());
        let c = crate::model::collisions::collisions_of(&state);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].owner.name, "b-older");
        assert_eq!(c[0].other.name, "a-newer");
        let text = c[0].to_string();
        assert!(
            text.contains(&format!("; {} gets that traffic", c[0].owner)),
            "{text}"
        );
    }
}
