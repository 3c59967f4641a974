//! Pure encoder: a [`Transaction`] becomes one nfnetlink batch (`NFNL_MSG_BATCH_BEGIN`, one
//! message per operation, `NFNL_MSG_BATCH_END`), byte for byte what the kernel's
//! `nf_tables_api.c` parses. Attribute numbers come from `linux/netfilter/nf_tables.h`.

pub use super::uapi::*;

use crate::kernel::netlink::msg::{MsgWriter, NLM_F_APPEND, NLM_F_CREATE, NLM_F_REQUEST};

use super::lower::{key_bytes, lower, KExpr};
use super::{
    Chain, ElemData, Element, Family, Field, Object, Op, Rule, Set, Table, Transaction, Verdict,
};

/// The kernel caps user data; nft caps comments at 128 bytes.
pub const MAX_COMMENT: usize = 127;

/// libnftnl user data of `typeof numgen random mod 1 : ip daddr . tcp dport` (key byte
/// order host, data byte order network, then the typeof expressions), as nft 1.0.6 sends it
/// and the kernel returns it; `ip6` differs only in the payload base/offset/length of daddr.
fn endpoint_map_udata(family: Family) -> &'static [u8] {
    const IP: &[u8] = &[
        0x00, 0x04, 0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x00, 0x00, 0x00, 0x00, 0x03, 0x1a, 0x00,
        0x04, 0x17, 0x00, 0x00, 0x00, 0x01, 0x12, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00, 0x01, 0x04,
        0x01, 0x00, 0x00, 0x00, 0x02, 0x04, 0x00, 0x00, 0x00, 0x00, 0x04, 0x34, 0x00, 0x04, 0x0d,
        0x00, 0x00, 0x00, 0x01, 0x2c, 0x00, 0x14, 0x00, 0x04, 0x07, 0x00, 0x00, 0x00, 0x01, 0x0c,
        0x00, 0x04, 0x0c, 0x00, 0x00, 0x00, 0x01, 0x04, 0x0c, 0x00, 0x00, 0x00, 0x01, 0x14, 0x00,
        0x04, 0x07, 0x00, 0x00, 0x00, 0x01, 0x0c, 0x00, 0x04, 0x08, 0x00, 0x00, 0x00, 0x01, 0x04,
        0x02, 0x00, 0x00, 0x00, 0x06, 0x04, 0x00, 0x00, 0x00, 0x00,
    ];
    const IP6: &[u8] = &[
        0x00, 0x04, 0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x00, 0x00, 0x00, 0x00, 0x03, 0x1a, 0x00,
        0x04, 0x17, 0x00, 0x00, 0x00, 0x01, 0x12, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00, 0x01, 0x04,
        0x01, 0x00, 0x00, 0x00, 0x02, 0x04, 0x00, 0x00, 0x00, 0x00, 0x04, 0x34, 0x00, 0x04, 0x0d,
        0x00, 0x00, 0x00, 0x01, 0x2c, 0x00, 0x14, 0x00, 0x04, 0x07, 0x00, 0x00, 0x00, 0x01, 0x0c,
        0x00, 0x04, 0x0d, 0x00, 0x00, 0x00, 0x01, 0x04, 0x09, 0x00, 0x00, 0x00, 0x01, 0x14, 0x00,
        0x04, 0x07, 0x00, 0x00, 0x00, 0x01, 0x0c, 0x00, 0x04, 0x08, 0x00, 0x00, 0x00, 0x01, 0x04,
        0x02, 0x00, 0x00, 0x00, 0x06, 0x04, 0x00, 0x00, 0x00, 0x00,
    ];
    match family {
        Family::Ip => IP,
        Family::Ip6 => IP6,
    }
}

