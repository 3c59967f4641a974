//! Converts Kubernetes objects (k8s-openapi types) into the model. Pure. Bad values are
//! reported as warnings naming the object and skipped: one broken Service never stops the
//! others from being programmed. Services are converted in `service.rs`.

mod service;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::{Endpoint as EndpointSpec, EndpointSlice};
use k8s_openapi::api::networking::v1::ServiceCIDR;

pub use self::service::convert_service;
use super::{Endpoint, NodeInfo, Protocol, ProxyState, ServicePort, ServicePortName};
use crate::model::intern::{self, ArcStr};
use crate::model::net::Cidr;
use crate::model::warning::ObjectWarning;

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

/// Annotation the EndpointSlice controller sets to the time of the change that triggered it.
pub const ANNOTATION_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// Parses an RFC 3339 UTC timestamp (`2024-01-02T03:04:05Z`, fraction and offset allowed).
pub fn parse_rfc3339(s: &str) -> Option<std::time::SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !(b[10] == b'T' || b[10] == b't') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &s[19..];
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(frac.len());
        let digits = &frac[..n.min(9)];
        nanos = format!("{digits:0<9}").parse().ok()?;
        rest = &frac[n..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        o if o.len() == 6 => {
            let sign = if o.starts_with('-') { -1 } else { 1 };
            sign * (o[1..3].parse::<i64>().ok()? * 3600 + o[4..6].parse::<i64>().ok()? * 60)
        }
        _ => return None,
    };
    // Days from civil (Howard Hinnant).
    let (y2, m2) = if mo <= 2 {
        (y - 1, mo + 9)
    } else {
        (y, mo - 3)
    };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * m2 + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    let secs = days * 86400 + h * 3600 + mi * 60 + se - offset;
    let secs = u64::try_from(secs).ok()?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos))
}

/// One EndpointSlice converted to what the state needs of it. The API source keeps this per
/// slice instead of the object, so a change converts one slice, not every slice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SliceEndpoints {
    /// The slice's namespace and `kubernetes.io/service-name` label, when it has one (the
    /// trigger time applies to that Service even when the slice itself is skipped).
    pub service: Option<(ArcStr, ArcStr)>,
    /// `endpoints.kubernetes.io/last-change-trigger-time`.
    pub trigger_time: Option<std::time::SystemTime>,
    /// The endpoints of each of the slice's ports, in [`merge_endpoints`]' order (by
    /// address and port, one copy of each). A service port with one slice (the usual
    /// case) gets this very list in every state assembled while the slice is unchanged.
    pub ports: Vec<(ServicePortName, Arc<Vec<Endpoint>>)>,
}

/// Converts one slice.
pub fn convert_slice(
    slice: &EndpointSlice,
    node_name: &str,
    warnings: &mut Vec<ObjectWarning>,
) -> SliceEndpoints {
    let meta = &slice.metadata;
    let mut warn = ObjectWarnings::new(
        "EndpointSlice",
        obj_name(&meta.namespace, &meta.name),
        warnings,
    );
    let ns = meta.namespace.as_deref().unwrap_or("default");
    let labels = meta.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k));
    // The namespace and Service name, shared with every port's name below.
    let ns_shared = intern::shared(ns);
    let mut out = SliceEndpoints {
        service: label(LABEL_SERVICE_NAME).map(|s| (ns_shared.clone(), s.as_str().into())),
        trigger_time: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_TRIGGER_TIME))
            .and_then(|v| parse_rfc3339(v)),
        ports: Vec::new(),
    };
    if label(LABEL_SERVICE_PROXY_NAME).is_some() || label(LABEL_HEADLESS).is_some() {
        return out;
    }
    let Some(svc_shared) = out.service.as_ref().map(|(_, s)| s.clone()) else {
        warn.push(format!("no {LABEL_SERVICE_NAME} label; skipped"));
        return out;
    };
    let want_v4 = match slice.address_type.as_str() {
        "IPv4" => true,
        "IPv6" => false,
        "FQDN" => return out,
        other => {
            warn.push(format!("unknown addressType {other:?}; skipped"));
            return out;
        }
    };
    for port in slice.ports.iter().flatten() {
        let Some(num) = port.port else { continue };
        if !(1..=65535).contains(&num) {
            warn.push(format!("port {num} out of range; port skipped"));
            continue;
        }
        let proto_s = port.protocol.as_deref().unwrap_or("TCP");
        let Some(protocol) = Protocol::parse(proto_s) else {
            warn.push(format!("unknown protocol {proto_s:?}; port skipped"));
            continue;
        };
        let spn = ServicePortName {
            namespace: ns_shared.clone(),
            name: svc_shared.clone(),
            port: intern::shared(port.name.as_deref().unwrap_or_default()),
            protocol,
        };
        // Optional in the current API types: a slice without endpoints may omit it.
        let endpoints = slice.endpoints.as_deref().unwrap_or_default();
        let mut eps = Vec::with_capacity(endpoints.len());
        for ep in endpoints {
            let Some(ip) = endpoint_ip_of(ep, want_v4, &slice.address_type, &mut warn) else {
                continue;
            };
            eps.push(endpoint_of(ep, ip, num as u16, node_name));
        }
        out.ports.push((spn, Arc::new(merge_endpoints(eps.iter()))));
    }
    // The API source keeps this as long as the slice exists: one port in a list grown to
    // four was ~2.4 MiB at 10k slices (heaptrack of the daemon, issue #18).
    out.ports.shrink_to_fit();
    out
}

