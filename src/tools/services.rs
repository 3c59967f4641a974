//! `kube-nlproxy services`: every Service port this node programs, its frontends (ClusterIP,
//! NodePort, external and LoadBalancer IPs) and where a new connection to each goes, read
//! from the live kernel as `ipvsadm -Ln` or `cilium-dbg service list` show theirs. The
//! frontends come from our table's dispatch maps, whose element comments name the Service
//! port; for each, [`explain::trace`] follows a new connection through the live tables: from
//! this host for a ClusterIP (internal traffic), from a client outside the cluster for a
//! NodePort, external or LoadBalancer IP (external traffic). In IPVS mode it adds the virtual
//! servers with their real servers as the kernel lists them. Finding the frontends in a
//! table is pure ([`frontends`]); [`services`] reads the kernel through [`KernelView`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::args::{self, Flag};
use super::explain::{self, external_client, KernelView, Verdict, VirtualServerReport};
use super::{Printed, ToolError};
use crate::kernel::nft::eval::{Host, Packet};
use crate::kernel::nft::live::{typed_key, LiveTable};
use crate::kernel::nft::{proto, Family, Field, KeyValue, Set};
use crate::modes::ipvs::table::{
    DEFAULT_TABLE as IPVS_TABLE, EXTERNAL_IPS as IPVS_EXTERNAL_IPS, NODEPORTS as IPVS_NODEPORTS,
};
use crate::proxy::names::{
    BALANCE_PREFIX, CLUSTER_IPS, DEFAULT_TABLE, NO_ENDPOINT_NODEPORTS, NO_ENDPOINT_SERVICES,
    ONE_ENDPOINT_SERVICES, SERVICE_IPS, SERVICE_NODEPORTS,
};

pub const USAGE: &str = "[--json] [--table NAME] [--metrics-address ADDRESS:PORT]

Every Service port this node programs, with its frontends (ClusterIP, NodePort, external and
LoadBalancer IPs) and the endpoints a new connection to each reaches from the live kernel,
with their probability: from this host for a ClusterIP (internal traffic policy), from a
client outside the cluster (203.0.113.10, 2001:db8::10) for the others (external traffic
policy). IPVS mode adds each virtual server and its real servers. Read-only, over netlink.

Example, in the DaemonSet's pod:
  kubectl -n kube-system exec ds/kube-nlproxy -- /usr/local/bin/kube-proxy services

Exit status: 0 listed (whatever the frontends do), 2 trouble.";

pub const FLAGS: &[Flag] = &[
    Flag {
        name: "table",
        value: true,
        help: "our nftables table (default kube-nlproxy, or kube-nlproxy-ipvs in IPVS mode)",
    },
    Flag {
        name: "metrics-address",
        value: true,
        help:
            "the daemon's metrics server, for userspace mode's listeners (default 127.0.0.1:10249)",
    },
    Flag {
        name: "json",
        value: false,
        help: "print JSON",
    },
];

/// What kind of address a frontend is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum FrontendKind {
    ClusterIP,
    NodePort,
    /// An external IP or a LoadBalancer ingress IP (the kernel's maps do not tell them apart).
    #[serde(rename = "ExternalOrLoadBalancerIP")]
    External,
}

/// One frontend of a Service port as our table holds it; `address` is `None` for a NodePort
/// (every NodePort address of the node).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Frontend {
    pub service: String,
    pub kind: FrontendKind,
    pub address: Option<IpAddr>,
    pub protocol: u8,
    pub port: u16,
}

/// Where new connections to one frontend go.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FrontendView {
    pub kind: FrontendKind,
    /// `ADDRESS:PORT`; a NodePort shows the node address it was traced to.
    pub address: String,
    /// `this host` or `outside` (the client traced).
    pub from: &'static str,
    /// Each possible result: `dnat` to an endpoint with its probability, `reject`, `drop`,
    /// `redirect` (userspace mode), or `accept` (IPVS mode, then see `ipvs`).
    pub outcomes: Vec<Destination>,
}