/// libnftnl user data of `typeof ip daddr . meta l4proto . th dport . numgen random mod N :
/// ip daddr . th dport`, as nft 1.0.6 sends it for N = 2 and the kernel returns it (read back
/// with `NFT_MSG_GETSET`); N sits at [`BALANCE_MODULUS_AT`] (host byte order). For `ip6` nft
/// sends the same bytes but for the two descriptions of `daddr` ([`BALANCE_DADDR_AT`]).
/// Without it `nft list` cannot print the key.
const BALANCE_UDATA_IP: &[u8] = &[
    0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x01, 0x04, 0x00, 0x00, 0x00, 0x00, 0x03, 0x60, 0x00, 0x04,
    0x0d, 0x00, 0x00, 0x00, 0x01, 0x58, 0x00, 0x14, 0x00, 0x04, 0x07, 0x00, 0x00, 0x00, 0x01, 0x0c,
    0x00, 0x04, 0x0c, 0x00, 0x00, 0x00, 0x01, 0x04, 0x0c, 0x00, 0x00, 0x00, 0x01, 0x0e, 0x00, 0x04,
    0x09, 0x00, 0x00, 0x00, 0x01, 0x06, 0x00, 0x04, 0x10, 0x00, 0x00, 0x00, 0x02, 0x14, 0x00, 0x04,
    0x07, 0x00, 0x00, 0x00, 0x01, 0x0c, 0x00, 0x04, 0x0b, 0x00, 0x00, 0x00, 0x01, 0x04, 0x02, 0x00,
    0x00, 0x00, 0x03, 0x1a, 0x00, 0x04, 0x17, 0x00, 0x00, 0x00, 0x01, 0x12, 0x00, 0x04, 0x01, 0x00,
    0x00, 0x00, 0x01, 0x04, 0x02, 0x00, 0x00, 0x00, 0x02, 0x04, 0x00, 0x00, 0x00, 0x00, 0x04, 0x34,
    0x00, 0x04, 0x0d, 0x00, 0x00, 0x00, 0x01, 0x2c, 0x00, 0x14, 0x00, 0x04, 0x07, 0x00, 0x00, 0x00,
    0x01, 0x0c, 0x00, 0x04, 0x0c, 0x00, 0x00, 0x00, 0x01, 0x04, 0x0c, 0x00, 0x00, 0x00, 0x01, 0x14,
    0x00, 0x04, 0x07, 0x00, 0x00, 0x00, 0x01, 0x0c, 0x00, 0x04, 0x0b, 0x00, 0x00, 0x00, 0x01, 0x04,
    0x02, 0x00, 0x00, 0x00, 0x06, 0x04, 0x00, 0x00, 0x00, 0x00,
];
/// Where N is in [`BALANCE_UDATA_IP`].
const BALANCE_MODULUS_AT: usize = 100;
/// Where the key's and the data's `daddr` say their protocol description and field: nft's
/// `ip` header is description 12, its daddr field 12; `ip6`'s are 13 and 9.
const BALANCE_DADDR_AT: [usize; 2] = [34, 132];

/// The user data of an endpoint map keyed `daddr . l4proto . dport . numgen random mod N`
/// (the only key ending in a `numgen` we create), or `None` for any other key.
fn balance_map_udata(key: &[Field], family: Family) -> Option<Vec<u8>> {
    let [Field::Daddr, Field::L4Proto, Field::Dport, Field::Random(n)] = key else {
        return None;
    };
    let mut u = BALANCE_UDATA_IP.to_vec();
    if family == Family::Ip6 {
        for at in BALANCE_DADDR_AT {
            u[at] = 13; // description: ip6
            u[at + 6] = 9; // field: daddr
        }
    }
    u[BALANCE_MODULUS_AT..BALANCE_MODULUS_AT + 4].copy_from_slice(&n.to_ne_bytes());
    Some(u)
}

pub fn msg_type(nft_msg: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | nft_msg
}

pub use crate::kernel::netlink::msg::nfgenmsg;

/// The nft type id of a set key, composing concatenations as nft does.
pub fn key_type(key: &[Field], family: Family) -> u32 {
    key.iter().fold(0, |acc, f| {
        let t = match f {
            Field::Saddr | Field::Daddr => match family {
                Family::Ip => TYPE_IPADDR,
                Family::Ip6 => TYPE_IP6ADDR,
            },
            Field::L4Proto => TYPE_INET_PROTOCOL,
            Field::Dport | Field::Sport => TYPE_INET_SERVICE,
            Field::Random(_) => TYPE_INTEGER,
        };
        (acc << TYPE_BITS) | t
    })
}

/// Key length in bytes (each concatenated field padded to 32 bits).
pub fn key_len(key: &[Field], family: Family) -> u32 {
    if key.len() == 1 {
        key[0].len(family) as u32
    } else {
        key.iter().map(|f| f.reg_len(family) as u32).sum()
    }
}

fn udata_comment(ty: u8, c: &str) -> Vec<u8> {
    let mut s: Vec<u8> = c.as_bytes().iter().copied().take(MAX_COMMENT).collect();
    s.push(0);
    let mut v = vec![ty, s.len() as u8];
    v.extend(s);
    v
}

/// One encoded batch, and for each message sequence number the operation it carries, so a
/// kernel error can name the object that failed.
#[derive(Debug, Clone)]
pub struct Batch {
    pub bytes: Vec<u8>,
    pub first_seq: u32,
    /// `ops[i]` was sent with sequence `first_seq + 1 + i` (after BATCH_BEGIN).
    pub descriptions: Vec<String>,
}

