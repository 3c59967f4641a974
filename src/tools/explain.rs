//! `kube-nlproxy explain`: what the live kernel does to one packet. Reads our tables from
//! the kernel (never our own plan), evaluates the packet through every base chain it meets
//! ([`crate::kernel::nft::eval`]), and for IPVS mode adds the virtual server the packet
//! reaches, its scheduler and real servers. [`explain`] and the renderers are pure; [`run`]
//! does the kernel reads.

use std::fmt::Write as _;
use std::net::IpAddr;

use crate::kernel::ipvs::{Ipvs, RealServer, VirtualServer};
use crate::kernel::nft::eval::{self, Delivery, End, Host, Packet, Path};
use crate::kernel::nft::live::LiveTable;
use crate::kernel::nft::Family;
use crate::model::net::proto;

use super::args::{self, Flag};
use super::ToolError;

pub const USAGE: &str = "--to ADDRESS:PORT[/PROTOCOL] [--from ADDRESS|NAMESPACE/POD|node|external] [--iif NAME] [--mark VALUE] [--json] [--exit-zero]

What the live kernel does to one packet: every rule of ours it meets, the endpoints it can
reach with their probability, the source address they see, or where it is dropped or
rejected. Read-only, over netlink.

Example, a pod asking the cluster DNS:
  kubectl -n kube-system exec ds/kube-nlproxy -- /usr/local/bin/kube-proxy explain --from 10.244.1.3 --to 10.96.0.10:53/udp

Exit status: 0 delivered, 1 dropped or rejected (0 with --exit-zero), 2 trouble.";

pub const FLAGS: &[Flag] = &[
    Flag {
        name: "to",
        value: true,
        help: "destination, e.g. 10.96.0.10:53/udp or [fd00::10]:443 (protocol tcp by default)",
    },
    Flag {
        name: "from",
        value: true,
        help: "source address, NAMESPACE/POD (a pod behind a Service, found in the EndpointSlices), `node` (this host sends it) or `external` (a client outside the cluster, 203.0.113.10 / 2001:db8::10); default node",
    },
    Flag {
        name: "iif",
        value: true,
        help: "input interface (default: the interface the kernel routes the source through)",
    },
    Flag {
        name: "mark",
        value: true,
        help: "the packet's mark on arrival (default 0)",
    },
    Flag {
        name: "sport",
        value: true,
        help: "source port (default 40000)",
    },
    Flag {
        name: "table",
        value: true,
        help: "our nftables table (default kube-nlproxy; the IPVS mode's kube-nlproxy-ipvs is read too)",
    },
    Flag {
        name: "kubeconfig",
        value: true,
        help: "for --from NAMESPACE/POD: the API server to find the pod's address in (default: in-cluster, $KUBECONFIG)",
    },
    Flag {
        name: "master",
        value: true,
        help: "for --from NAMESPACE/POD: the API server's address (overrides the kubeconfig's)",
    },
    Flag {
        name: "metrics-address",
        value: true,
        help: "the daemon's metrics server, where userspace mode lists its listeners (default 127.0.0.1:10249)",
    },
    Flag {
        name: "json",
        value: false,
        help: "print JSON",
    },
    Flag {
        name: "exit-zero",
        value: false,
        help: "exit 0 even when the packet is dropped or rejected (by default: 1, as a finding; 2 on trouble)",
    },
];

/// The address `--from external` stands for (documentation ranges: RFC 5737, RFC 3849).
pub fn external_client(family: Family) -> IpAddr {
    match family {
        Family::Ip => IpAddr::from([203, 0, 113, 10]),
        Family::Ip6 => "2001:db8::10".parse().expect("literal"),
    }
}

/// Parses `--to`: `ADDRESS:PORT[/PROTOCOL]`, IPv6 in brackets.
pub fn parse_to(s: &str) -> Result<(IpAddr, u16, u8), String> {
    let (hp, p) = match s.rsplit_once('/') {
        Some((hp, p)) => (hp, p),
        None => (s, "tcp"),
    };
    let protocol = match p.to_ascii_lowercase().as_str() {
        "tcp" => proto::TCP,
        "udp" => proto::UDP,
        "sctp" => proto::SCTP,
        other => {
            return Err(format!(
                "unknown protocol {other:?} (want tcp, udp or sctp)"
            ))
        }
    };
    let sa: std::net::SocketAddr = hp
        .parse()
        .map_err(|_| format!("want ADDRESS:PORT[/PROTOCOL] (IPv6 as [ADDRESS]:PORT), got {s:?}"))?;
    Ok((sa.ip(), sa.port(), protocol))
}

/// An IPVS virtual server with its real servers, as the kernel lists them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VirtualServerReport {
    pub service: String,
    pub scheduler: String,
    /// ClientIP affinity (persistence) timeout in seconds, 0 when none.
    pub persistence: u32,
    pub real_servers: Vec<RealServerReport>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct RealServerReport {
    pub address: String,
    /// Whether the real server sees this host's address (our table's postrouting verdict
    /// for the forwarded packet), and why.
    pub masquerade: bool,
    pub masquerade_reason: Option<String>,
    pub weight: u32,
    /// weight / sum of weights (what weighted schedulers aim at; rr ignores weights > 0).
    pub share: f64,
    pub active_conns: u32,
    pub inactive_conns: u32,
}