#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Destination {
    pub verdict: Verdict,
    pub endpoint: Option<String>,
    pub probability: f64,
}

/// One Service port and its frontends.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceView {
    /// `namespace/name:port`.
    pub service: String,
    pub protocol: String,
    pub frontends: Vec<FrontendView>,
}

/// The whole listing.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Listing {
    pub services: Vec<ServiceView>,
    /// IPVS mode's virtual servers (empty in the other modes).
    pub ipvs: Vec<VirtualServerReport>,
    pub notes: Vec<String>,
}

/// The maps whose elements are frontends keyed `daddr . l4proto . dport[ . …]`.
fn addressed_maps(t: &LiveTable) -> Vec<&str> {
    let mut out = vec![
        SERVICE_IPS,
        NO_ENDPOINT_SERVICES,
        ONE_ENDPOINT_SERVICES,
        CLUSTER_IPS,
        IPVS_EXTERNAL_IPS,
    ];
    out.extend(
        t.sets
            .keys()
            .map(String::as_str)
            .filter(|n| n.starts_with(BALANCE_PREFIX) && n.ends_with("-services")),
    );
    out
}

/// Every frontend in our table `t`, from the dispatch maps' elements (their comments name
/// the Service port; an element without one is not ours to list). Addresses in the
/// `cluster-ips` set are ClusterIPs; the others external or LoadBalancer IPs. IPVS mode's
/// companion table names its frontends in `cluster-ips`, `external-ips` and `nodeports`
/// (virtual servers carry no names), keyed as the dispatch maps are.
pub fn frontends(t: &LiveTable) -> BTreeSet<Frontend> {
    let family = t.family;
    let addressed = Set::vmap(
        "frontends",
        vec![Field::Daddr, Field::L4Proto, Field::Dport],
    );
    let ports = Set::vmap("frontends", vec![Field::L4Proto, Field::Dport]);
    // Multi-field keys take whole 4-byte registers: address, protocol, port.
    let addressed_len = Field::Daddr.reg_len(family) + 8;
    let cluster_ips: BTreeSet<IpAddr> = t
        .sets
        .get(CLUSTER_IPS)
        .map(|s| {
            s.elements
                .keys()
                // (The address alone in nftables mode; address . protocol . port in IPVS
                // mode's companion table.)
                .filter_map(|k| match family {
                    Family::Ip => <[u8; 4]>::try_from(k.get(..4)?).ok().map(IpAddr::from),
                    Family::Ip6 => <[u8; 16]>::try_from(k.get(..16)?).ok().map(IpAddr::from),
                })
                .collect()
        })
        .unwrap_or_default();
    let mut out = BTreeSet::new();
    for name in addressed_maps(t) {
        let Some(set) = t.sets.get(name) else {
            continue;
        };
        for (key, comment) in &set.comments {
            let Some(prefix) = key.get(..addressed_len) else {
                continue;
            };
            let Some(k) = typed_key(&addressed, family, prefix) else {
                continue;
            };
            if let [KeyValue::Addr(a), KeyValue::Proto(p), KeyValue::Port(port)] = k.to_vec()[..] {
                out.insert(Frontend {
                    service: comment.clone(),
                    kind: if cluster_ips.contains(&a) {
                        FrontendKind::ClusterIP
                    } else {
                        FrontendKind::External
                    },
                    address: Some(a),
                    protocol: p,
                    port,
                });
            }
        }
    }
    for name in [SERVICE_NODEPORTS, NO_ENDPOINT_NODEPORTS, IPVS_NODEPORTS] {
        let Some(set) = t.sets.get(name) else {
            continue;
        };
        for (key, comment) in &set.comments {
            let Some(k) = typed_key(&ports, family, key) else {
                continue;
            };
            if let [KeyValue::Proto(p), KeyValue::Port(port)] = k.to_vec()[..] {
                out.insert(Frontend {
                    service: comment.clone(),
                    kind: FrontendKind::NodePort,
                    address: None,
                    protocol: p,
                    port,
                });
            }
        }
    }
    out
}