impl Batch {
    /// The description of the operation sent with `seq`, if it was one of ours.
    pub fn describe(&self, seq: u32) -> Option<&str> {
        let i = seq.checked_sub(self.first_seq + 1)? as usize;
        self.descriptions.get(i).map(String::as_str)
    }
    /// Sequence number of the END message (the last one in the batch).
    pub fn last_seq(&self) -> u32 {
        self.first_seq + self.descriptions.len() as u32 + 1
    }
}

/// Encodes a transaction as one batch starting at sequence `first_seq`.
pub fn encode_transaction(tx: &Transaction, first_seq: u32) -> Batch {
    let mut w = MsgWriter::with_capacity(64 + tx.ops.len() * 160);
    let mut seq = first_seq;
    w.begin_msg(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq);
    w.put_raw(&nfgenmsg(libc::AF_UNSPEC as u8, NFNL_SUBSYS_NFTABLES));
    w.end_msg();
    let mut descriptions = Vec::with_capacity(tx.ops.len());
    let mut i = 0;
    while i < tx.ops.len() {
        seq = seq.wrapping_add(1);
        let op = &tx.ops[i];
        // Consecutive element adds (or deletes) of one set travel in one message: the kernel
        // looks the set up by name once per message, in a list of every set of the table.
        if let Some((add, first)) = element_op(op) {
            let n = encode_elements(&mut w, tx, &tx.ops[i..], add, seq);
            descriptions.push(if n == 1 {
                format!("{} {}", op.verb(), op.object().describe())
            } else {
                format!(
                    "{} {n} elements of {}",
                    if add { "add" } else { "delete" },
                    first.set()
                )
            });
            i += n;
            continue;
        }
        encode_op(&mut w, tx, op, seq);
        descriptions.push(format!("{} {}", op.verb(), op.object().describe()));
        i += 1;
    }
    seq = seq.wrapping_add(1);
    w.begin_msg(NFNL_MSG_BATCH_END, NLM_F_REQUEST, seq);
    w.put_raw(&nfgenmsg(libc::AF_UNSPEC as u8, NFNL_SUBSYS_NFTABLES));
    w.end_msg();
    Batch {
        bytes: w.into_bytes(),
        first_seq,
        descriptions,
    }
}

/// An element add (`true`) or delete, with its element.
fn element_op(op: &Op) -> Option<(bool, &Element)> {
    match op {
        Op::Add(Object::Element(e)) => Some((true, e)),
        Op::Delete(Object::Element(e)) => Some((false, e)),
        _ => None,
    }
}

/// Nested attributes are limited to 64 KiB; stay well below.
const MAX_ELEMENTS_BYTES: usize = 48 << 10;

/// One NEWSETELEM/DELSETELEM message holding the leading run of `ops` that adds (or deletes)
/// elements of the same set; returns how many ops it holds (at least one).
fn encode_elements(w: &mut MsgWriter, tx: &Transaction, ops: &[Op], add: bool, seq: u32) -> usize {
    let Some((_, first)) = element_op(&ops[0]) else {
        return 0;
    };
    if add {
        begin(w, tx, NFT_MSG_NEWSETELEM, NLM_F_CREATE, seq);
    } else {
        begin(w, tx, NFT_MSG_DELSETELEM, 0, seq);
    }
    w.attr_str(NFTA_SET_ELEM_LIST_TABLE, &tx.table);
    w.attr_str(NFTA_SET_ELEM_LIST_SET, first.set());
    w.nest_start(NFTA_SET_ELEM_LIST_ELEMENTS);
    let start = w.len();
    let mut n = 0;
    for op in ops {
        match element_op(op) {
            Some((a, e)) if a == add && e.set() == first.set() => {
                if n > 0 && w.len() - start > MAX_ELEMENTS_BYTES {
                    break;
                }
                element_entry(w, e, add);
                n += 1;
            }
            _ => break,
        }
    }
    w.nest_end();
    w.end_msg();
    n
}

fn begin(w: &mut MsgWriter, tx: &Transaction, msg: u16, flags: u16, seq: u32) {
    w.begin_msg(msg_type(msg), NLM_F_REQUEST | flags, seq);
    w.put_raw(&nfgenmsg(tx.family.nfproto(), 0));
}