/// One possible result for the packet in one table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    pub probability: f64,
    /// `dnat`, `redirect`, `accept`, `reject`, `drop` or `unknown`.
    pub verdict: &'static str,
    pub destination: Option<String>,
    pub masquerade: bool,
    /// Why the source is (or is not) rewritten, from the rules that decided it.
    pub masquerade_reason: Option<String>,
    pub affinity_sets: Vec<String>,
    pub detail: Option<String>,
    /// Userspace mode: the listener a redirect reaches, as the daemon reports it.
    pub listener: Option<crate::proxy::ListenerInfo>,
    pub path: Vec<eval::Step>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct TableReport {
    pub family: &'static str,
    pub table: String,
    pub generation: Option<u32>,
    pub rules: usize,
    pub elements: usize,
    pub outcomes: Vec<Outcome>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub source: String,
    pub destination: String,
    pub protocol: String,
    /// `None`: sent by this host (starts at output).
    pub iif: Option<String>,
    pub notes: Vec<String>,
    pub tables: Vec<TableReport>,
    /// IPVS mode: the virtual server the (translated) destination reaches.
    pub ipvs: Option<VirtualServerReport>,
}

/// `ADDRESS:PORT`, IPv6 in brackets.
pub(crate) fn sock(a: IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(a, port).to_string()
}

fn why_masquerade(p: &Path) -> Option<String> {
    if !p.masquerade {
        return None;
    }
    // The masquerading rule's own comment (hairpin), else the rule that jumped to the
    // chain setting the mark (its comment, or its chain: a service's external chain).
    let masq = p.steps.iter().find(|s| s.action.contains("masquerade"))?;
    if let Some(c) = &masq.comment {
        return Some(c.clone());
    }
    let marker = p.steps.iter().position(|s| s.action.contains("mark set"))?;
    let caller = marker.checked_sub(1).map(|i| &p.steps[i]);
    Some(match caller {
        Some(c) => match &c.comment {
            Some(t) => format!("{t} (chain {}, rule {})", c.chain, c.handle),
            // A service's external chain marks all it gets under externalTrafficPolicy
            // Cluster (upstream's rule has no comment either).
            None if c.chain.starts_with("external-") => format!(
                "external traffic, externalTrafficPolicy Cluster (chain {}, rule {})",
                c.chain, c.handle
            ),
            None => format!("marked by chain {} (rule {})", c.chain, c.handle),
        },
        None => format!("marked by chain {}", p.steps[marker].chain),
    })
}

fn outcome(p: &Path) -> Outcome {
    let (verdict, destination, detail) = match (&p.end, p.dnat, p.redirect) {
        (End::Accept { .. }, Some((a, port)), _) => ("dnat", Some(sock(a, port)), None),
        (End::Accept { .. }, None, Some(port)) => (
            "redirect",
            Some(format!(":{port}")),
            Some("to this host's listener (userspace mode)".into()),
        ),
        (End::Accept { delivered }, None, None) => (
            "accept",
            None,
            Some(
                match delivered {
                    Delivery::Local => "no rule of ours changed it: delivered to this host",
                    Delivery::Routed => "no rule of ours changed it: routed on",
                }
                .into(),
            ),
        ),
        (End::Reject { chain, handle }, ..) => (
            "reject",
            None,
            Some(format!(
                "chain {chain}, rule {handle}: the client sees connection refused"
            )),
        ),
        (End::Drop { chain, handle }, ..) => (
            "drop",
            None,
            Some(format!(
                "chain {chain}, rule {handle}: the client sees a timeout"
            )),
        ),
        (End::Unknown { chain, handle, why }, ..) => (
            "unknown",
            None,
            Some(format!("chain {chain}, rule {handle}: {why}")),
        ),
    };
    Outcome {
        probability: p.probability,
        verdict,
        destination,
        masquerade: p.masquerade,
        masquerade_reason: why_masquerade(p),
        affinity_sets: p.updated_sets.clone(),
        detail,
        listener: None,
        path: p.steps.clone(),
    }
}

/// What one table does to `pkt`.
/// What one table does to a packet, from its evaluated `paths`.
pub fn explain_table(table: &LiveTable, generation: Option<u32>, paths: &[Path]) -> TableReport {
    TableReport {
        family: table.family.name(),
        table: table.name.clone(),
        generation,
        rules: table.rule_count(),
        elements: table.element_count(),
        outcomes: eval::outcomes(paths).iter().map(outcome).collect(),
    }
}

/// The IPVS part: the virtual server for `(addr, port, protocol)` and its real servers.
pub fn virtual_server(vs: &VirtualServer, dests: &[RealServer]) -> VirtualServerReport {
    let total: u32 = dests.iter().map(|d| d.weight).sum();
    VirtualServerReport {
        service: vs.key().to_string(),
        scheduler: vs.scheduler.clone(),
        persistence: vs.persistence,
        real_servers: dests
            .iter()
            .map(|d| RealServerReport {
                address: sock(d.addr, d.port),
                masquerade: false,
                masquerade_reason: None,
                weight: d.weight,
                share: if total == 0 {
                    0.0
                } else {
                    f64::from(d.weight) / f64::from(total)
                },
                active_conns: d.active_conns,
                inactive_conns: d.inactive_conns,
            })
            .collect(),
    }
}

