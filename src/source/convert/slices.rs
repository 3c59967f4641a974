//! Converts one EndpointSlice into the endpoints of each of its ports, and merges the lists
//! of one service port. Pure. A bad port or address is named in a warning on the slice and
//! skipped.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::{Endpoint as EndpointSpec, EndpointSlice};

use super::{obj_name, parse_ip, ObjectWarnings, ServiceSelection, LABEL_SERVICE_NAME};
use crate::model::intern::{self, ArcStr};
use crate::model::warning::ObjectWarning;
use crate::model::{Endpoint, Protocol, ServicePortName};

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
    selection: &ServiceSelection,
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
    if !selection.selects_slice(labels) {
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
pub fn merge_endpoints<'a>(eps: impl Iterator<Item = &'a Endpoint>) -> Vec<Endpoint> {
    let mut list: Vec<&Endpoint> = eps.collect();
    // Reversed, then a stable sort puts the later copy first.
    list.reverse();
    list.sort_by_key(|e| (e.ip, e.port, !e.ready));
    list.dedup_by(|later, first| (later.ip, later.port) == (first.ip, first.port));
    list.into_iter().cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::convert::tests::parse;

    /// The API source keeps a slice's conversion as long as the slice exists: its list of
    /// ports holds no spare room.
    #[test]
    fn a_converted_slice_has_no_spare_room() {
        let o: EndpointSlice = parse(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: a, namespace: ns, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nports: [{name: p, port: 8080}]\nendpoints: [{addresses: [10.1.0.1]}]\n",
        );
        let c = convert_slice(&o, "n1", &ServiceSelection::default(), &mut Vec::new());
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
        let c = convert_slice(&o, "n1", &ServiceSelection::default(), &mut warnings);
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
        let a = convert_slice(
            &slice("a"),
            "n1",
            &ServiceSelection::default(),
            &mut Vec::new(),
        );
        let b = convert_slice(
            &slice("b"),
            "n1",
            &ServiceSelection::default(),
            &mut Vec::new(),
        );
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
        let c = convert_slice(&o, "n1", &ServiceSelection::default(), &mut Vec::new());
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