fn encode_op(w: &mut MsgWriter, tx: &Transaction, op: &Op, seq: u32) {
    match (op, op.object()) {
        (Op::Add(_), Object::Table(t)) => {
            begin(w, tx, NFT_MSG_NEWTABLE, NLM_F_CREATE, seq);
            table_attrs(w, t);
        }
        (Op::Delete(_), Object::Table(t)) => {
            begin(w, tx, NFT_MSG_DELTABLE, 0, seq);
            w.attr_str(NFTA_TABLE_NAME, &t.name);
        }
        (Op::Flush(_), Object::Table(_)) => {
            // Flushing a table removes every rule of every chain (like `nft flush table`).
            begin(w, tx, NFT_MSG_DELRULE, 0, seq);
            w.attr_str(NFTA_RULE_TABLE, &tx.table);
        }
        (Op::Add(_), Object::Chain(c)) => {
            begin(w, tx, NFT_MSG_NEWCHAIN, NLM_F_CREATE, seq);
            chain_attrs(w, &tx.table, c);
        }
        (Op::Flush(_), Object::Chain(c)) => {
            begin(w, tx, NFT_MSG_DELRULE, 0, seq);
            w.attr_str(NFTA_RULE_TABLE, &tx.table);
            w.attr_str(NFTA_RULE_CHAIN, &c.name);
        }
        (Op::Delete(_), Object::Chain(c)) => {
            begin(w, tx, NFT_MSG_DELCHAIN, 0, seq);
            w.attr_str(NFTA_CHAIN_TABLE, &tx.table);
            w.attr_str(NFTA_CHAIN_NAME, &c.name);
        }
        (Op::Add(_), Object::Rule(r)) => {
            begin(w, tx, NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, seq);
            rule_attrs(w, &tx.table, tx.family, r);
        }
        (Op::Delete(_), Object::Rule(r)) if r.handle.is_some() => {
            begin(w, tx, NFT_MSG_DELRULE, 0, seq);
            w.attr_str(NFTA_RULE_TABLE, &tx.table);
            w.attr_str(NFTA_RULE_CHAIN, &r.chain);
            w.attr_be64(NFTA_RULE_HANDLE, r.handle.unwrap_or_default());
        }
        (Op::Flush(_) | Op::Delete(_), Object::Rule(r)) => {
            // Our rules have no identity of their own in our model: removing one means
            // rewriting its chain, so both verbs flush the chain.
            begin(w, tx, NFT_MSG_DELRULE, 0, seq);
            w.attr_str(NFTA_RULE_TABLE, &tx.table);
            w.attr_str(NFTA_RULE_CHAIN, &r.chain);
        }
        (Op::Add(_), Object::Set(s)) => {
            begin(w, tx, NFT_MSG_NEWSET, NLM_F_CREATE, seq);
            set_attrs(w, &tx.table, tx.family, s, seq);
        }
        (Op::Flush(_), Object::Set(s)) => {
            begin(w, tx, NFT_MSG_DELSETELEM, 0, seq);
            w.attr_str(NFTA_SET_ELEM_LIST_TABLE, &tx.table);
            w.attr_str(NFTA_SET_ELEM_LIST_SET, &s.name);
        }
        (Op::Delete(_), Object::Set(s)) => {
            begin(w, tx, NFT_MSG_DELSET, 0, seq);
            w.attr_str(NFTA_SET_TABLE, &tx.table);
            w.attr_str(NFTA_SET_NAME, &s.name);
        }
        (Op::Add(_), Object::Element(e)) => {
            begin(w, tx, NFT_MSG_NEWSETELEM, NLM_F_CREATE, seq);
            element_attrs(w, &tx.table, e, true);
        }
        (Op::Delete(_), Object::Element(e)) => {
            begin(w, tx, NFT_MSG_DELSETELEM, 0, seq);
            element_attrs(w, &tx.table, e, false);
        }
        (Op::Flush(_), Object::Element(e)) => {
            begin(w, tx, NFT_MSG_DELSETELEM, 0, seq);
            w.attr_str(NFTA_SET_ELEM_LIST_TABLE, &tx.table);
            w.attr_str(NFTA_SET_ELEM_LIST_SET, e.set());
        }
    }
    w.end_msg();
}

fn table_attrs(w: &mut MsgWriter, t: &Table) {
    w.attr_str(NFTA_TABLE_NAME, &t.name);
    w.attr_be32(NFTA_TABLE_FLAGS, 0);
    if let Some(c) = &t.comment {
        w.attr(NFTA_TABLE_USERDATA, &udata_comment(UDATA_COMMENT, c));
    }
}

fn chain_attrs(w: &mut MsgWriter, table: &str, c: &Chain) {
    w.attr_str(NFTA_CHAIN_TABLE, table);
    w.attr_str(NFTA_CHAIN_NAME, &c.name);
    if let Some(b) = &c.base {
        w.nest_start(NFTA_CHAIN_HOOK);
        w.attr_be32(NFTA_HOOK_HOOKNUM, b.hook.number());
        w.attr_be32(NFTA_HOOK_PRIORITY, b.priority as u32);
        w.nest_end();
        w.attr_be32(NFTA_CHAIN_POLICY, NF_ACCEPT as u32);
        w.attr_str(NFTA_CHAIN_TYPE, b.kind.name());
    }
    if let Some(cm) = &c.comment {
        w.attr(NFTA_CHAIN_USERDATA, &udata_comment(UDATA_COMMENT, cm));
    }
}

