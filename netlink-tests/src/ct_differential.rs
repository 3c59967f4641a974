//! Conntrack entries for the cleanup differential (`tests/conntrack_differential.rs`): the
//! Services under test and the entries seeded for them, keyed by the role of each address
//! and port (so that tables read as the scenario and SCTP entries compare with their UDP
//! twins); seeded into a namespace and listed back with Debian's `conntrack` CLI (an oracle
//! apart from our own ctnetlink codec); and a table that puts listings side by side. All
//! pure except [`seed`], [`flush`] and [`list`], which run the CLI inside a namespace.

use std::collections::BTreeSet;
use std::fmt::{self, Display};
use std::net::IpAddr;

use crate::cluster::{EXT_IP, EXT_IP6, NODE_IP, NODE_IP6};
use crate::ns::NetNs;
use crate::scenario::{LOCAL_EP, LOCAL_EP6, REMOTE_EP, REMOTE_EP6};

/// How long a seeded entry lives: far longer than the test, so only a cleanup removes it.
pub const SEED_TIMEOUT_SECS: u32 = 600;

/// One UDP or SCTP entry without NAT on the client's side: the client `orig_src:orig_sport`
/// sent to `orig_dst:orig_dport` and `reply_src:reply_sport` answers it (an endpoint when
/// the entry was DNATed, the destination itself when it was not).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    /// `udp` or `sctp`, as conntrack names them.
    pub proto: String,
    pub orig_src: IpAddr,
    pub orig_sport: u16,
    pub orig_dst: IpAddr,
    pub orig_dport: u16,
    pub reply_src: IpAddr,
    pub reply_sport: u16,
}

impl Entry {
    /// The `conntrack -I` command that creates it (reply towards the client, unchanged
    /// ports), seen replied, for [`SEED_TIMEOUT_SECS`]. SCTP needs the verification tags
    /// the CLI insists on and a state; the kernel's SCTP tracker is built into nf_conntrack.
    pub fn insert_command(&self) -> String {
        let sctp = if self.proto == "sctp" {
            " --state ESTABLISHED --orig-vtag 1 --reply-vtag 2"
        } else {
            ""
        };
        format!(
            "conntrack -I -p {} -s {} -d {} --sport {} --dport {} -r {} -q {} \
             --reply-port-src {} --reply-port-dst {} -t {SEED_TIMEOUT_SECS} -u SEEN_REPLY{sctp}",
            self.proto,
            self.orig_src,
            self.orig_dst,
            self.orig_sport,
            self.orig_dport,
            self.reply_src,
            self.orig_src,
            self.reply_sport,
            self.orig_sport,
        )
    }
}

/// One line of `conntrack -L` (`udp 17 599 src=… dst=… sport=… dport=… [flags] src=… dst=…
/// sport=… dport=… mark=0 use=1`; SCTP lines carry a state after the timeout): the
/// original tuple is the first `src dst sport dport`, the reply tuple the second. `None`
/// for the summary line and anything else that is not an entry of that shape.
pub fn parse_line(line: &str) -> Option<Entry> {
    let proto = line.split_whitespace().next()?.to_string();
    let mut src = Vec::new();
    let mut dst = Vec::new();
    let mut sport = Vec::new();
    let mut dport = Vec::new();
    for word in line.split_whitespace() {
        let Some((k, v)) = word.split_once('=') else {
            continue;
        };
        match k {
            "src" => src.push(v.parse::<IpAddr>().ok()?),
            "dst" => dst.push(v.parse::<IpAddr>().ok()?),
            "sport" => sport.push(v.parse::<u16>().ok()?),
            "dport" => dport.push(v.parse::<u16>().ok()?),
            _ => {}
        }
    }
    if src.len() != 2 || dst.len() != 2 || sport.len() != 2 || dport.len() != 2 {
        return None;
    }
    Some(Entry {
        proto,
        orig_src: src[0],
        orig_sport: sport[0],
        orig_dst: dst[0],
        orig_dport: dport[0],
        reply_src: src[1],
        reply_sport: sport[1],
    })
}