/// The address an endpoint is reached at: its first (upstream uses only that one). `None`
/// when it has none, or (with a warning) when it does not parse, is IPv4-mapped IPv6 or is
/// not of the slice's `addressType`.
fn endpoint_ip_of(
    ep: &EndpointSpec,
    want_v4: bool,
    address_type: &str,
    warn: &mut ObjectWarnings,
) -> Option<IpAddr> {
    let addr = ep.addresses.first()?;
    match parse_ip(addr) {
        // An IPv4-mapped IPv6 address is no pod address; DNAT to it would misroute.
        Some(IpAddr::V6(v6)) if v6.to_ipv4_mapped().is_some() => {
            warn.push(format!(
                "IPv4-mapped address {v6} is not a valid endpoint; skipped"
            ));
            None
        }
        Some(ip) if ip.is_ipv4() == want_v4 => Some(ip),
        Some(ip) => {
            warn.push(format!(
                "address {ip} does not match addressType {address_type}; skipped"
            ));
            None
        }
        None => {
            warn.push(format!("invalid address {addr:?}; skipped"));
            None
        }
    }
}

/// The endpoint at `ip` and `port`, with the slice endpoint's conditions (missing ones as
/// upstream reads them: ready, serving when ready, not terminating), whether it runs on
/// this node, and its topology hints.
fn endpoint_of(ep: &EndpointSpec, ip: IpAddr, port: u16, node_name: &str) -> Endpoint {
    let cond = ep.conditions.as_ref();
    let ready = cond.and_then(|c| c.ready).unwrap_or(true);
    let hints = ep.hints.as_ref();
    let mut e = Endpoint {
        ip,
        port,
        is_local: ep.node_name.as_deref() == Some(node_name),
        ready,
        serving: cond.and_then(|c| c.serving).unwrap_or(ready),
        terminating: cond.and_then(|c| c.terminating).unwrap_or(false),
        hints: None,
    };
    e.set_hints(
        hints
            .and_then(|h| h.for_zones.as_ref())
            .map(|z| z.iter().map(|z| z.name.clone()).collect())
            .unwrap_or_default(),
        hints
            .and_then(|h| h.for_nodes.as_ref())
            .map(|n| n.iter().map(|n| n.name.clone()).collect())
            .unwrap_or_default(),
    );
    e
}

/// One service port's endpoints from the lists that carry them, in order: sorted by address
/// and port, and of the copies of one address and port (two slices list an endpoint while
/// it is being moved between them) the last ready one, else the last. Merging lists that
/// were merged this way gives what merging their originals gives.
fn merge_endpoints<'a>(eps: impl Iterator<Item = &'a Endpoint>) -> Vec<Endpoint> {
    let mut list: Vec<&Endpoint> = eps.collect();
    // Reversed, then a stable sort puts the later copy first.
    list.reverse();
    list.sort_by_key(|e| (e.ip, e.port, !e.ready));
    list.dedup_by(|later, first| (later.ip, later.port) == (first.ip, first.port));
    list.into_iter().cloned().collect()
}