fn rule_attrs(w: &mut MsgWriter, table: &str, family: Family, r: &Rule) {
    w.attr_str(NFTA_RULE_TABLE, table);
    w.attr_str(NFTA_RULE_CHAIN, &r.chain);
    expressions_attr(w, &lower(&r.exprs, family));
    if let Some(c) = &r.comment {
        w.attr(NFTA_RULE_USERDATA, &udata_comment(UDATA_COMMENT, c));
    }
}

/// `NFTA_RULE_EXPRESSIONS`: one `NFTA_LIST_ELEM` (name + data) per kernel expression.
pub fn expressions_attr(w: &mut MsgWriter, kexprs: &[KExpr]) {
    w.nest_start(NFTA_RULE_EXPRESSIONS);
    for k in kexprs {
        w.nest_start(NFTA_LIST_ELEM);
        w.attr_str(NFTA_EXPR_NAME, k.name());
        w.nest_start(NFTA_EXPR_DATA);
        encode_kexpr(w, k);
        w.nest_end();
        w.nest_end();
    }
    w.nest_end();
}

/// A bare `NEWRULE` message in table "t", chain "c" holding `kexprs` (for codec tests).
#[cfg(test)]
pub fn rule_message(family: Family, kexprs: &[KExpr]) -> Vec<u8> {
    let mut w = MsgWriter::new();
    w.begin_msg(msg_type(NFT_MSG_NEWRULE), 0, 1);
    w.put_raw(&nfgenmsg(family.nfproto(), 0));
    w.attr_str(NFTA_RULE_TABLE, "t");
    w.attr_str(NFTA_RULE_CHAIN, "c");
    expressions_attr(&mut w, kexprs);
    w.end_msg();
    w.into_bytes()
}

fn set_attrs(w: &mut MsgWriter, table: &str, family: Family, s: &Set, set_id: u32) {
    w.attr_str(NFTA_SET_TABLE, table);
    w.attr_str(NFTA_SET_NAME, &s.name);
    let mut flags = 0;
    if s.map {
        flags |= NFT_SET_MAP;
    }
    if s.timeout.is_some() {
        flags |= NFT_SET_TIMEOUT | NFT_SET_EVAL;
    }
    if s.endpoints {
        // As nft creates `typeof numgen random mod 1 : ip daddr . tcp dport`: an integer
        // key in host byte order, address . port data, and the typeof description in the
        // user data (so `nft list` prints it the same way).
        w.attr_be32(NFTA_SET_FLAGS, NFT_SET_MAP);
        if s.key.is_empty() {
            w.attr_be32(NFTA_SET_KEY_TYPE, TYPE_INTEGER);
            w.attr_be32(NFTA_SET_KEY_LEN, 4);
        } else {
            w.attr_be32(NFTA_SET_KEY_TYPE, key_type(&s.key, family));
            w.attr_be32(NFTA_SET_KEY_LEN, key_len(&s.key, family));
        }
        w.attr_be32(
            NFTA_SET_DATA_TYPE,
            key_type(&[Field::Daddr, Field::Dport], family),
        );
        w.attr_be32(
            NFTA_SET_DATA_LEN,
            key_len(&[Field::Daddr, Field::Dport], family),
        );
        w.attr_be32(NFTA_SET_ID, set_id);
        if s.key.is_empty() {
            w.attr(NFTA_SET_USERDATA, endpoint_map_udata(family));
        } else if let Some(udata) = balance_map_udata(&s.key, family) {
            w.attr(NFTA_SET_USERDATA, &udata);
        }
        return;
    }
    w.attr_be32(NFTA_SET_FLAGS, flags);
    w.attr_be32(NFTA_SET_KEY_TYPE, key_type(&s.key, family));
    w.attr_be32(NFTA_SET_KEY_LEN, key_len(&s.key, family));
    if s.map {
        w.attr_be32(NFTA_SET_DATA_TYPE, NFT_DATA_VERDICT);
        // The kernel sizes verdict data itself but still expects the attribute (as nft sends).
        w.attr_be32(NFTA_SET_DATA_LEN, 0);
    }
    w.attr_be32(NFTA_SET_ID, set_id);
    if let Some(t) = s.timeout {
        w.attr_be64(NFTA_SET_TIMEOUT, t as u64 * 1000);
    }
    if let Some(c) = &s.comment {
        w.attr(NFTA_SET_USERDATA, &udata_comment(UDATA_SET_COMMENT, c));
    }
}

