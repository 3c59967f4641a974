//! The `explain` report: what a packet meets in each table and at IPVS, and its text form.
//! Pure.

use std::fmt::Write as _;
use std::net::IpAddr;

use crate::kernel::ipvs::{RealServer, VirtualServer};
use crate::kernel::nft::eval::{self, Delivery, End, Path};
use crate::kernel::nft::live::LiveTable;

/// An IPVS virtual server with its real servers, as the kernel lists them.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualServerReport {
    pub service: String,
    pub scheduler: String,
    /// ClientIP affinity (persistence) timeout in seconds, 0 when none.
    pub persistence: u32,
    pub real_servers: Vec<RealServerReport>,
}

#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
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

/// What happens to a packet in the end, as the tools' JSON spells it (`dnat`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Accepted with its destination rewritten to an endpoint.
    Dnat,
    /// Accepted and redirected to this host's listener (userspace mode).
    Redirect,
    /// Accepted unchanged (delivered here or routed on).
    Accept,
    /// Refused: the client sees connection refused.
    Reject,
    /// Dropped: the client sees a timeout.
    Drop,
    /// A rule explain cannot evaluate decided.
    Unknown,
    /// Scheduled by an IPVS virtual server (`services` in IPVS mode).
    Ipvs,
}

impl Verdict {
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Dnat => "dnat",
            Verdict::Redirect => "redirect",
            Verdict::Accept => "accept",
            Verdict::Reject => "reject",
            Verdict::Drop => "drop",
            Verdict::Unknown => "unknown",
            Verdict::Ipvs => "ipvs",
        }
    }

    /// Whether the client is turned away (refused or timed out).
    pub fn turns_away(self) -> bool {
        matches!(self, Verdict::Drop | Verdict::Reject)
    }
}

/// One possible result for the packet in one table.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub probability: f64,
    pub verdict: Verdict,
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
#[serde(rename_all = "camelCase")]
pub struct TableReport {
    pub family: &'static str,
    pub table: String,
    pub generation: Option<u32>,
    pub rules: usize,
    pub elements: usize,
    pub outcomes: Vec<Outcome>,
}

#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
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

pub(super) fn why_masquerade(p: &Path) -> Option<String> {
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
        (End::Accept { .. }, Some((a, port)), _) => (Verdict::Dnat, Some(sock(a, port)), None),
        (End::Accept { .. }, None, Some(port)) => (
            Verdict::Redirect,
            Some(format!(":{port}")),
            Some("to this host's listener (userspace mode)".into()),
        ),
        (End::Accept { delivered }, None, None) => (
            Verdict::Accept,
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
            Verdict::Reject,
            None,
            Some(format!(
                "chain {chain}, rule {handle}: the client sees connection refused"
            )),
        ),
        (End::Drop { chain, handle }, ..) => (
            Verdict::Drop,
            None,
            Some(format!(
                "chain {chain}, rule {handle}: the client sees a timeout"
            )),
        ),
        (End::Unknown { chain, handle, why }, ..) => (
            Verdict::Unknown,
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
        render_table(&mut s, t);
    }
    if let Some(v) = &r.ipvs {
        render_virtual_server(&mut s, v);
    }
    s
}

/// One table's outcomes.
fn render_table(s: &mut String, t: &TableReport) {
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
        render_outcome(s, o);
    }
}

/// One outcome: its share, verdict and source, then what led there.
fn render_outcome(s: &mut String, o: &Outcome) {
    let head = match (&o.destination, o.verdict) {
        (Some(d), Verdict::Dnat) => format!("DNAT to {d}"),
        (Some(d), Verdict::Redirect) => format!("redirect to {d}"),
        _ => o.verdict.as_str().to_uppercase(),
    };
    let masq = match (&o.masquerade_reason, o.verdict) {
        (Some(why), _) => format!(", masquerade: {why}"),
        (None, Verdict::Dnat | Verdict::Accept | Verdict::Redirect) => ", source kept".into(),
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

/// The IPVS virtual server the connection reaches, with its real servers.
fn render_virtual_server(s: &mut String, v: &VirtualServerReport) {
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

#[cfg(test)]
mod tests {
    use super::Verdict;

    #[test]
    fn a_verdict_is_written_as_the_json_always_spelt_it() {
        use Verdict::*;
        for v in [Dnat, Redirect, Accept, Reject, Drop, Unknown, Ipvs] {
            assert_eq!(
                serde_json::to_value(v).unwrap(),
                serde_json::Value::from(v.as_str())
            );
        }
        assert_eq!(Dnat.as_str(), "dnat");
        assert!(Drop.turns_away() && Reject.turns_away() && !Dnat.turns_away());
    }
}