/// Lists every Service port of our table `table` in both families, traced through the
/// live kernel.
pub fn services(
    kv: &mut dyn KernelView,
    table: &str,
    metrics: std::net::SocketAddr,
) -> Result<Listing, ToolError> {
    let locals = kv.local_addrs()?;
    let mut by_service: BTreeMap<ServicePort, Vec<FrontendView>> = BTreeMap::new();
    let mut notes = Vec::new();
    for family in Family::all() {
        let traced = FamilyTrace {
            table,
            family,
            locals: &locals,
            metrics,
        };
        for (key, view) in traced.run(kv, &mut notes)? {
            by_service.entry(key).or_default().push(view);
        }
    }
    let services = by_service
        .into_iter()
        .map(|((service, p), mut frontends)| {
            frontends.sort_by(|a, b| (a.kind, &a.address).cmp(&(b.kind, &b.address)));
            ServiceView {
                service,
                protocol: proto::name(p).to_uppercase(),
                frontends,
            }
        })
        .collect();
    let ipvs = kv
        .ipvs_all()?
        .iter()
        .map(|(vs, rs)| explain::virtual_server(vs, rs))
        .collect();
    Ok(Listing {
        services,
        ipvs,
        notes,
    })
}

/// A Service port as the dispatch maps' comments name it, and its protocol number.
type ServicePort = (String, u8);

/// The frontends of one family's table, each traced with a new connection.
struct FamilyTrace<'a> {
    table: &'a str,
    family: Family,
    locals: &'a [IpAddr],
    metrics: std::net::SocketAddr,
}

/// Where a probe to one frontend comes from.
struct ProbeSource {
    saddr: IpAddr,
    iif: Option<String>,
    from: &'static str,
}

impl FamilyTrace<'_> {
    /// Each frontend found, keyed by its Service port, with where it leads.
    fn run(
        &self,
        kv: &mut dyn KernelView,
        notes: &mut Vec<String>,
    ) -> Result<Vec<(ServicePort, FrontendView)>, ToolError> {
        let loaded = explain::load_tables(kv, self.family, self.table)?;
        let Some((main, _)) = loaded.iter().find(|(t, _)| t.name == self.table) else {
            return Ok(Vec::new());
        };
        let found = frontends(main);
        if found.is_empty() {
            return Ok(Vec::new());
        }
        // The outside client arrives on the interface of the route to it, and reaches a
        // NodePort at the address this host answers it from (with no route to outside: an
        // interface no rule names, and the first global address).
        let outside = external_client(self.family);
        let to_outside = kv.route(outside)?;
        let outside_iif = to_outside
            .as_ref()
            .map_or(explain::UNKNOWN_IIF.to_string(), |(i, _)| i.clone());
        let node = to_outside
            .and_then(|(_, src)| src)
            .or_else(|| explain::first_global(self.locals, self.family));
        let host = Host {
            local_addrs: self.locals.to_vec(),
        };
        let mut out = Vec::new();
        for f in found {
            let Some(daddr) = self.probe_destination(&f, node, notes) else {
                continue;
            };
            let source = if f.kind == FrontendKind::ClusterIP {
                // From this host: the source its route to the ClusterIP picks.
                let routed = kv.route(daddr)?.and_then(|(_, src)| src);
                let Some(saddr) = routed.or(node) else {
                    continue;
                };
                ProbeSource {
                    saddr,
                    iif: None,
                    from: "this host",
                }
            } else {
                ProbeSource {
                    saddr: outside,
                    iif: Some(outside_iif.clone()),
                    from: "outside",
                }
            };
            let pkt = Packet {
                saddr: source.saddr,
                daddr,
                proto: f.protocol,
                sport: 40000,
                dport: f.port,
                iif: source.iif,
                mark: 0,
            };
            let mut trace_notes = Vec::new();
            let (tables, ipvs) =
                explain::trace(kv, &loaded, &host, &pkt, self.metrics, &mut trace_notes)?;
            notes.extend(trace_notes);
            let view = FrontendView {
                kind: f.kind,
                address: explain::sock(daddr, f.port),
                from: source.from,
                outcomes: destinations(self.table, &tables, ipvs),
            };
            out.push(((f.service, f.protocol), view));
        }
        Ok(out)
    }

    /// The address a probe of `f` is sent to: a NodePort's at the node's address, the
    /// others at their own; none (with a note for a NodePort) when there is no such address.
    fn probe_destination(
        &self,
        f: &Frontend,
        node: Option<IpAddr>,
        notes: &mut Vec<String>,
    ) -> Option<IpAddr> {
        if f.kind != FrontendKind::NodePort {
            return f.address;
        }
        if node.is_none() {
            notes.push(format!(
                "{} NodePort {}: this host has no {} address to trace it to",
                f.service,
                f.port,
                self.family.name()
            ));
        }
        node
    }
}