fn element_attrs(w: &mut MsgWriter, table: &str, e: &Element, with_data: bool) {
    w.attr_str(NFTA_SET_ELEM_LIST_TABLE, table);
    w.attr_str(NFTA_SET_ELEM_LIST_SET, e.set());
    w.nest_start(NFTA_SET_ELEM_LIST_ELEMENTS);
    element_entry(w, e, with_data);
    w.nest_end();
}

/// One `NFTA_LIST_ELEM` of an element list.
fn element_entry(w: &mut MsgWriter, e: &Element, with_data: bool) {
    w.nest_start(NFTA_LIST_ELEM);
    w.nest_start(NFTA_SET_ELEM_KEY);
    w.attr(NFTA_DATA_VALUE, &key_bytes(&e.key));
    w.nest_end();
    if with_data {
        match &e.data() {
            ElemData::Verdict(v) => {
                w.nest_start(NFTA_SET_ELEM_DATA);
                verdict_data(w, v);
                w.nest_end();
            }
            ElemData::Target(t) => {
                data_value(w, NFTA_SET_ELEM_DATA, &super::lower::target_bytes(t));
            }
            ElemData::None => {}
        }
        if let Some(c) = e.comment() {
            w.attr(NFTA_SET_ELEM_USERDATA, &udata_comment(UDATA_COMMENT, c));
        }
    }
    w.nest_end();
}

fn verdict_data(w: &mut MsgWriter, v: &Verdict) {
    w.nest_start(NFTA_DATA_VERDICT);
    let (code, chain) = match v {
        Verdict::Accept => (NF_ACCEPT, None),
        Verdict::Drop => (NF_DROP, None),
        Verdict::Return => (NFT_RETURN, None),
        Verdict::Jump(c) => (NFT_JUMP, Some(c)),
        Verdict::Goto(c) => (NFT_GOTO, Some(c)),
    };
    w.attr_be32(NFTA_VERDICT_CODE, code as u32);
    if let Some(c) = chain {
        w.attr_str(NFTA_VERDICT_CHAIN, c);
    }
    w.nest_end();
}

fn data_value(w: &mut MsgWriter, ty: u16, v: &[u8]) {
    w.nest_start(ty);
    w.attr(NFTA_DATA_VALUE, v);
    w.nest_end();
}

/// Encodes the `NFTA_EXPR_DATA` attributes of one kernel expression.
pub fn encode_kexpr(w: &mut MsgWriter, k: &KExpr) {
    match k {
        KExpr::Payload {
            base,
            offset,
            len,
            dreg,
        } => {
            w.attr_be32(1, *dreg);
            w.attr_be32(2, *base);
            w.attr_be32(3, *offset);
            w.attr_be32(4, *len);
        }
        KExpr::Meta { key, dreg } => {
            w.attr_be32(1, *dreg);
            w.attr_be32(2, *key);
        }
        KExpr::MetaSet { key, sreg } => {
            w.attr_be32(2, *key);
            w.attr_be32(3, *sreg);
        }
        KExpr::Ct { key, dreg } => {
            w.attr_be32(1, *dreg);
            w.attr_be32(2, *key);
        }
        KExpr::Fib {
            flags,
            result,
            dreg,
        } => {
            w.attr_be32(1, *dreg);
            w.attr_be32(2, *result);
            w.attr_be32(3, *flags);
        }
        KExpr::Numgen {
            modulus,
            offset,
            dreg,
        } => {
            w.attr_be32(1, *dreg);
            w.attr_be32(2, *modulus);
            w.attr_be32(3, super::uapi::NFT_NG_RANDOM);
            w.attr_be32(4, *offset);
        }
        KExpr::Hash {
            sreg,
            dreg,
            len,
            modulus,
            seed,
            offset,
        } => {
            // Every attribute, in nft's order: the seed always (without it the kernel draws
            // a random one per rule), the offset even when 0.
            w.attr_be32(NFTA_HASH_SREG, *sreg);
            w.attr_be32(NFTA_HASH_DREG, *dreg);
            w.attr_be32(NFTA_HASH_LEN, *len);
            w.attr_be32(NFTA_HASH_MODULUS, *modulus);
            w.attr_be32(NFTA_HASH_SEED, *seed);
            w.attr_be32(NFTA_HASH_OFFSET, *offset);
            w.attr_be32(NFTA_HASH_TYPE, NFT_HASH_JENKINS);
        }
        KExpr::Cmp { sreg, op, data } => {
            w.attr_be32(1, *sreg);
            w.attr_be32(2, *op);
            data_value(w, 3, data);
        }
        KExpr::Bitwise {
            sreg,
            dreg,
            mask,
            xor,
        } => {
            w.attr_be32(1, *sreg);
            w.attr_be32(2, *dreg);
            w.attr_be32(3, mask.len() as u32);
            data_value(w, 4, mask);
            data_value(w, 5, xor);
        }
        KExpr::Lookup {
            set,
            sreg,
            dreg,
            flags,
        } => {
            w.attr_str(1, set);
            w.attr_be32(2, *sreg);
            if let Some(d) = dreg {
                w.attr_be32(3, *d);
            }
            if *flags != 0 {
                w.attr_be32(5, *flags);
            }
        }
        KExpr::ImmData { dreg, data } => {
            w.attr_be32(1, *dreg);
            data_value(w, 2, data);
        }
        KExpr::ImmVerdict(v) => {
            w.attr_be32(1, super::uapi::REG_VERDICT);
            w.nest_start(2);
            verdict_data(w, v);
            w.nest_end();
        }
        KExpr::Nat {
            kind,
            family,
            reg_addr,
            reg_proto,
        } => {
            w.attr_be32(1, *kind);
            w.attr_be32(2, *family);
            w.attr_be32(3, *reg_addr);
            if let Some(p) = reg_proto {
                w.attr_be32(5, *p);
            }
        }
        KExpr::Masq { flags } => {
            if *flags != 0 {
                w.attr_be32(1, *flags);
            }
        }
        KExpr::Redir { reg_proto } => {
            // NFTA_REDIR_REG_PROTO_MIN; the kernel then sets NF_NAT_RANGE_PROTO_SPECIFIED.
            w.attr_be32(1, *reg_proto);
        }
        KExpr::Reject { kind, code } => {
            w.attr_be32(1, *kind);
            w.attr_u8(2, *code);
        }
        KExpr::Dynset { set, op, sreg_key } => {
            w.attr_str(1, set);
            w.attr_be32(3, *op);
            w.attr_be32(4, *sreg_key);
        }
        KExpr::Counter => {}
    }
}

