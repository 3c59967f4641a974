//! `kube-nlproxy explain`: what the live kernel does to one packet. Reads our tables from
//! the kernel (never our own plan), evaluates the packet through every base chain it meets
//! ([`crate::kernel::nft::eval`]), and for IPVS mode adds the virtual server the packet
//! reaches, its scheduler and real servers. [`explain`] and the renderers are pure; [`run`]
//! does the kernel reads.

mod kernel;
mod report;
mod source;

use std::net::IpAddr;

use crate::kernel::nft::eval::{self, Delivery, End, Host, Packet, Path};
use crate::kernel::nft::live::LiveTable;
use crate::kernel::nft::Family;
use crate::model::net::proto;

use super::args::{self, Flag};
use super::ToolError;

pub use kernel::{KernelView, LiveKernel};
pub(crate) use report::sock;
use report::why_masquerade;
pub use report::{
    explain_table, render_text, virtual_server, Outcome, RealServerReport, Report, TableReport,
    Verdict, VirtualServerReport,
};
pub(crate) use source::first_global;
use source::resolve_from;
pub use source::{Source, UNKNOWN_IIF};

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
        .any(|o| o.verdict == Verdict::Redirect)
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

/// The `explain` command: a finding (exit 1) when the packet can be dropped or rejected,
/// unless `--exit-zero`.
pub fn run(args: &[String]) -> Result<super::Printed, ToolError> {
    let a = args::parse("explain", USAGE, FLAGS, args)?;
    let report = explain(&mut LiveKernel::new(), &a)?;
    let text = if a.has("json") {
        super::to_json("PacketExplanation", &report)
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
        .any(|o| o.verdict.turns_away())
}

#[cfg(any(test, feature = "testing"))]
pub mod fake;
#[cfg(test)]
pub(crate) mod tests;