/// The text form.
pub fn render_text(r: &Report) -> String {
    let mut s = String::new();
    let from = match &r.iif {
        Some(i) => format!("in on {i}"),
        None => "sent by this host".into(),
    };
    let _ = writeln!(
        s,
        "packet {} -> {}/{} ({from})",
        r.source, r.destination, r.protocol
    );
    for n in &r.notes {
        let _ = writeln!(s, "  note: {n}");
    }
    if r.tables.is_empty() && r.ipvs.is_none() {
        let _ = writeln!(
            s,
            "none of our tables exists in this family: kube-nlproxy has not programmed this host"
        );
    }
    for t in &r.tables {
        let _ = writeln!(s);
        let generation = t
            .generation
            .map(|g| format!(", generation {g}"))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "table {} {}{generation} ({} rules, {} elements):",
            t.family, t.table, t.rules, t.elements
        );
        for o in &t.outcomes {
            let head = match (&o.destination, o.verdict) {
                (Some(d), "dnat") => format!("DNAT to {d}"),
                (Some(d), "redirect") => format!("redirect to {d}"),
                _ => o.verdict.to_uppercase(),
            };
            let masq = match (&o.masquerade_reason, o.verdict) {
                (Some(why), _) => format!(", masquerade: {why}"),
                (None, "dnat" | "accept" | "redirect") => ", source kept".into(),
                _ => String::new(),
            };
            let _ = writeln!(s, "  {:>5.1}%  {head}{masq}", o.probability * 100.0);
            if let Some(d) = &o.detail {
                let _ = writeln!(s, "          {d}");
            }
            for a in &o.affinity_sets {
                let _ = writeln!(s, "          session affinity: source recorded in @{a}");
            }
            if let Some(l) = &o.listener {
                let eps: Vec<String> = l.endpoints.iter().map(|e| e.to_string()).collect();
                let aff = l
                    .affinity_seconds
                    .map(|t| format!(", ClientIP affinity {t} s"))
                    .unwrap_or_default();
                let _ = writeln!(
                    s,
                    "          listener of {}{}: forwards to {}{aff}",
                    l.service,
                    if l.external {
                        " (external traffic)"
                    } else {
                        ""
                    },
                    if eps.is_empty() {
                        "nothing (no endpoints)".into()
                    } else {
                        eps.join(", ")
                    }
                );
            }
            for st in &o.path {
                let comment = st
                    .comment
                    .as_ref()
                    .map(|c| format!("  # {c}"))
                    .unwrap_or_default();
                let _ = writeln!(
                    s,
                    "          {:<11} {} rule {}: {}{comment}",
                    st.hook,
                    st.chain,
                    st.handle,
                    if st.action.is_empty() {
                        "match"
                    } else {
                        &st.action
                    }
                );
            }
        }
    }
    if let Some(v) = &r.ipvs {
        let _ = writeln!(s);
        let aff = if v.persistence > 0 {
            format!(", persistent {} s", v.persistence)
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "IPVS virtual server {} (scheduler {}{aff}):",
            v.service, v.scheduler
        );
        if v.real_servers.is_empty() {
            let _ = writeln!(s, "  no real servers: the connection is refused");
        }
        for d in &v.real_servers {
            let masq = match &d.masquerade_reason {
                Some(why) => format!("masquerade: {why}"),
                None => "source kept".into(),
            };
            let _ = writeln!(
                s,
                "  {:>5.1}%  {} weight {} ({} active, {} inactive connections), {masq}",
                d.share * 100.0,
                d.address,
                d.weight,
                d.active_conns,
                d.inactive_conns
            );
        }
    }
    s
}

/// What `--from` resolved to.
pub struct Source {
    pub addr: IpAddr,
    /// None: this host sends it.
    pub iif: Option<String>,
    pub notes: Vec<String>,
}

/// The kernel reads `explain` needs, behind one trait so the command runs against a fake.
pub trait KernelView {
    fn local_addrs(&mut self) -> Result<Vec<IpAddr>, ToolError>;
    /// The route the kernel picks for `addr`: its interface by name, and the source
    /// address this host would send from.
    fn route(&mut self, addr: IpAddr) -> Result<Option<(String, Option<IpAddr>)>, ToolError>;
    /// A table with its generation; None when it does not exist (or is empty).
    fn table(&mut self, family: Family, name: &str) -> Result<Option<(LiveTable, u32)>, ToolError>;
    /// The address of Pod `namespace/name` in `family`, from the EndpointSlices that list
    /// it (`kubeconfig`/`master` as the daemon's flags).
    fn pod_address(
        &mut self,
        pod: (&str, &str),
        family: Family,
        api: (Option<&str>, Option<&str>),
    ) -> Result<IpAddr, String>;
    /// Userspace mode's listeners, from the daemon's metrics server at `addr`.
    fn listeners(
        &mut self,
        addr: std::net::SocketAddr,
    ) -> Result<Vec<crate::proxy::ListenerInfo>, String>;
    /// IPVS virtual server for the key with its real servers; None without IPVS or VS.
    fn ipvs(
        &mut self,
        addr: IpAddr,
        port: u16,
        protocol: u8,
    ) -> Result<Option<(VirtualServer, Vec<RealServer>)>, ToolError>;
    /// Every IPVS virtual server with its real servers; none without IPVS.
    fn ipvs_all(&mut self) -> Result<Vec<(VirtualServer, Vec<RealServer>)>, ToolError>;
}