/// A `NFT_MSG_GETGEN` request: its reply arrives after every error of a batch sent before
/// it on the same socket, so it serves as the batch's completion fence.
pub fn encode_getgen(seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    w.begin_msg(msg_type(NFT_MSG_GETGEN), NLM_F_REQUEST, seq);
    w.put_raw(&nfgenmsg(libc::AF_UNSPEC as u8, 0));
    w.end_msg();
    w.into_bytes()
}

/// A dump request (`GETCHAIN`, `GETSET`, `GETRULE`, `GETSETELEM`) for one table.
pub fn encode_dump(msg: u16, family: Family, table: &str, set: Option<&str>, seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    w.begin_msg(
        msg_type(msg),
        NLM_F_REQUEST | crate::kernel::netlink::msg::NLM_F_DUMP,
        seq,
    );
    w.put_raw(&nfgenmsg(family.nfproto(), 0));
    // Every GET* message puts the table name at attribute 1.
    w.attr_str(1, table);
    if let Some(s) = set {
        w.attr_str(NFTA_SET_ELEM_LIST_SET, s);
    }
    w.end_msg();
    w.into_bytes()
}

/// A `GETRULE` dump of one chain's rules (`NFTA_RULE_TABLE`, `NFTA_RULE_CHAIN`).
pub fn encode_rule_dump(family: Family, table: &str, chain: &str, seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    w.begin_msg(
        msg_type(NFT_MSG_GETRULE),
        NLM_F_REQUEST | crate::kernel::netlink::msg::NLM_F_DUMP,
        seq,
    );
    w.put_raw(&nfgenmsg(family.nfproto(), 0));
    w.attr_str(NFTA_RULE_TABLE, table);
    w.attr_str(NFTA_RULE_CHAIN, chain);
    w.end_msg();
    w.into_bytes()
}