/// Where a traced connection went: our table's outcomes, or the IPVS virtual server's real
/// servers when the connection reached one.
fn destinations(
    table: &str,
    tables: &[explain::TableReport],
    ipvs: Option<VirtualServerReport>,
) -> Vec<Destination> {
    if let Some(vs) = ipvs {
        return vs
            .real_servers
            .iter()
            .map(|r| Destination {
                verdict: Verdict::Ipvs,
                endpoint: Some(r.address.clone()),
                probability: r.share,
            })
            .collect();
    }
    tables
        .iter()
        .filter(|t| t.table == table)
        .flat_map(|t| &t.outcomes)
        .map(|o| Destination {
            verdict: o.verdict,
            endpoint: o
                .listener
                .as_ref()
                .map(|l| format!("listener :{}", l.port))
                .or_else(|| o.destination.clone()),
            probability: o.probability,
        })
        .collect()
}

/// The text form: one block per Service port, a line per frontend.
pub fn render_text(l: &Listing) -> String {
    let mut s = String::new();
    for v in &l.services {
        s += &format!("{} {}\n", v.service, v.protocol);
        for f in &v.frontends {
            let kind = match f.kind {
                FrontendKind::ClusterIP => "ClusterIP",
                FrontendKind::NodePort => "NodePort",
                FrontendKind::External => "external/LB",
            };
            let to: Vec<String> = f
                .outcomes
                .iter()
                .map(|o| match &o.endpoint {
                    Some(e) => format!("{e} ({:.0}%)", o.probability * 100.0),
                    None => match o.verdict {
                        Verdict::Reject => "rejected".into(),
                        Verdict::Drop => "dropped".into(),
                        Verdict::Accept => "accepted (no DNAT here)".into(),
                        v => v.as_str().to_string(),
                    },
                })
                .collect();
            s += &format!(
                "  {kind:<11} {:<28} from {:<9} -> {}\n",
                f.address,
                f.from,
                if to.is_empty() {
                    "(nothing of ours)".to_string()
                } else {
                    to.join(", ")
                }
            );
        }
    }
    for vs in &l.ipvs {
        s += &format!(
            "IPVS {} {}{}\n",
            vs.service,
            vs.scheduler,
            if vs.persistence > 0 {
                format!(" persistent {}", vs.persistence)
            } else {
                String::new()
            }
        );
        for r in &vs.real_servers {
            s += &format!(
                "  -> {:<28} weight {} active {} inactive {}\n",
                r.address, r.weight, r.active_conns, r.inactive_conns
            );
        }
    }
    if l.services.is_empty() && l.ipvs.is_empty() {
        s += "no Service programmed here (no table of ours, or an empty one)\n";
    }
    for n in &l.notes {
        s += &format!("note: {n}\n");
    }
    s
}

