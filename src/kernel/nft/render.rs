//! Renders objects and transactions as `nft` syntax: for `--dry-run`, logs, golden tests, and
//! as input to `nft -f` when tests and benchmarks compare against the nft binary. Pure.

use std::fmt::Write;

use super::{
    proto, Chain, CmpOp, ElemData, Element, Expr, Family, Field, KeyValue, Object, Op, Rule, Set,
    Transaction, Verdict,
};

/// A field as nft names it (`ip saddr`, `th dport`).
pub fn field(f: Field, family: Family) -> String {
    match f {
        Field::Saddr => format!("{family} saddr"),
        Field::Daddr => format!("{family} daddr"),
        Field::L4Proto => "meta l4proto".into(),
        Field::Dport => "th dport".into(),
        Field::Sport => "th sport".into(),
        Field::Random(m) => format!("numgen random mod {m}"),
    }
}

fn concat(key: &[Field], family: Family) -> String {
    key.iter()
        .map(|f| field(*f, family))
        .collect::<Vec<_>>()
        .join(" . ")
}

fn type_name(f: Field, family: Family) -> &'static str {
    match (f, family) {
        (Field::Saddr | Field::Daddr, Family::Ip) => "ipv4_addr",
        (Field::Saddr | Field::Daddr, Family::Ip6) => "ipv6_addr",
        (Field::L4Proto, _) => "inet_proto",
        (Field::Dport | Field::Sport, _) => "inet_service",
        (Field::Random(_), _) => "integer",
    }
}

fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "'"))
}

/// A verdict in nft syntax.
pub fn verdict(v: &Verdict) -> String {
    match v {
        Verdict::Accept => "accept".into(),
        Verdict::Drop => "drop".into(),
        Verdict::Return => "return".into(),
        Verdict::Jump(c) => format!("jump {c}"),
        Verdict::Goto(c) => format!("goto {c}"),
    }
}

/// One expression in nft syntax.
pub fn expr(e: &Expr, family: Family) -> String {
    match e {
        Expr::Addr {
            field: f,
            op,
            value,
        } => {
            let op = if *op == CmpOp::Neq { "!= " } else { "" };
            format!("{} {op}{value}", field(*f, family))
        }
        Expr::L4Proto(p) => format!("meta l4proto {}", proto::name(*p)),
        Expr::IifName { name, prefix, op } => {
            let op = if *op == CmpOp::Neq { "!= " } else { "" };
            let star = if *prefix { "*" } else { "" };
            format!("iifname {op}\"{name}{star}\"")
        }
        Expr::InSet { key, set, negate } => {
            let op = if *negate { "!= " } else { "" };
            format!("{} {op}@{set}", concat(key, family))
        }
        Expr::CtStateNew => "ct state new".into(),
        Expr::CtStateInvalid => "ct state invalid".into(),
        Expr::CtStatusDnat => "ct status dnat".into(),
        Expr::FibLocal(f) => {
            let w = if *f == Field::Saddr { "saddr" } else { "daddr" };
            format!("fib {w} type local")
        }
        Expr::MarkBitClear(b) => format!("meta mark & {b:#010x} == 0x00000000"),
        Expr::NumgenZero(m) => format!("numgen random mod {m} 0"),
        Expr::Vmap { key, map } => format!("{} vmap @{map}", concat(key, family)),
        Expr::MarkOr(b) => format!("meta mark set meta mark | {b:#010x}"),
        Expr::MarkXor(b) => format!("meta mark set meta mark ^ {b:#010x}"),
        Expr::Masquerade { fully_random } => {
            if *fully_random {
                "masquerade fully-random".into()
            } else {
                "masquerade".into()
            }
        }
        Expr::Dnat { addr, port } => match addr {
            std::net::IpAddr::V4(a) => format!("dnat to {a}:{port}"),
            std::net::IpAddr::V6(a) => format!("dnat to [{a}]:{port}"),
        },
        Expr::DnatMap {
            modulus,
            offset,
            map,
        } => format!("dnat {family} to numgen random mod {modulus} offset {offset} map @{map}"),
        Expr::DnatHash {
            key,
            modulus,
            seed,
            offset,
            map,
        } => {
            // As `nft list` prints it: the seed in hex, no `offset 0`. (After a `meta l4proto
            // tcp` nft folds that match into the ports and prints `tcp sport`, `tcp dport`.)
            let offset = if *offset == 0 {
                String::new()
            } else {
                format!(" offset {offset}")
            };
            format!(
                "dnat {family} to jhash {} mod {modulus} seed {seed:#x}{offset} map @{map}",
                concat(key, family)
            )
        }
        Expr::DnatLookup { key, map } => {
            format!("dnat {family} to {} map @{map}", concat(key, family))
        }
        Expr::Redirect { port } => format!("redirect to :{port}"),
        Expr::Reject => "reject".into(),
        Expr::UpdateSet { set, key } => format!("update @{set} {{ {} }}", field(*key, family)),
        Expr::Counter => "counter".into(),
        Expr::Verdict(v) => verdict(v),
    }
}