/// A plain `GETTABLE` dump of a family (all tables).
pub fn encode_table_dump(family: Family, seq: u32) -> Vec<u8> {
    let mut w = MsgWriter::new();
    w.begin_msg(
        msg_type(NFT_MSG_GETTABLE),
        NLM_F_REQUEST | crate::kernel::netlink::msg::NLM_F_DUMP,
        seq,
    );
    w.put_raw(&nfgenmsg(family.nfproto(), 0));
    w.end_msg();
    w.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What nft 1.0.6 sends for `typeof ip daddr . meta l4proto . th dport . numgen random
    /// mod 7 : ip daddr . th dport` (read back from the kernel with `NFT_MSG_GETSET`): the
    /// template captured at N = 2 with N patched gives it byte for byte.
    #[test]
    fn balance_map_user_data_is_what_nft_sends_for_its_modulus() {
        let nft_mod_7 =
            "000400000000010400000000036000040d00000001580014000407000000010c00040c0000\
            0001040c000000010e00040900000001060004100000000214000407000000010c00040b00000001040200\
            0000031a0004170000000112000401000000010407000000020400000000043400040d000000012c001400\
            0407000000010c00040c00000001040c0000000114000407000000010c00040b0000000104020000000604\
            00000000";
        let key = [Field::Daddr, Field::L4Proto, Field::Dport, Field::Random(7)];
        let hex = |b: Vec<u8>| -> String { b.iter().map(|b| format!("{b:02x}")).collect() };
        let got = hex(balance_map_udata(&key, Family::Ip).unwrap());
        assert_eq!(got, nft_mod_7.replace(char::is_whitespace, ""));
        // `ip6 daddr`, N = 2, as nft sends it.
        let nft_ip6_mod_2 =
            "000400000000010400000000036000040d00000001580014000407000000010c00040d00000001040900\
            0000010e00040900000001060004100000000214000407000000010c00040b000000010402000000031a\
            0004170000000112000401000000010402000000020400000000043400040d000000012c001400040700\
            0000010c00040d0000000104090000000114000407000000010c00040b00000001040200000006040000\
            0000";
        let key6 = [Field::Daddr, Field::L4Proto, Field::Dport, Field::Random(2)];
        let got6 = hex(balance_map_udata(&key6, Family::Ip6).unwrap());
        assert_eq!(got6, nft_ip6_mod_2.replace(char::is_whitespace, ""));
        assert!(balance_map_udata(&key[..3], Family::Ip).is_none());
    }
    use crate::kernel::netlink::msg::{parse_msgs, Attrs};
    use crate::kernel::nft::{KeyValue, Transaction};

    #[test]
    fn sport_keys_are_inet_services() {
        assert_eq!(key_type(&[Field::Sport], Family::Ip), TYPE_INET_SERVICE);
        assert_eq!(
            key_type(&[Field::Saddr, Field::Sport], Family::Ip6),
            (TYPE_IP6ADDR << TYPE_BITS) | TYPE_INET_SERVICE
        );
        assert_eq!(key_len(&[Field::Sport], Family::Ip), 2);
        assert_eq!(key_len(&[Field::Saddr, Field::Sport], Family::Ip), 8);
    }

    fn el(set: &str, i: u8) -> Element {
        Element::new(
            set.into(),
            vec![KeyValue::Addr(std::net::Ipv4Addr::new(10, 0, 0, i).into())],
            ElemData::None,
            None,
        )
    }

    fn elements_per_message(b: &Batch) -> Vec<(u16, usize)> {
        parse_msgs(&b.bytes)
            .unwrap()
            .iter()
            .filter(|m| m.ty & 0xff == NFT_MSG_NEWSETELEM || m.ty & 0xff == NFT_MSG_DELSETELEM)
            .map(|m| {
                let list = Attrs::new(&m.payload[4..])
                    .get(NFTA_SET_ELEM_LIST_ELEMENTS)
                    .unwrap();
                (m.ty & 0xff, list.nested().count())
            })
            .collect()
    }

    #[test]
    fn consecutive_elements_of_a_set_share_a_message() {
        let mut tx = Transaction::new(Family::Ip, "t");
        for i in 0..3 {
            tx.add(el("a", i));
        }
        tx.add(el("b", 9));
        tx.delete(el("a", 1));
        tx.delete(el("a", 2));
        let b = encode_transaction(&tx, 1);
        assert_eq!(
            elements_per_message(&b),
            [
                (NFT_MSG_NEWSETELEM, 3),
                (NFT_MSG_NEWSETELEM, 1),
                (NFT_MSG_DELSETELEM, 2)
            ]
        );
        assert_eq!(b.descriptions[0], "add 3 elements of a");
        assert_eq!(b.describe(b.first_seq + 2), Some("add element of b"));
    }

    #[test]
    fn element_messages_stay_under_the_attribute_limit() {
        let mut tx = Transaction::new(Family::Ip, "t");
        for i in 0..5000u32 {
            let mut e = el("a", 0);
            e.key = [KeyValue::Addr(std::net::Ipv4Addr::from(i).into())].into();
            tx.add(e.with_comment(Some("ns/some-service:port".into())));
        }
        let per = elements_per_message(&encode_transaction(&tx, 1));
        assert!(per.len() > 1, "split: {per:?}");
        assert_eq!(per.iter().map(|(_, n)| n).sum::<usize>(), 5000);
        for m in parse_msgs(&encode_transaction(&tx, 1).bytes).unwrap() {
            assert!(
                m.payload.len() < 64 << 10,
                "a nested attribute holds at most 64 KiB"
            );
        }
    }
}