/// Creates `entries` in `ns` with one shell (one `conntrack -I` each, ~3 ms apiece),
/// panicking at the first that fails (an entry with the same tuple exists, say).
pub fn seed(ns: &NetNs, entries: &[Entry]) {
    let mut script = String::from("set -e\n");
    for e in entries {
        script += &e.insert_command();
        script += " 2>/dev/null\n";
    }
    ns.sh(&script);
}

/// Deletes every UDP and SCTP entry of both families in `ns` (`conntrack -D` exits 1 when
/// it found none to delete, so its status says nothing; [`seed`] fails on a leftover).
pub fn flush(ns: &NetNs) {
    ns.sh("for f in ipv4 ipv6; do for p in udp sctp; do \
         conntrack -D -f $f -p $p >/dev/null 2>&1 || true; done; done");
}

/// Every UDP and SCTP entry of both families in `ns`.
pub fn list(ns: &NetNs) -> BTreeSet<Entry> {
    let out = ns.sh("for f in ipv4 ipv6; do for p in udp sctp; do \
         conntrack -L -f $f -p $p 2>/dev/null; done; done");
    out.lines().filter_map(parse_line).collect()
}

/// `rows` (every row of interest, in order) against `columns` (a name and the rows it
/// holds): a line per row, `kept` or `-` per column, `!=` in front where the columns
/// disagree.
pub fn table<K: Ord + Display>(rows: &BTreeSet<K>, columns: &[(&str, &BTreeSet<K>)]) -> String {
    let width = rows
        .iter()
        .map(|r| r.to_string().chars().count())
        .max()
        .unwrap_or(0);
    let mut out = format!("   {:<width$}", "entry");
    for (name, _) in columns {
        out += &format!(" {name:>10}");
    }
    out.push('\n');
    for r in rows {
        let cells: Vec<bool> = columns.iter().map(|(_, set)| set.contains(r)).collect();
        let differ = cells.iter().any(|c| *c != cells[0]);
        out += &format!(
            "{} {:<width$}",
            if differ { "!=" } else { "  " },
            r.to_string()
        );
        for c in cells {
            out += &format!(" {:>10}", if c { "kept" } else { "-" });
        }
        out.push('\n');
    }
    out
}

// The scenario: the Services under test and the entries seeded for them.