fn resolve_from(
    kv: &mut dyn KernelView,
    a: &args::Args,
    daddr: IpAddr,
    locals: &[IpAddr],
) -> Result<Source, ToolError> {
    let usage = |msg: String| ToolError::Usage {
        tool: "explain",
        msg,
    };
    let family = Family::of(&daddr);
    let from = a.get("from").unwrap_or("node");
    let mut notes = Vec::new();
    let (addr, node) = match from {
        "node" => {
            // The source a connection from this host gets: the route's preferred source,
            // else the first global address of the family.
            let routed = kv.route(daddr)?.and_then(|(_, src)| src);
            let addr = routed.or(first_global(locals, family)).ok_or_else(|| {
                usage(format!(
                    "--from node: this host has no {} address",
                    family.name()
                ))
            })?;
            (addr, true)
        }
        "external" => (external_client(family), false),
        other => {
            let addr: IpAddr = match other.parse() {
                Ok(a) => a,
                Err(_) if is_pod_name(other) => {
                    let (ns, name) = other.split_once('/').unwrap_or(("default", other));
                    let found = kv
                        .pod_address((ns, name), family, (a.get("kubeconfig"), a.get("master")))
                        .map_err(|why| usage(format!("--from {other}: {why}")))?;
                    notes.push(format!("Pod {ns}/{name} is {found}"));
                    found
                }
                Err(_) => {
                    return Err(usage(format!(
                        "--from: want an address, NAMESPACE/POD, node or external, got {other:?}"
                    )))
                }
            };
            if Family::of(&addr) != family {
                return Err(usage(format!(
                    "--from {addr} and --to are of different IP families"
                )));
            }
            let node = locals.contains(&addr) && a.get("iif").is_none();
            if node {
                notes.push(format!(
                    "{addr} is this host's address: the packet starts at output"
                ));
            }
            (addr, node)
        }
    };
    let iif = if node {
        None
    } else if let Some(i) = a.get("iif") {
        Some(i.to_string())
    } else if let Some((i, _)) = kv.route(addr)? {
        notes.push(format!(
            "input interface {i}: the one the kernel routes {addr} through (override with --iif)"
        ));
        Some(i)
    } else {
        Some(unrouted_source_iif(kv, addr, family, &mut notes)?)
    };
    if from == "external" {
        notes.push(format!("external client {addr}"));
    }
    Ok(Source { addr, iif, notes })
}

/// The input interface of a source this host has no route to (a pod on another node behind
/// a CNI that routes by default, a client in a bare namespace): such a packet arrives as
/// traffic from outside this host does, on the interface of the route to outside (the one to
/// [`external_client`]); with no such route either, on an interface no rule names (so no
/// `iifname` match calls it a pod's). Either way a note says so.
fn unrouted_source_iif(
    kv: &mut dyn KernelView,
    addr: IpAddr,
    family: Family,
    notes: &mut Vec<String>,
) -> Result<String, ToolError> {
    Ok(match kv.route(external_client(family))? {
        Some((i, _)) => {
            notes.push(format!(
                "no route to {addr}: taken as arriving from outside this host, on {i}, the interface of the route to outside (override with --iif)"
            ));
            i
        }
        None => {
            notes.push(format!(
                "no route to {addr} and none to outside: taken as arriving on an interface no rule names (override with --iif)"
            ));
            UNKNOWN_IIF.into()
        }
    })
}

/// The input interface name used when no route says which: no rule of ours names it.
pub const UNKNOWN_IIF: &str = "(unknown)";

/// `name` or `namespace/name`, each a DNS label or subdomain as Kubernetes names are.
fn is_pod_name(s: &str) -> bool {
    let ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 253
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    match s.split_once('/') {
        Some((ns, n)) => ok(ns) && ok(n),
        None => ok(s),
    }
}

/// This host's first global (not loopback, not link-local) address in `family`.
pub(crate) fn first_global(locals: &[IpAddr], family: Family) -> Option<IpAddr> {
    locals
        .iter()
        .copied()
        .find(|l| Family::of(l) == family && !l.is_loopback() && !is_link_local(l))
}