/// The `services` command.
pub fn run(args: &[String]) -> Result<Printed, ToolError> {
    let a = args::parse("services", USAGE, FLAGS, args)?;
    let metrics = a.get("metrics-address").unwrap_or("127.0.0.1:10249");
    let metrics: std::net::SocketAddr = metrics.parse().map_err(|_| ToolError::Usage {
        tool: "services",
        msg: format!("--metrics-address: want ADDRESS:PORT, got {metrics:?}"),
    })?;
    let mut kv = explain::LiveKernel::new();
    let listing = match a.get("table") {
        Some(table) => services(&mut kv, table, metrics)?,
        // The nftables and userspace modes' table, else IPVS mode's companion.
        None => {
            let l = services(&mut kv, DEFAULT_TABLE, metrics)?;
            if l.services.is_empty() {
                services(&mut kv, IPVS_TABLE, metrics)?
            } else {
                l
            }
        }
    };
    let text = if a.has("json") {
        super::to_json("ServiceList", &listing)
    } else {
        render_text(&listing)
    };
    Ok(Printed::plain(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::explain::fake::FakeView;

    fn listing() -> Listing {
        services(
            &mut FakeView::default(),
            DEFAULT_TABLE,
            "127.0.0.1:10249".parse().unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn frontends_come_from_the_dispatch_maps_with_their_kind() {
        let st = crate::model::fixtures::web_state(Some(30080));
        let t = crate::modes::nftables::plan::build_ruleset(
            &st,
            &crate::proxy::ProxierConfig::default(),
            Family::Ip,
        )
        .as_live();
        let got: Vec<(FrontendKind, Option<IpAddr>, u16)> = frontends(&t)
            .into_iter()
            .map(|f| {
                assert_eq!(f.service, "default/web:http");
                assert_eq!(f.protocol, 6);
                (f.kind, f.address, f.port)
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    FrontendKind::ClusterIP,
                    Some("10.96.0.10".parse().unwrap()),
                    80
                ),
                (FrontendKind::NodePort, None, 30080),
            ]
        );
    }

    #[test]
    fn each_frontend_shows_the_endpoints_a_new_connection_reaches() {
        let l = listing();
        assert_eq!(l.services.len(), 1, "{l:?}");
        let web = &l.services[0];
        assert_eq!(
            (web.service.as_str(), web.protocol.as_str()),
            ("default/web:http", "TCP")
        );
        let kinds: Vec<_> = web.frontends.iter().map(|f| (f.kind, f.from)).collect();
        assert_eq!(
            kinds,
            [
                (FrontendKind::ClusterIP, "this host"),
                (FrontendKind::NodePort, "outside")
            ]
        );
        for f in &web.frontends {
            let eps: Vec<_> = f
                .outcomes
                .iter()
                .map(|o| {
                    (
                        o.verdict,
                        o.endpoint.as_deref().unwrap_or(""),
                        o.probability,
                    )
                })
                .collect();
            assert_eq!(
                eps,
                [
                    (Verdict::Dnat, "10.244.1.2:8080", 0.5),
                    (Verdict::Dnat, "10.244.2.2:8080", 0.5)
                ],
                "{f:?}"
            );
        }
        assert_eq!(web.frontends[1].address, "192.168.0.2:30080");
        super::super::golden("services-web.txt", &render_text(&l));
    }

    #[test]
    fn the_json_form_is_pinned() {
        let v = serde_json::to_value(listing()).unwrap();
        let f = &v["services"][0]["frontends"][0];
        assert_eq!(f["kind"], "ClusterIP");
        assert_eq!(f["address"], "10.96.0.10:80");
        assert_eq!(f["from"], "this host");
        assert_eq!(f["outcomes"][0]["verdict"], "dnat");
        assert_eq!(f["outcomes"][0]["endpoint"], "10.244.1.2:8080");
        assert_eq!(f["outcomes"][0]["probability"], 0.5);
        assert_eq!(v["services"][0]["service"], "default/web:http");
        assert_eq!(v["ipvs"], serde_json::json!([]));
        let mut keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, ["ipvs", "notes", "services"]);
    }
}