/// A Service under test: one port named `p`, dual-stack, type NodePort.
pub struct Svc {
    pub name: &'static str,
    pub proto: &'static str,
    /// Its ClusterIPs, IPv4 then IPv6.
    pub ips: [&'static str; 2],
    /// Its NodePort before and after the NodePort change.
    pub node_ports: [u16; 2],
}

/// `ct-udp`, port 53 (then 54) to targetPort 5353 (then 5354).
pub const UDP: Svc = Svc {
    name: "ct-udp",
    proto: "UDP",
    ips: ["10.96.0.60", "fd00:96::60"],
    node_ports: [30060, 30062],
};
/// `ct-sctp`: `ct-udp`'s twin, on its own addresses and NodePorts.
pub const SCTP: Svc = Svc {
    name: "ct-sctp",
    proto: "SCTP",
    ips: ["10.96.0.61", "fd00:96::61"],
    node_ports: [30070, 30072],
};
/// The port before and after the port change; the targetPort likewise.
pub const PORTS: [u16; 2] = [53, 54];
pub const TARGETS: [u16; 2] = [5353, 5354];
/// The first seeded entry's client port; each entry of a family and protocol has its own.
pub const SPORT_BASE: u16 = 41000;

/// The addresses of one family.
pub struct Fam {
    pub v: u8,
    /// Endpoints E1 (a local pod), E2 (remote), E3 (local).
    pub eps: [&'static str; 3],
    /// Never an endpoint.
    pub never: &'static str,
    /// A host no Service has (node2).
    pub other: &'static str,
    pub node: &'static str,
    /// The client of ClusterIP entries (pod B) and of NodePort ones (outside).
    pub pod: &'static str,
    pub ext: &'static str,
}

/// IPv4, then IPv6: the addresses of `scenario::web_cluster` and a few more.
pub const FAMILIES: [Fam; 2] = [
    Fam {
        v: 4,
        eps: [LOCAL_EP, REMOTE_EP, "10.244.1.4"],
        never: "10.244.1.9",
        other: "192.168.60.2",
        node: NODE_IP,
        pod: "10.244.1.3",
        ext: EXT_IP,
    },
    Fam {
        v: 6,
        eps: [LOCAL_EP6, REMOTE_EP6, "fd00:10:244:1::4"],
        never: "fd00:10:244:1::9",
        other: "fd00:60::2",
        node: NODE_IP6,
        pod: "fd00:10:244:1::3",
        ext: EXT_IP6,
    },
];

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The entries seeded before every step, for `svc`: to each ClusterIP and NodePort (both
/// values each) answered by E1 on either targetPort, E2, E3, an address that never was an
/// endpoint, and the destination itself (never DNATed); and to another host on the port and
/// on the NodePorts, answered by it.
pub fn seeds(svc: &Svc) -> Vec<Entry> {
    let proto = svc.proto.to_lowercase();
    let mut out = Vec::new();
    for (f, cip) in FAMILIES.iter().zip(svc.ips) {
        let mut sport = SPORT_BASE;
        let mut push = |client: &str, (dst, dport): (&str, u16), (rsrc, rsport): (&str, u16)| {
            out.push(Entry {
                proto: proto.clone(),
                orig_src: ip(client),
                orig_sport: sport,
                orig_dst: ip(dst),
                orig_dport: dport,
                reply_src: ip(rsrc),
                reply_sport: rsport,
            });
            sport += 1;
        };
        let dsts = [
            (f.pod, (cip, PORTS[0])),
            (f.pod, (cip, PORTS[1])),
            (f.ext, (f.node, svc.node_ports[0])),
            (f.ext, (f.node, svc.node_ports[1])),
        ];
        for (client, dst) in dsts {
            for reply in [
                (f.eps[0], TARGETS[0]),
                (f.eps[0], TARGETS[1]),
                (f.eps[1], TARGETS[0]),
                (f.eps[2], TARGETS[0]),
                (f.never, TARGETS[0]),
                dst,
            ] {
                push(client, dst, reply);
            }
        }
        for port in [PORTS[0], svc.node_ports[0], svc.node_ports[1]] {
            push(f.pod, (f.other, port), (f.other, port));
        }
    }
    out
}

/// An entry as the comparison sees it: addresses and ports by their role, so that the
/// tables read as the scenario and SCTP entries compare with their UDP twins.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub v: u8,
    pub sport: u16,
    /// `CIP:53`, `NodeIP:np'`, `other:53`, ...
    pub dst: String,
    /// `E1:5353`, `never:5353`, `CIP:53` (not DNATed), ...
    pub reply: String,
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "IPv{} sport {} {:<11} answered by {}",
            self.v, self.sport, self.dst, self.reply
        )
    }
}

/// `e` (an entry of `svc`'s protocol) by role.
pub fn key(svc: &Svc, e: &Entry) -> Key {
    let fam = &FAMILIES[usize::from(e.orig_dst.is_ipv6())];
    let name = |a: IpAddr| -> String {
        let s = a.to_string();
        let role = if svc.ips.contains(&s.as_str()) {
            "CIP"
        } else if s == fam.node {
            "NodeIP"
        } else if s == fam.never {
            "never"
        } else if s == fam.other {
            "other"
        } else if let Some(i) = fam.eps.iter().position(|e| *e == s) {
            ["E1", "E2", "E3"][i]
        } else {
            return s;
        };
        role.to_string()
    };
    let port = |p: u16| match svc.node_ports.iter().position(|np| *np == p) {
        Some(0) => "np".to_string(),
        Some(_) => "np'".to_string(),
        None => p.to_string(),
    };
    Key {
        v: if e.orig_dst.is_ipv6() { 6 } else { 4 },
        sport: e.orig_sport,
        dst: format!("{}:{}", name(e.orig_dst), port(e.orig_dport)),
        reply: format!("{}:{}", name(e.reply_src), port(e.reply_sport)),
    }
}