fn is_link_local(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// `explain` over a kernel view: the report.
pub fn explain(kv: &mut dyn KernelView, a: &args::Args) -> Result<Report, ToolError> {
    let usage = |msg: String| ToolError::Usage {
        tool: "explain",
        msg,
    };
    let to = a
        .get("to")
        .ok_or_else(|| usage("--to is required (e.g. --to 10.96.0.10:53/udp)".into()))?;
    let (daddr, dport, protocol) = parse_to(to).map_err(|e| usage(format!("--to: {e}")))?;
    let family = Family::of(&daddr);
    let mark = match a.get("mark") {
        None => 0,
        Some(m) => parse_u32(m).ok_or_else(|| {
            usage(format!(
                "--mark: want a number (0x4000 or 16384), got {m:?}"
            ))
        })?,
    };
    let sport = match a.get("sport") {
        None => 40000,
        Some(p) => p
            .parse()
            .map_err(|_| usage(format!("--sport: want a port number, got {p:?}")))?,
    };
    let locals = kv.local_addrs()?;
    let src = resolve_from(kv, a, daddr, &locals)?;
    let pkt = Packet {
        saddr: src.addr,
        daddr,
        proto: protocol,
        sport,
        dport,
        iif: src.iif.clone(),
        mark,
    };
    let host = Host {
        local_addrs: locals,
    };
    let main = a.get("table").unwrap_or(crate::proxy::names::DEFAULT_TABLE);
    let metrics = a.get("metrics-address").unwrap_or("127.0.0.1:10249");
    let metrics: std::net::SocketAddr = metrics.parse().map_err(|_| {
        usage(format!(
            "--metrics-address: want ADDRESS:PORT, got {metrics:?}"
        ))
    })?;
    let loaded = load_tables(kv, family, main)?;
    let mut notes = src.notes;
    let (tables, ipvs) = trace(kv, &loaded, &host, &pkt, metrics, &mut notes)?;
    Ok(Report {
        source: sock(src.addr, sport),
        destination: sock(daddr, dport),
        protocol: proto::name(protocol),
        iif: src.iif,
        notes,
        tables,
        ipvs,
    })
}

/// The tables of `family` a packet goes through, read once: `main` (ours) and IPVS mode's,
/// each with its generation, those that exist.
pub fn load_tables(
    kv: &mut dyn KernelView,
    family: Family,
    main: &str,
) -> Result<Vec<(LiveTable, u32)>, ToolError> {
    let mut out = Vec::new();
    for name in [main, crate::modes::ipvs::table::DEFAULT_TABLE] {
        if let Some(t) = kv.table(family, name)? {
            out.push(t);
        }
    }
    Ok(out)
}

/// What `tables` (from [`load_tables`]) and IPVS do to `pkt`: each table's outcomes, and
/// the virtual server it reaches in IPVS mode. A redirect to a userspace listener is
/// completed from the daemon's metrics server at `metrics`; what cannot be read is a note.
pub fn trace(
    kv: &mut dyn KernelView,
    loaded: &[(LiveTable, u32)],
    host: &Host,
    pkt: &Packet,
    metrics: std::net::SocketAddr,
    notes: &mut Vec<String>,
) -> Result<(Vec<TableReport>, Option<VirtualServerReport>), ToolError> {
    let (daddr, dport, protocol) = (pkt.daddr, pkt.dport, pkt.proto);
    let family = Family::of(&daddr);
    let mut tables = Vec::new();
    // Each table with its evaluated paths (the IPVS stage continues from them).
    let mut evaluated = Vec::new();
    for (t, g) in loaded {
        let paths = eval::evaluate(t, host, pkt);
        tables.push(explain_table(t, Some(*g), &paths));
        evaluated.push((t, paths));
    }
    // A redirect reaches one of userspace mode's listeners: the daemon knows its endpoints.
    if tables
        .iter()
        .flat_map(|t| &t.outcomes)
        .any(|o| o.verdict == "redirect")
    {
        let addr = metrics;
        match kv.listeners(addr) {
            Ok(all) => {
                for o in tables.iter_mut().flat_map(|t| &mut t.outcomes) {
                    let port = o.destination.as_deref().and_then(|d| d.strip_prefix(':'));
                    let port: Option<u16> = port.and_then(|p| p.parse().ok());
                    o.listener = all
                        .iter()
                        .find(|l| Some(l.port) == port && l.ipv4 == (family == Family::Ip))
                        .cloned();
                }
            }
            Err(why) => notes.push(format!(
                "the daemon's listeners are not readable at http://{addr}/userspace/listeners ({why})"
            )),
        }
    }
    // IPVS sees the packet at local delivery, after our tables (which never DNAT in IPVS
    // mode), and forwards it to a real server: out through postrouting, where our table
    // decides masquerading from the mark the earlier hooks set.
    let mut ipvs = None;
    if let Some((vs, rs)) = kv.ipvs(daddr, dport, protocol)? {
        let mut report = virtual_server(&vs, &rs);
        let delivered: Vec<(&LiveTable, &Path)> = evaluated
            .iter()
            .flat_map(|&(t, ref paths)| {
                paths
                    .iter()
                    .filter(|p| {
                        matches!(
                            p.end,
                            End::Accept {
                                delivered: Delivery::Local
                            }
                        )
                    })
                    .map(move |p| (t, p))
            })
            .collect();
        for (r, d) in report.real_servers.iter_mut().zip(&rs) {
            for (t, p) in &delivered {
                // This host's own packet met postrouting once already (on its way to
                // the local VIP): a masquerade there holds for the forwarded one too.
                if p.masquerade {
                    r.masquerade = true;
                    r.masquerade_reason = why_masquerade(p);
                }
                let fwd = Packet {
                    daddr: d.addr,
                    dport: d.port,
                    mark: p.mark,
                    ..pkt.clone()
                };
                for q in eval::evaluate_from(t, host, &fwd, crate::kernel::nft::Hook::Postrouting) {
                    if q.masquerade {
                        r.masquerade = true;
                        let mut steps = p.steps.clone();
                        steps.extend(q.steps.clone());
                        r.masquerade_reason = why_masquerade(&Path { steps, ..q.clone() });
                    }
                }
            }
        }
        ipvs = Some(report);
    }
    Ok((tables, ipvs))
}

fn parse_u32(s: &str) -> Option<u32> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The live kernel, over netlink.
pub struct LiveKernel {
    nft: Option<crate::kernel::nft::netlink::NetlinkNftables>,
    links: Option<crate::kernel::rtnl::NetlinkLinks>,
    ipvs: Option<Option<crate::kernel::ipvs::netlink::NetlinkIpvs>>,
}

impl LiveKernel {
    pub fn new() -> LiveKernel {
        LiveKernel {
            nft: None,
            links: None,
            ipvs: None,
        }
    }

    fn nft(&mut self) -> Result<&mut crate::kernel::nft::netlink::NetlinkNftables, ToolError> {
        if self.nft.is_none() {
            self.nft = Some(
                crate::kernel::nft::netlink::NetlinkNftables::open()
                    .map_err(|e| ToolError::kernel("open the nf_tables netlink socket", e))?,
            );
        }
        Ok(self.nft.as_mut().expect("just set"))
    }

    fn links(&mut self) -> Result<&mut crate::kernel::rtnl::NetlinkLinks, ToolError> {
        if self.links.is_none() {
            self.links = Some(
                crate::kernel::rtnl::NetlinkLinks::open()
                    .map_err(|e| ToolError::kernel("open the rtnetlink socket", e))?,
            );
        }
        Ok(self.links.as_mut().expect("just set"))
    }

    /// A table and its generation, read consistently: re-read when the generation moved
    /// while the several dumps ran (a sync in between), up to 5 times.
    pub fn read_table(
        &mut self,
        family: Family,
        name: &str,
    ) -> Result<(LiveTable, u32), ToolError> {
        let nft = self.nft()?;
        let what = || format!("read table {} {name}", family.name());
        let mut last = None;
        for _ in 0..5 {
            let g0 = nft.generation().map_err(|e| ToolError::kernel(what(), e))?;
            let t = nft
                .read_table(family, name)
                .map_err(|e| ToolError::kernel(what(), e))?;
            let g1 = nft.generation().map_err(|e| ToolError::kernel(what(), e))?;
            if g0 == g1 {
                return Ok((t, g1));
            }
            last = Some((t, g1));
        }
        Ok(last.expect("five reads"))
    }
}

impl Default for LiveKernel {
    fn default() -> Self {
        Self::new()
    }
}

impl KernelView for LiveKernel {
    fn local_addrs(&mut self) -> Result<Vec<IpAddr>, ToolError> {
        use crate::kernel::rtnl::Links;
        Ok(self
            .links()?
            .addresses()
            .map_err(|e| ToolError::kernel("list addresses", e))?
            .into_iter()
            .map(|a| a.addr)
            .collect())
    }

    fn route(&mut self, addr: IpAddr) -> Result<Option<(String, Option<IpAddr>)>, ToolError> {
        let links = self.links()?;
        let Some((index, src)) = links
            .route_get(addr)
            .map_err(|e| ToolError::kernel(format!("look up the route to {addr}"), e))?
        else {
            return Ok(None);
        };
        Ok(links
            .links()
            .map_err(|e| ToolError::kernel("list links", e))?
            .into_iter()
            .find(|l| l.index == index)
            .map(|l| (l.name, src)))
    }

    fn table(&mut self, family: Family, name: &str) -> Result<Option<(LiveTable, u32)>, ToolError> {
        let (t, g) = self.read_table(family, name)?;
        Ok((!t.chains.is_empty()).then_some((t, g)))
    }

    fn pod_address(
        &mut self,
        pod: (&str, &str),
        family: Family,
        api: (Option<&str>, Option<&str>),
    ) -> Result<IpAddr, String> {
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime: {e}"))?;
        let (ns, name) = pod;
        let want = if family == Family::Ip { "IPv4" } else { "IPv6" };
        rt.block_on(async {
            let client = crate::source::kube::client(api.0.map(std::path::Path::new), api.1)
                .await
                .map_err(|e| format!("cannot reach the API server: {e}"))?;
            let slices = kube::Api::<EndpointSlice>::namespaced(client, ns);
            let list = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                slices.list(&Default::default()),
            )
            .await
            .map_err(|_| "the API server did not answer in 10 s".to_string())?
            .map_err(|e| format!("cannot list EndpointSlices in {ns}: {e}"))?;
            for s in list.items.iter().filter(|s| s.address_type == want) {
                for e in s.endpoints.iter().flatten() {
                    let is_it = e.target_ref.as_ref().is_some_and(|t| {
                        t.kind.as_deref() == Some("Pod") && t.name.as_deref() == Some(name)
                    });
                    if let Some(a) = e.addresses.first().filter(|_| is_it) {
                        return a.parse().map_err(|_| format!("its address {a:?} is not an IP"));
                    }
                }
            }
            Err(format!(
                "no {want} EndpointSlice in namespace {ns} lists Pod {name} (only Pods behind a Service can be named; give the pod's IP)"
            ))
        })
    }

    fn listeners(
        &mut self,
        addr: std::net::SocketAddr,
    ) -> Result<Vec<crate::proxy::ListenerInfo>, String> {
        let body = super::http_get(addr, "/userspace/listeners")?;
        serde_json::from_str(&body).map_err(|e| format!("not a listener list: {e}"))
    }

    fn ipvs(
        &mut self,
        addr: IpAddr,
        port: u16,
        protocol: u8,
    ) -> Result<Option<(VirtualServer, Vec<RealServer>)>, ToolError> {
        let Some(ipvs) = self.ipvs_socket()? else {
            return Ok(None);
        };
        let services = ipvs
            .services()
            .map_err(|e| ToolError::kernel("list IPVS virtual servers", e))?;
        let Some(vs) = services
            .into_iter()
            .find(|v| v.addr == addr && v.port == port && v.protocol == protocol)
        else {
            return Ok(None);
        };
        let dests = ipvs
            .dests(&vs)
            .map_err(|e| ToolError::kernel(format!("list the real servers of {}", vs.key()), e))?;
        Ok(Some((vs, dests)))
    }

    fn ipvs_all(&mut self) -> Result<Vec<(VirtualServer, Vec<RealServer>)>, ToolError> {
        let Some(ipvs) = self.ipvs_socket()? else {
            return Ok(Vec::new());
        };
        let services = ipvs
            .services()
            .map_err(|e| ToolError::kernel("list IPVS virtual servers", e))?;
        let mut out = Vec::with_capacity(services.len());
        for vs in services {
            let dests = ipvs.dests(&vs).map_err(|e| {
                ToolError::kernel(format!("list the real servers of {}", vs.key()), e)
            })?;
            out.push((vs, dests));
        }
        Ok(out)
    }
}