/// Builds the whole model from a snapshot. Returns the state and the warnings to log.
pub fn build_state(snap: &Snapshot, node_name: &str) -> (ProxyState, Vec<ObjectWarning>) {
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
            convert_service(svc, &mut warnings)
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
        .map(|s| convert_slice(s, node_name, &mut warnings))
        .collect();
    let state = assemble(node, ports.iter(), slices.iter(), cidrs);
    warnings.extend(collisions(&state));
    (state, warnings)
}

/// Puts converted objects together into the whole model: service ports (a later one of the
/// same name replaces an earlier one), their endpoints from every slice (one copy of an
/// endpoint that two slices list, the ready one when they disagree), trigger times, and the
/// union of the service CIDRs. Collisions between service ports are left to the caller
/// ([`collisions_of`]): the API source assembles a state per change and names only new
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

/// Two service ports claiming one key: the owner (older Service, then namespace/name, the
/// order the rulesets use) gets the traffic.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Collision {
    /// `1.2.3.4:80/tcp` or `NodePort 30080/tcp`.
    pub key: String,
    pub owner: ServicePortName,
    pub other: ServicePortName,
}

impl std::fmt::Display for Collision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Services {} and {} both claim {}; {} gets that traffic (the older Service, then by namespace/name)",
            self.owner, self.other, self.key, self.owner
        )
    }
}

/// Service ports that claim the same address and port, or the same NodePort: the API server
/// does not prevent it for externalIPs and LoadBalancer IPs, and manifests can say anything.
/// One per clash, naming both. Pure.
pub fn collisions_of(state: &ProxyState) -> Vec<Collision> {
    let mut out = Vec::new();
    // The rulesets' order: older first (ports without a creation time last), then name.
    let mut ports: Vec<(&ServicePortName, &ServicePort)> =
        state.services.iter().map(|(n, sp)| (n, &**sp)).collect();
    ports.sort_by_key(|&(n, sp)| (sp.created.is_none(), sp.created, n));
    let mut addrs: BTreeMap<(IpAddr, u8, u16), &ServicePortName> = BTreeMap::new();
    let mut node_ports: BTreeMap<(u8, u16), &ServicePortName> = BTreeMap::new();
    for (spn, sp) in ports {
        let proto = spn.protocol.number();
        let mut mine = std::collections::BTreeSet::new();
        for ip in sp
            .cluster_ips
            .iter()
            .chain(&sp.external_ips)
            .chain(&sp.load_balancer_ips)
        {
            if !mine.insert(*ip) {
                continue; // the same Service naming an address twice is no clash
            }
            match addrs.get(&(*ip, proto, sp.port)) {
                Some(owner) => out.push(Collision {
                    key: format!(
                        "{}/{}",
                        std::net::SocketAddr::new(*ip, sp.port),
                        spn.protocol.lower()
                    ),
                    owner: (*owner).clone(),
                    other: spn.clone(),
                }),
                None => {
                    addrs.insert((*ip, proto, sp.port), spn);
                }
            }
        }
        if let Some(np) = sp.node_port {
            match node_ports.get(&(proto, np)) {
                Some(owner) => out.push(Collision {
                    key: format!("NodePort {np}/{}", spn.protocol.lower()),
                    owner: (*owner).clone(),
                    other: spn.clone(),
                }),
                None => {
                    node_ports.insert((proto, np), spn);
                }
            }
        }
    }
    out
}

/// [`collisions_of`] as warnings on the Service that loses the traffic.
pub fn collisions(state: &ProxyState) -> Vec<ObjectWarning> {
    collisions_of(state)
        .iter()
        .map(Collision::warning)
        .collect()
}