/// A rule's body (what follows `add rule TABLE CHAIN`).
pub fn rule_body(r: &Rule, family: Family) -> String {
    let mut s = r
        .exprs
        .iter()
        .map(|e| expr(e, family))
        .collect::<Vec<_>>()
        .join(" ");
    if let Some(c) = &r.comment {
        write!(s, " comment {}", quote(c)).unwrap();
    }
    s
}

pub fn key_value(k: &KeyValue) -> String {
    match k {
        KeyValue::Addr(a) => a.to_string(),
        KeyValue::Proto(p) => proto::name(*p),
        KeyValue::Port(p) => p.to_string(),
        KeyValue::Slot(s) => s.to_string(),
    }
}

/// An element in nft syntax (`10.96.0.1 . tcp . 80 : goto svc`).
pub fn element(e: &Element) -> String {
    let mut s = e
        .key
        .iter()
        .map(|k| key_value(&k))
        .collect::<Vec<_>>()
        .join(" . ");
    if let Some(c) = e.comment() {
        write!(s, " comment {}", quote(c)).unwrap();
    }
    match &e.data() {
        ElemData::Verdict(v) => write!(s, " : {}", verdict(v)).unwrap(),
        ElemData::Target(t) => write!(s, " : {} . {}", t.ip(), t.port()).unwrap(),
        ElemData::None => {}
    }
    s
}

fn chain_spec(c: &Chain) -> String {
    let mut parts = Vec::new();
    if let Some(b) = &c.base {
        parts.push(format!(
            "type {} hook {} priority {} ;",
            b.kind.name(),
            b.hook.name(),
            b.priority
        ));
    }
    if let Some(cm) = &c.comment {
        parts.push(format!("comment {} ;", quote(cm)));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" {{ {} }}", parts.join(" "))
    }
}

fn set_spec(s: &Set, family: Family) -> String {
    let key = s
        .key
        .iter()
        .map(|f| type_name(*f, family))
        .collect::<Vec<_>>()
        .join(" . ");
    let mut out = if s.endpoints && s.key.is_empty() {
        format!(" {{ typeof numgen random mod 1 : {family} daddr . tcp dport ;")
    } else if s.endpoints && s.key.iter().any(|f| matches!(f, Field::Random(_))) {
        // No type name prints a `numgen` value: declared by the expressions, as nft does.
        format!(
            " {{ typeof {} : {family} daddr . th dport ;",
            concat(&s.key, family)
        )
    } else if s.endpoints {
        let addr = type_name(Field::Daddr, family);
        format!(" {{ type {key} : {addr} . inet_service ;")
    } else if s.map {
        format!(" {{ type {key} : verdict ;")
    } else {
        format!(" {{ type {key} ;")
    };
    if let Some(t) = s.timeout {
        write!(out, " flags dynamic,timeout ; timeout {t}s ;").unwrap();
    }
    if let Some(c) = &s.comment {
        write!(out, " comment {} ;", quote(c)).unwrap();
    }
    out.push_str(" }");
    out
}