/// A listing split by protocol, keyed by role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    pub udp: BTreeSet<Key>,
    pub sctp: BTreeSet<Key>,
}

/// `entries` split by protocol and keyed by role.
pub fn keyed(entries: &BTreeSet<Entry>) -> Listing {
    let of = |svc: &Svc| -> BTreeSet<Key> {
        let proto = svc.proto.to_lowercase();
        entries
            .iter()
            .filter(|e| e.proto == proto)
            .map(|e| key(svc, e))
            .collect()
    };
    Listing {
        udp: of(&UDP),
        sctp: of(&SCTP),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_lines_parse_into_their_two_tuples() {
        let udp = "udp      17 599 src=10.244.1.3 dst=10.96.0.60 sport=41000 dport=53 \
                   src=10.244.1.2 dst=10.244.1.3 sport=5353 dport=41000 mark=0 use=1";
        let e = parse_line(udp).unwrap();
        assert_eq!(
            (e.proto.as_str(), e.orig_dst.to_string(), e.orig_dport),
            ("udp", "10.96.0.60".into(), 53)
        );
        assert_eq!(
            (e.reply_src.to_string(), e.reply_sport),
            ("10.244.1.2".into(), 5353)
        );
        let sctp = "sctp     132 599 ESTABLISHED src=fd00:10:244:1::3 dst=fd00:96::61 \
                    sport=41000 dport=9000 [UNREPLIED] src=fd00:10:244:1::2 \
                    dst=fd00:10:244:1::3 sport=9000 dport=41000 mark=0 use=1";
        let e = parse_line(sctp).unwrap();
        assert_eq!(e.proto, "sctp");
        assert_eq!(e.reply_src.to_string(), "fd00:10:244:1::2");
        // The CLI creates what it lists.
        assert!(e.insert_command().contains(
            "-p sctp -s fd00:10:244:1::3 -d fd00:96::61 --sport 41000 --dport 9000 \
             -r fd00:10:244:1::2 -q fd00:10:244:1::3 --reply-port-src 9000 --reply-port-dst 41000"
        ));
        assert_eq!(
            parse_line("conntrack v1.4.7 (conntrack-tools): 2 flow entries have been shown."),
            None
        );
    }

    #[test]
    fn the_table_marks_rows_the_columns_disagree_on() {
        let rows: BTreeSet<&str> = ["a", "b"].into();
        let ours: BTreeSet<&str> = ["a"].into();
        let theirs: BTreeSet<&str> = ["a", "b"].into();
        let t = table(&rows, &[("ours", &ours), ("upstream", &theirs)]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[1].starts_with("   a") && lines[1].ends_with("kept       kept"));
        assert!(lines[2].starts_with("!= b") && lines[2].ends_with("-       kept"));
    }

    #[test]
    fn both_services_seed_the_same_entries_by_role() {
        let keys =
            |svc: &Svc| -> BTreeSet<Key> { seeds(svc).iter().map(|e| key(svc, e)).collect() };
        let udp = keys(&UDP);
        assert_eq!(udp.len(), seeds(&UDP).len(), "one key per entry");
        assert_eq!(udp, keys(&SCTP));
        // Every address by its role, none raw.
        let roles = ["CIP", "NodeIP", "E1", "E2", "E3", "never", "other"];
        let role = |s: &str| roles.contains(&s.split(':').next().unwrap_or(""));
        assert!(
            udp.iter().all(|k| role(&k.dst) && role(&k.reply)),
            "{udp:?}"
        );
        let shown: Vec<String> = udp.iter().take(2).map(|k| k.to_string()).collect();
        assert_eq!(
            shown,
            [
                "IPv4 sport 41000 CIP:53      answered by E1:5353",
                "IPv4 sport 41001 CIP:53      answered by E1:5354"
            ]
        );
    }
}