impl Collision {
    /// The warning on the Service that loses the traffic.
    pub fn warning(&self) -> ObjectWarning {
        let object = format!("{}/{}", self.other.namespace, self.other.name);
        ObjectWarning::new("Service", object, self.to_string())
    }
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
        let (st, _) = build_state(&snap, "node1");
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
        let (st, w) = build_state(&snap, "node1");
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
        let (st, w) = build_state(&snap, "n1");
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
        .flat_map(|s| convert_service(s, &mut w))
        .map(Arc::new)
        .collect();
        let mut slice = |name: &str, eps: &str| -> SliceEndpoints {
            let o: EndpointSlice = parse(&format!(
                "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: ns, labels: {{kubernetes.io/service-name: s}}}}\naddressType: IPv4\nports: [{{name: p, port: 8080}}, {{name: q, port: 8081}}]\nendpoints: [{eps}]\n"
            ));
            convert_slice(&o, "n1", &mut w)
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
        let (_, w) = build_state(&snap, "n");
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
        let (state, _) = build_state(&snap, "n");
        let c = collisions_of(&state);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].owner.name, "b-older");
        assert_eq!(c[0].other.name, "a-newer");
        let text = c[0].to_string();
        assert!(
            text.contains(&format!("; {} gets that traffic", c[0].owner)),
            "{text}"
        );
    }

    /// The API source keeps a slice's conversion as long as the slice exists: its list of
    /// ports holds no spare room.
    #[test]
    fn a_converted_slice_has_no_spare_room() {
        let o: EndpointSlice = parse(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: a, namespace: ns, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{name: p, port: 8080}]\nendpoints: [{addresses: [10.1.0.1]}]\n",
        );
        let c = convert_slice(&o, "n1", &mut Vec::new());
        assert_eq!(c.ports.len(), 1);
        assert_eq!(c.ports.capacity(), c.ports.len());
    }

    /// An empty slice as the API server writes it, `endpoints` left out (optional in the
    /// current API types): decoded and converted to a port with no endpoints.
    #[test]
    fn a_slice_without_endpoints_converts_to_none() {
        let o: EndpointSlice = parse(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: a, namespace: ns, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{name: p, port: 8080}]\n",
        );
        assert!(o.endpoints.is_none());
        let mut warnings = Vec::new();
        let c = convert_slice(&o, "n1", &mut warnings);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(c.ports.len(), 1);
        assert!(c.ports[0].1.is_empty(), "{:?}", c.ports[0].1);
    }

    /// Namespaces and port names are held once, and a slice's Service name once for the
    /// slice and its ports (issue #18: 10k Services' slices each held their own copies).
    #[test]
    fn converted_slices_share_their_names() {
        let slice = |name: &str| -> EndpointSlice {
            parse(&format!(
                "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: ns, labels: {{kubernetes.io/service-name: s}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints: [{{addresses: [10.1.0.1]}}]\n"
            ))
        };
        let a = convert_slice(&slice("a"), "n1", &mut Vec::new());
        let b = convert_slice(&slice("b"), "n1", &mut Vec::new());
        let (sa, sb) = (&a.ports[0].0, &b.ports[0].0);
        assert!(ArcStr::ptr_eq(&sa.namespace, &sb.namespace));
        assert!(ArcStr::ptr_eq(&sa.port, &sb.port));
        let (ns, svc) = a.service.as_ref().unwrap();
        assert!(ArcStr::ptr_eq(ns, &sa.namespace) && ArcStr::ptr_eq(svc, &sa.name));
    }

    #[test]
    fn a_slices_topology_hints_reach_its_endpoints() {
        let o: EndpointSlice = parse(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: a, namespace: ns, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{name: p, port: 8080}]\nendpoints:\n- {addresses: [10.1.0.1], hints: {forZones: [{name: z1}], forNodes: [{name: n1}]}}\n- {addresses: [10.1.0.2]}\n",
        );
        let c = convert_slice(&o, "n1", &mut Vec::new());
        let eps = &c.ports[0].1;
        assert_eq!(eps[0].zone_hints(), ["z1"]);
        assert_eq!(eps[0].node_hints(), ["n1"]);
        assert!(eps[1].hints.is_none(), "no hints: nothing kept");
    }

    #[test]
    fn rfc3339_timestamps() {
        let t = parse_rfc3339("2024-02-29T23:59:59Z").unwrap();
        assert_eq!(
            t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs(),
            1_709_251_199
        );
        let f = parse_rfc3339("2024-02-29T23:59:59.5+01:00").unwrap();
        assert_eq!(
            f.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis(),
            1_709_247_599_500
        );
        assert!(parse_rfc3339("yesterday").is_none());
    }
}