/// One operation as an `nft -f` command line.
pub fn op(o: &Op, family: Family, table: &str) -> String {
    let t = format!("{family} {table}");
    match (o, o.object()) {
        (Op::Add(_), Object::Table(tb)) => match &tb.comment {
            Some(c) => format!("add table {t} {{ comment {} ; }}", quote(c)),
            None => format!("add table {t}"),
        },
        (Op::Flush(_), Object::Table(_)) => format!("flush table {t}"),
        (Op::Delete(_), Object::Table(_)) => format!("delete table {t}"),
        (Op::Add(_), Object::Chain(c)) => format!("add chain {t} {}{}", c.name, chain_spec(c)),
        (Op::Flush(_), Object::Chain(c)) => format!("flush chain {t} {}", c.name),
        (Op::Delete(_), Object::Chain(c)) => format!("delete chain {t} {}", c.name),
        (Op::Add(_), Object::Rule(r)) => {
            format!("add rule {t} {} {}", r.chain, rule_body(r, family))
        }
        (Op::Delete(_), Object::Rule(r)) if r.handle.is_some() => format!(
            "delete rule {t} {} handle {}",
            r.chain,
            r.handle.unwrap_or_default()
        ),
        (Op::Flush(_) | Op::Delete(_), Object::Rule(r)) => format!("flush chain {t} {}", r.chain),
        (Op::Add(_), Object::Set(s)) => {
            let kw = if s.map || s.endpoints { "map" } else { "set" };
            format!("add {kw} {t} {}{}", s.name, set_spec(s, family))
        }
        (Op::Flush(_), Object::Set(s)) => {
            let kw = if s.map || s.endpoints { "map" } else { "set" };
            format!("flush {kw} {t} {}", s.name)
        }
        (Op::Delete(_), Object::Set(s)) => {
            let kw = if s.map || s.endpoints { "map" } else { "set" };
            format!("delete {kw} {t} {}", s.name)
        }
        (Op::Add(_), Object::Element(e)) => {
            format!("add element {t} {} {{ {} }}", e.set(), element(e))
        }
        (Op::Delete(_), Object::Element(e)) => {
            let key = e
                .key
                .iter()
                .map(|k| key_value(&k))
                .collect::<Vec<_>>()
                .join(" . ");
            format!("delete element {t} {} {{ {key} }}", e.set())
        }
        (Op::Flush(_), Object::Element(e)) => format!("flush set {t} {}", e.set()),
    }
}

/// A whole transaction, one command per line: valid input for `nft -f`.
pub fn transaction(tx: &Transaction) -> String {
    let mut s = String::new();
    for o in &tx.ops {
        s.push_str(&op(o, tx.family, &tx.table));
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::nft::Table;

    #[test]
    fn renders_nft_commands() {
        let mut tx = Transaction::new(Family::Ip, "kube-nlproxy");
        tx.add(Table {
            family: Family::Ip,
            name: "kube-nlproxy".into(),
            comment: Some("rules for kube-nlproxy".into()),
        });
        tx.add(Set::vmap(
            "service-ips",
            vec![Field::Daddr, Field::L4Proto, Field::Dport],
        ));
        tx.add(Element::new(
            "service-ips".into(),
            vec![
                KeyValue::Addr("10.96.0.1".parse().unwrap()),
                KeyValue::Proto(6),
                KeyValue::Port(443),
            ],
            ElemData::Verdict(Verdict::Goto("svc".into())),
            None,
        ));
        tx.add(Rule::new(
            "svc",
            vec![
                Expr::NumgenZero(2),
                Expr::L4Proto(6),
                Expr::Dnat {
                    addr: "10.244.1.2".parse().unwrap(),
                    port: 8443,
                },
            ],
        ));
        let out = transaction(&tx);
        assert_eq!(
            out,
            "add table ip kube-nlproxy { comment \"rules for kube-nlproxy\" ; }\n\
             add map ip kube-nlproxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }\n\
             add element ip kube-nlproxy service-ips { 10.96.0.1 . tcp . 443 : goto svc }\n\
             add rule ip kube-nlproxy svc numgen random mod 2 0 meta l4proto tcp dnat to 10.244.1.2:8443\n"
        );
    }

    /// As `nft list` prints a rule it loaded from `dnat ip to jhash … map @M` (the seed in
    /// hex, `offset 0` left out).
    #[test]
    fn renders_a_jhash_dnat_as_nft_lists_it() {
        let hash = |family, offset, seed| {
            let r = Rule::new(
                "c",
                vec![Expr::DnatHash {
                    key: vec![Field::Saddr, Field::Sport, Field::Daddr, Field::Dport],
                    modulus: 1021,
                    seed,
                    offset,
                    map: "endpoints-3".into(),
                }],
            );
            rule_body(&r, family)
        };
        assert_eq!(
            hash(Family::Ip, 2048, 0x4b4e_4c50),
            "dnat ip to jhash ip saddr . th sport . ip daddr . th dport mod 1021 \
             seed 0x4b4e4c50 offset 2048 map @endpoints-3"
        );
        assert_eq!(
            hash(Family::Ip6, 0, 0),
            "dnat ip6 to jhash ip6 saddr . th sport . ip6 daddr . th dport mod 1021 \
             seed 0x0 map @endpoints-3"
        );
    }
}