impl LiveKernel {
    /// The IPVS socket, opened at the first use; `None` when the kernel has no IPVS.
    fn ipvs_socket(
        &mut self,
    ) -> Result<Option<&mut crate::kernel::ipvs::netlink::NetlinkIpvs>, ToolError> {
        if self.ipvs.is_none() {
            self.ipvs = Some(match crate::kernel::ipvs::netlink::NetlinkIpvs::open() {
                Ok(i) => Some(i),
                Err(crate::kernel::ipvs::Error::Unavailable) => None,
                Err(e) => return Err(ToolError::kernel("open the IPVS netlink socket", e)),
            });
        }
        Ok(self.ipvs.as_mut().and_then(Option::as_mut))
    }
}

/// The `explain` command: a finding (exit 1) when the packet can be dropped or rejected,
/// unless `--exit-zero`.
pub fn run(args: &[String]) -> Result<super::Printed, ToolError> {
    let a = args::parse("explain", USAGE, FLAGS, args)?;
    let report = explain(&mut LiveKernel::new(), &a)?;
    let text = if a.has("json") {
        serde_json::to_string_pretty(&report).expect("a report serializes") + "\n"
    } else {
        render_text(&report)
    };
    Ok(super::Printed {
        text,
        finding: !a.has("exit-zero") && refused(&report),
    })
}

/// Whether some outcome of the packet, in any table, is a drop or a reject.
pub fn refused(report: &Report) -> bool {
    report
        .tables
        .iter()
        .flat_map(|t| &t.outcomes)
        .any(|o| matches!(o.verdict, "drop" | "reject"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::proxy::{LocalDetector, ProxierConfig};

    /// Node 192.168.0.2 with `default/web` (ClusterIP 10.96.0.10:80, NodePort 30080): one
    /// local endpoint and one remote, as nftables mode plans them.
    pub(crate) struct FakeView {
        /// Whether the host has routes (none at all: nothing is routed, not even outside).
        pub routes: bool,
    }

    impl Default for FakeView {
        fn default() -> Self {
            FakeView { routes: true }
        }
    }

    fn planned(family: Family) -> LiveTable {
        let st = crate::model::fixtures::web_state(Some(30080));
        let cfg = ProxierConfig {
            local_detector: LocalDetector::Cidrs(vec!["10.244.0.0/16".parse().unwrap()]),
            ..Default::default()
        };
        crate::modes::nftables::plan::build_ruleset(&st, &cfg, family).as_live()
    }

    impl KernelView for FakeView {
        fn local_addrs(&mut self) -> Result<Vec<IpAddr>, ToolError> {
            Ok(vec!["192.168.0.2".parse().unwrap()])
        }
        fn route(&mut self, a: IpAddr) -> Result<Option<(String, Option<IpAddr>)>, ToolError> {
            if !self.routes || a.to_string().starts_with("10.244.9.") {
                return Ok(None); // a pod on another node this host has no route to
            }
            Ok(Some((
                if a.to_string().starts_with("10.244.1.") {
                    "veth-pod3".into()
                } else {
                    "eth0".into()
                },
                Some("192.168.0.2".parse().unwrap()),
            )))
        }
        fn table(
            &mut self,
            family: Family,
            name: &str,
        ) -> Result<Option<(LiveTable, u32)>, ToolError> {
            Ok((name == crate::proxy::names::DEFAULT_TABLE).then(|| (planned(family), 7)))
        }
        fn ipvs(
            &mut self,
            _: IpAddr,
            _: u16,
            _: u8,
        ) -> Result<Option<(VirtualServer, Vec<RealServer>)>, ToolError> {
            Ok(None)
        }
        fn ipvs_all(&mut self) -> Result<Vec<(VirtualServer, Vec<RealServer>)>, ToolError> {
            Ok(Vec::new())
        }
        fn listeners(
            &mut self,
            _: std::net::SocketAddr,
        ) -> Result<Vec<crate::proxy::ListenerInfo>, String> {
            Err("no daemon in unit tests".into())
        }
        fn pod_address(
            &mut self,
            pod: (&str, &str),
            _: Family,
            _: (Option<&str>, Option<&str>),
        ) -> Result<IpAddr, String> {
            match pod {
                ("default", "client-0") => Ok("10.244.1.3".parse().unwrap()),
                (ns, n) => Err(format!("no EndpointSlice in namespace {ns} lists Pod {n}")),
            }
        }
    }

    fn report(a: &[&str]) -> Result<Report, ToolError> {
        let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        explain(
            &mut FakeView::default(),
            &args::parse("explain", USAGE, FLAGS, &a)?,
        )
    }

    fn text(a: &[&str]) -> Result<String, ToolError> {
        report(a).map(|r| render_text(&r))
    }

    #[test]
    fn golden_text_for_a_node_port_from_outside() {
        let got = text(&["--from", "external", "--to", "192.168.0.2:30080"]).unwrap();
        super::super::golden("explain-nodeport-external.txt", &got);
    }

    #[test]
    fn golden_text_for_an_unused_cluster_ip_port_from_a_pod() {
        let got = text(&["--from", "10.244.1.3", "--to", "10.96.0.10:81/tcp"]).unwrap();
        super::super::golden("explain-unused-port.txt", &got);
    }

    #[test]
    fn a_rejected_packet_is_a_finding_and_a_delivered_one_is_not() {
        let rejected = report(&["--from", "10.244.1.3", "--to", "10.96.0.10:81/tcp"]).unwrap();
        assert!(refused(&rejected));
        let delivered = report(&["--from", "10.244.1.3", "--to", "10.96.0.10:80"]).unwrap();
        assert!(!refused(&delivered));
        // The exit status run() gives them (1 a finding, 0 nothing found).
        let printed = |finding| super::super::Printed {
            text: String::new(),
            finding,
        };
        assert_eq!(printed(refused(&rejected)).exit_code(), 1);
        assert_eq!(printed(refused(&delivered)).exit_code(), 0);
        let a = ["--to", "10.96.0.10:81", "--exit-zero"].map(String::from);
        assert!(args::parse("explain", USAGE, FLAGS, &a)
            .unwrap()
            .has("exit-zero"));
    }

    #[test]
    fn pod_to_cluster_ip_reaches_both_endpoints_with_the_client_address() {
        let r = report(&["--from", "10.244.1.3", "--to", "10.96.0.10:80"]).unwrap();
        let o = &r.tables[0].outcomes;
        let dests: Vec<_> = o.iter().map(|o| o.destination.clone().unwrap()).collect();
        assert_eq!(dests, ["10.244.1.2:8080", "10.244.2.2:8080"]);
        assert!(o
            .iter()
            .all(|o| !o.masquerade && (o.probability - 0.5).abs() < 1e-9));
        assert_eq!(r.iif.as_deref(), Some("veth-pod3"));
    }

    /// A source with no route (a pod on another node here) is taken as arriving from
    /// outside, on the route to outside's interface, and the report says so instead of
    /// stopping; --iif still overrides.
    #[test]
    fn a_source_without_a_route_arrives_as_from_outside_and_says_so() {
        let r = report(&["--from", "10.244.9.7", "--to", "192.168.0.2:30080"]).unwrap();
        assert_eq!(r.iif.as_deref(), Some("eth0"));
        assert!(
            r.notes
                .iter()
                .any(|n| n.contains("no route to 10.244.9.7") && n.contains("on eth0")),
            "{:?}",
            r.notes
        );
        assert!(!r.tables[0].outcomes.is_empty());
        let r = report(&[
            "--from",
            "10.244.9.7",
            "--iif",
            "veth9",
            "--to",
            "192.168.0.2:30080",
        ])
        .unwrap();
        assert_eq!(r.iif.as_deref(), Some("veth9"));
        // No route to outside either: an interface no rule names.
        let mut notes = Vec::new();
        let iif = unrouted_source_iif(
            &mut FakeView { routes: false },
            "10.244.9.7".parse().unwrap(),
            Family::Ip,
            &mut notes,
        )
        .unwrap();
        assert_eq!(iif, UNKNOWN_IIF);
        assert!(notes[0].contains("none to outside"), "{notes:?}");
    }

    /// `explain --json`'s field names, what scripts read (docs/operating.md): a rename
    /// fails here.
    #[test]
    fn json_schema_is_pinned() {
        fn keys(v: &serde_json::Value) -> Vec<&str> {
            let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
            k.sort_unstable();
            k
        }
        let r = report(&["--from", "10.244.1.3", "--to", "10.96.0.10:80"]).unwrap();
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            keys(&v),
            [
                "destination",
                "iif",
                "ipvs",
                "notes",
                "protocol",
                "source",
                "tables"
            ]
        );
        assert_eq!(v["source"], "10.244.1.3:40000");
        assert_eq!(v["destination"], "10.96.0.10:80");
        assert_eq!(v["protocol"], "tcp");
        let t = &v["tables"][0];
        assert_eq!(
            keys(t),
            [
                "elements",
                "family",
                "generation",
                "outcomes",
                "rules",
                "table"
            ]
        );
        assert_eq!(
            (t["family"].as_str(), t["generation"].as_u64()),
            (Some("ip"), Some(7))
        );
        let o = &t["outcomes"][0];
        assert_eq!(
            keys(o),
            [
                "affinity_sets",
                "destination",
                "detail",
                "listener",
                "masquerade",
                "masquerade_reason",
                "path",
                "probability",
                "verdict"
            ]
        );
        assert_eq!(o["verdict"], "dnat");
        assert_eq!(o["destination"], "10.244.1.2:8080");
        assert!(o["path"].as_array().is_some_and(|p| !p.is_empty()));
    }

    #[test]
    fn bad_flags_name_the_flag() {
        let e = |a: &[&str]| text(a).unwrap_err().to_string();
        assert_eq!(
            e(&[]),
            "explain: --to is required (e.g. --to 10.96.0.10:53/udp)"
        );
        assert!(e(&["--to", "10.96.0.10"]).starts_with("explain: --to: want ADDRESS:PORT"));
        assert!(e(&["--to", "10.96.0.10:53/icmp"]).contains("unknown protocol \"icmp\""));
        assert!(
            e(&["--to", "10.96.0.10:53", "--from", "fd00::1"]).contains("different IP families")
        );
        assert!(
            e(&["--to", "10.96.0.10:53", "--from", "My_Pod"]).contains("--from: want an address")
        );
        assert!(e(&["--to", "10.96.0.10:53", "--mark", "x"]).contains("--mark"));
        assert_eq!(
            e(&["--to", "10.96.0.10:53", "--from", "prod/web-1"]),
            "explain: --from prod/web-1: no EndpointSlice in namespace prod lists Pod web-1"
        );
    }

    #[test]
    fn a_pod_name_stands_for_its_address() {
        let r = report(&["--from", "client-0", "--to", "10.96.0.10:80"]).unwrap();
        assert_eq!(r.source, "10.244.1.3:40000");
        assert!(
            r.notes
                .iter()
                .any(|n| n == "Pod default/client-0 is 10.244.1.3"),
            "{:?}",
            r.notes
        );
    }

    #[test]
    fn to_parses_both_families_and_protocols() {
        assert_eq!(
            parse_to("[fd00::10]:53/UDP").unwrap(),
            ("fd00::10".parse().unwrap(), 53, proto::UDP)
        );
        assert_eq!(
            parse_to("10.0.0.1:80").unwrap(),
            ("10.0.0.1".parse().unwrap(), 80, proto::TCP)
        );
    }
}
