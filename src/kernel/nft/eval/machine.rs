//! The nf_tables register machine over a [`LiveTable`](crate::kernel::nft::live::LiveTable):
//! one chain, rule and expression at a time, forking at each `numgen`, merging branches a
//! failed condition leaves identical. Pure.

use std::net::IpAddr;

use crate::kernel::nft::jhash::nft_jhash;
use crate::kernel::nft::live::{LiveChain, LiveData, LiveRule};
use crate::kernel::nft::lower::{loaded_field, KExpr};
use crate::kernel::nft::uapi::*;
use crate::kernel::nft::{Family, Verdict};

use super::{ChainEnd, End, Eval, Packet, RuleEnd, State, Step, MAX_BRANCHES, MAX_DEPTH};

/// Joins the branches of one rule that failed a condition into one per distinct state,
/// their probabilities summed. The registers and the rule's notes die with the rule, so a
/// `numgen random mod N == 0` leaves two branches, not N: without this, the affinity
/// layout's cascade of N such rules followed N! paths (70 endpoints ran out of memory).
fn merge_breaks(branches: Vec<(State, RuleEnd)>) -> Vec<(State, RuleEnd)> {
    let mut out: Vec<(State, RuleEnd)> = Vec::with_capacity(branches.len().min(8));
    let mut breaks: Vec<usize> = Vec::new();
    for (st, end) in branches {
        if matches!(end, RuleEnd::Break) {
            if let Some(&i) = breaks.iter().find(|&&i| out[i].0.same_after_rule(&st)) {
                out[i].0.prob += st.prob;
                continue;
            }
            breaks.push(out.len());
        }
        out.push((st, end));
    }
    out
}

impl State {
    /// Equal in everything that outlives the rule being run (not `prob`, `regs`, `notes`).
    fn same_after_rule(&self, o: &State) -> bool {
        self.pkt == o.pkt
            && self.verdict == o.verdict
            && self.steps == o.steps
            && self.dnat == o.dnat
            && self.redirect == o.redirect
            && self.masquerade == o.masquerade
            && self.dnatted == o.dnatted
            && self.updated_sets == o.updated_sets
    }
}

fn reg_offset(r: u32) -> Option<usize> {
    // 32-bit registers NFT_REG32_00 (8) .. NFT_REG32_15 (23), 4 bytes each.
    (REG32_00..REG32_00 + 16)
        .contains(&r)
        .then(|| ((r - REG32_00) * 4) as usize)
}

fn ip_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Writes `a` into `field` of a network header when it is of the header's family; an
/// address of the other family (a packet no table of this family would see) leaves the
/// field zero rather than panicking on the length.
fn put_addr(field: &mut [u8], a: IpAddr) {
    let b = ip_bytes(a);
    if b.len() == field.len() {
        field.copy_from_slice(&b);
    }
}

impl Eval<'_> {
    fn unknown(chain: &str, rule: &LiveRule, why: impl Into<String>) -> End {
        End::Unknown {
            chain: chain.to_string(),
            handle: rule.handle,
            why: why.into(),
        }
    }

    /// The network header of the packet as the kernel would see it (the fields rules read).
    fn network_header(&self, p: &Packet) -> Vec<u8> {
        match self.table.family {
            Family::Ip => {
                let mut h = vec![0u8; 20];
                h[0] = 0x45;
                h[8] = 64;
                h[9] = p.proto;
                put_addr(&mut h[12..16], p.saddr);
                put_addr(&mut h[16..20], p.daddr);
                h
            }
            Family::Ip6 => {
                let mut h = vec![0u8; 40];
                h[0] = 0x60;
                h[6] = p.proto;
                h[7] = 64;
                put_addr(&mut h[8..24], p.saddr);
                put_addr(&mut h[24..40], p.daddr);
                h
            }
        }
    }

    fn write(st: &mut State, dreg: u32, data: &[u8]) -> Result<(), String> {
        if dreg == REG_VERDICT {
            return Err("data written to the verdict register".into());
        }
        let off = reg_offset(dreg).ok_or_else(|| format!("register {dreg}"))?;
        if off + data.len() > st.regs.len() {
            return Err(format!("{} bytes past register {dreg}", data.len()));
        }
        // The kernel zeroes the rest of the last 32-bit register a short load touches.
        let end = (off + data.len()).div_ceil(4) * 4;
        st.regs[off..end].fill(0);
        st.regs[off..off + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn read(st: &State, sreg: u32, len: usize) -> Result<Vec<u8>, String> {
        let off = reg_offset(sreg).ok_or_else(|| format!("register {sreg}"))?;
        st.regs
            .get(off..off + len)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| format!("{len} bytes past register {sreg}"))
    }

    /// Runs the chain `name` for every state in `states`; returns each branch's end.
    fn chain(&self, name: &str, st: State, depth: usize) -> Vec<(State, ChainEnd)> {
        let Some(chain) = self.table.chains.get(name) else {
            return vec![(
                st,
                ChainEnd::Final(End::Unknown {
                    chain: name.to_string(),
                    handle: 0,
                    why: "jump to a chain that is not in the table".into(),
                }),
            )];
        };
        if depth > MAX_DEPTH {
            return vec![(
                st,
                ChainEnd::Final(End::Unknown {
                    chain: name.to_string(),
                    handle: 0,
                    why: format!("more than {MAX_DEPTH} nested jumps"),
                }),
            )];
        }
        self.rules(name, chain, 0, st, depth)
    }

    fn rules(
        &self,
        name: &str,
        chain: &LiveChain,
        i: usize,
        st: State,
        depth: usize,
    ) -> Vec<(State, ChainEnd)> {
        let Some(rule) = chain.rules.get(i) else {
            return vec![(st, ChainEnd::Continue)];
        };
        let exprs = match &rule.exprs {
            Ok(e) => e,
            Err(why) => {
                return vec![(
                    st,
                    ChainEnd::Final(Self::unknown(
                        name,
                        rule,
                        format!("rule not readable: {why}"),
                    )),
                )]
            }
        };
        let mut out = Vec::new();
        for (mut st, end) in merge_breaks(self.exprs(name, rule, exprs, st)) {
            match end {
                RuleEnd::Break => {
                    st.notes.clear();
                    out.extend(self.rules(name, chain, i + 1, st, depth))
                }
                RuleEnd::Final(e) => {
                    self.step(&mut st, name, rule, describe_final(&e));
                    out.push((st, ChainEnd::Final(e)))
                }
                RuleEnd::Accept => out.push((st, ChainEnd::Accept)),
                RuleEnd::Done => match st.verdict.take() {
                    None => {
                        self.step(&mut st, name, rule, String::new());
                        out.extend(self.rules(name, chain, i + 1, st, depth))
                    }
                    Some(v) => {
                        self.step(&mut st, name, rule, crate::kernel::nft::render::verdict(&v));
                        match v {
                            Verdict::Accept => out.push((st, ChainEnd::Accept)),
                            Verdict::Drop => out.push((
                                st,
                                ChainEnd::Final(End::Drop {
                                    chain: name.to_string(),
                                    handle: rule.handle,
                                }),
                            )),
                            Verdict::Return => out.push((st, ChainEnd::Continue)),
                            Verdict::Jump(c) => {
                                for (st, e) in self.chain(&c, st, depth + 1) {
                                    match e {
                                        ChainEnd::Continue => {
                                            out.extend(self.rules(name, chain, i + 1, st, depth))
                                        }
                                        e => out.push((st, e)),
                                    }
                                }
                            }
                            Verdict::Goto(c) => out.extend(self.chain(&c, st, depth + 1)),
                        }
                    }
                },
            }
        }
        out
    }

    fn step(&self, st: &mut State, chain: &str, rule: &LiveRule, action: String) {
        let mut parts = std::mem::take(&mut st.notes);
        if !action.is_empty() {
            parts.push(action);
        }
        let action = parts.join(", ");
        st.steps.push(Step {
            hook: self.hook.name(),
            chain: chain.to_string(),
            handle: rule.handle,
            comment: rule.comment.clone(),
            action,
        });
    }

    /// Runs a rule's expressions; a `numgen` forks the state.
    fn exprs(
        &self,
        chain: &str,
        rule: &LiveRule,
        exprs: &[KExpr],
        mut st: State,
    ) -> Vec<(State, RuleEnd)> {
        for (k, e) in exprs.iter().enumerate() {
            let r = match e {
                KExpr::Numgen {
                    modulus,
                    offset,
                    dreg,
                } => {
                    if *modulus == 0 || *modulus > MAX_BRANCHES {
                        // A foreign rule could ask for any modulus; each value is a branch.
                        let why = format!(
                            "numgen mod {modulus}: 1 to {MAX_BRANCHES} branches are followed"
                        );
                        return vec![(st, RuleEnd::Final(Self::unknown(chain, rule, why)))];
                    }
                    let mut out = Vec::new();
                    for v in 0..*modulus {
                        let mut b = st.clone();
                        b.prob /= f64::from(*modulus);
                        let val = offset.wrapping_add(v);
                        if let Err(why) = Self::write(&mut b, *dreg, &val.to_ne_bytes()) {
                            out.push((b, RuleEnd::Final(Self::unknown(chain, rule, why))));
                            continue;
                        }
                        out.extend(self.exprs(chain, rule, &exprs[k + 1..], b));
                    }
                    return out;
                }
                // No fork: the kernel's hash is a function of the packet, computed here as
                // it computes it, so the branch goes on with the very slot it picks.
                KExpr::Hash { .. } => self.hash(e, &exprs[..k], &mut st),
                e => self.expr(e, &mut st),
            };
            match r {
                Ok(Flow::Next) => {}
                Ok(Flow::Break) => return vec![(st, RuleEnd::Break)],
                Ok(Flow::Accept(action)) => {
                    self.step(&mut st, chain, rule, action);
                    return vec![(st, RuleEnd::Accept)];
                }
                Ok(Flow::Reject) => {
                    let end = End::Reject {
                        chain: chain.to_string(),
                        handle: rule.handle,
                    };
                    return vec![(st, RuleEnd::Final(end))];
                }
                Err(why) => {
                    return vec![(st, RuleEnd::Final(Self::unknown(chain, rule, why)))];
                }
            }
        }
        vec![(st, RuleEnd::Done)]
    }

    fn expr(&self, e: &KExpr, st: &mut State) -> Result<Flow, String> {
        match e {
            KExpr::Payload {
                base,
                offset,
                len,
                dreg,
            } => {
                let hdr = match *base {
                    NFT_PAYLOAD_NETWORK_HEADER => self.network_header(&st.pkt),
                    NFT_PAYLOAD_TRANSPORT_HEADER => {
                        let mut h = vec![0u8; 8];
                        h[0..2].copy_from_slice(&st.pkt.sport.to_be_bytes());
                        h[2..4].copy_from_slice(&st.pkt.dport.to_be_bytes());
                        h
                    }
                    b => return Err(format!("payload base {b}")),
                };
                let (o, l) = (*offset as usize, *len as usize);
                let data = hdr
                    .get(o..o + l)
                    .ok_or_else(|| format!("payload @{base},{offset},{len}"))?
                    .to_vec();
                Self::write(st, *dreg, &data)?;
            }
            KExpr::Meta { key, dreg } => {
                let data = match *key {
                    NFT_META_MARK => st.pkt.mark.to_ne_bytes().to_vec(),
                    NFT_META_L4PROTO => vec![st.pkt.proto],
                    NFT_META_IIFNAME => {
                        // IFNAMSIZ bytes, NUL-padded; empty for locally generated packets.
                        let mut n = st.pkt.iif.clone().unwrap_or_default().into_bytes();
                        n.resize(16, 0);
                        n
                    }
                    NFT_META_NFPROTO => vec![self.table.family.nfproto()],
                    k => return Err(format!("meta key {k}")),
                };
                Self::write(st, *dreg, &data)?;
            }
            KExpr::MetaSet { key, sreg } => {
                if *key != NFT_META_MARK {
                    return Err(format!("meta set key {key}"));
                }
                let v = Self::read(st, *sreg, 4)?;
                let mark = u32::from_ne_bytes([v[0], v[1], v[2], v[3]]);
                st.pkt.mark = mark;
                st.notes.push(format!("mark set {mark:#x}"));
            }
            KExpr::Ct { key, dreg } => {
                let v = match *key {
                    NFT_CT_STATE => CT_STATE_NEW,
                    NFT_CT_STATUS => {
                        if st.dnatted {
                            CT_STATUS_DNAT
                        } else {
                            0
                        }
                    }
                    k => return Err(format!("ct key {k}")),
                };
                Self::write(st, *dreg, &v.to_ne_bytes())?;
            }
            KExpr::Fib {
                flags,
                result,
                dreg,
            } => {
                if *result != NFT_FIB_RESULT_ADDRTYPE {
                    return Err(format!("fib result {result}"));
                }
                let a = match flags & (NFTA_FIB_F_SADDR | NFTA_FIB_F_DADDR) {
                    NFTA_FIB_F_SADDR => st.pkt.saddr,
                    NFTA_FIB_F_DADDR => st.pkt.daddr,
                    _ => return Err(format!("fib flags {flags:#x}")),
                };
                if flags & !(NFTA_FIB_F_SADDR | NFTA_FIB_F_DADDR) != 0 {
                    return Err(format!("fib flags {flags:#x}"));
                }
                // RTN_LOCAL or RTN_UNICAST.
                let t: u32 = if self.host.is_local(a) { RTN_LOCAL } else { 1 };
                Self::write(st, *dreg, &t.to_ne_bytes())?;
            }
            KExpr::Cmp { sreg, op, data } => {
                let v = Self::read(st, *sreg, data.len())?;
                let ord = v.as_slice().cmp(data.as_slice());
                use std::cmp::Ordering::*;
                let ok = match op {
                    0 => ord == Equal,
                    1 => ord != Equal,
                    2 => ord == Less,
                    3 => ord != Greater,
                    4 => ord == Greater,
                    5 => ord != Less,
                    o => return Err(format!("cmp op {o}")),
                };
                if !ok {
                    return Ok(Flow::Break);
                }
            }
            KExpr::Bitwise {
                sreg,
                dreg,
                mask,
                xor,
            } => {
                if mask.len() != xor.len() {
                    return Err("bitwise mask and xor of different lengths".into());
                }
                let v = Self::read(st, *sreg, mask.len())?;
                let out: Vec<u8> = v
                    .iter()
                    .zip(mask)
                    .zip(xor)
                    .map(|((v, m), x)| (v & m) ^ x)
                    .collect();
                Self::write(st, *dreg, &out)?;
            }
            KExpr::Lookup {
                set,
                sreg,
                dreg,
                flags,
            } => {
                let s = self
                    .table
                    .sets
                    .get(set)
                    .ok_or_else(|| format!("lookup in set {set}, which is not in the table"))?;
                if s.flags & NFT_SET_INTERVAL != 0 {
                    return Err(format!("lookup in interval set {set}"));
                }
                let key = Self::read(st, *sreg, s.key_len as usize)?;
                let found = s.elements.get(&key);
                if let (Some(_), Some(c)) = (found, s.comments.get(&key)) {
                    st.notes.push(format!("@{set} element {c:?}"));
                }
                match dreg {
                    None => {
                        if found.is_some() == (flags & NFT_LOOKUP_F_INV != 0) {
                            return Ok(Flow::Break);
                        }
                    }
                    Some(d) => match found {
                        None => return Ok(Flow::Break),
                        Some(LiveData::Verdict(v)) if *d == REG_VERDICT => {
                            st.verdict = Some(v.clone())
                        }
                        Some(LiveData::Value(v)) if *d != REG_VERDICT => Self::write(st, *d, v)?,
                        Some(_) => return Err(format!("map {set}: data of another kind")),
                    },
                }
            }
            KExpr::ImmData { dreg, data } => Self::write(st, *dreg, data)?,
            KExpr::ImmVerdict(v) => st.verdict = Some(v.clone()),
            KExpr::Nat {
                kind,
                family,
                reg_addr,
                reg_proto,
            } => {
                if *kind != NFT_NAT_DNAT {
                    return Err(format!("nat type {kind}"));
                }
                if u32::from(self.table.family.nfproto()) != *family {
                    return Err(format!("nat family {family}"));
                }
                let len = self.table.family.addr_len();
                let a = Self::read(st, *reg_addr, len)?;
                let addr = match self.table.family {
                    Family::Ip => {
                        IpAddr::from(<[u8; 4]>::try_from(a.as_slice()).unwrap_or_default())
                    }
                    Family::Ip6 => {
                        IpAddr::from(<[u8; 16]>::try_from(a.as_slice()).unwrap_or_default())
                    }
                };
                let port = match reg_proto {
                    Some(r) => {
                        let p = Self::read(st, *r, 2)?;
                        u16::from_be_bytes([p[0], p[1]])
                    }
                    None => st.pkt.dport,
                };
                st.pkt.daddr = addr;
                st.pkt.dport = port;
                st.dnat = Some((addr, port));
                st.dnatted = true;
                return Ok(Flow::Accept(format!("dnat to {}", sockaddr(addr, port))));
            }
            KExpr::Masq { .. } => {
                st.masquerade = true;
                return Ok(Flow::Accept("masquerade".into()));
            }
            KExpr::Redir { reg_proto } => {
                let p = Self::read(st, *reg_proto, 2)?;
                let port = u16::from_be_bytes([p[0], p[1]]);
                st.redirect = Some(port);
                st.pkt.dport = port;
                st.pkt.daddr = match (self.table.family, &st.pkt.iif) {
                    (Family::Ip, None) => IpAddr::from([127, 0, 0, 1]),
                    (Family::Ip6, None) => "::1".parse().unwrap_or(st.pkt.daddr),
                    // To the incoming interface's address: local either way.
                    _ => self
                        .host
                        .local_addrs
                        .first()
                        .copied()
                        .unwrap_or(st.pkt.daddr),
                };
                return Ok(Flow::Accept(format!("redirect to :{port}")));
            }
            KExpr::Reject { .. } => return Ok(Flow::Reject),
            KExpr::Dynset { set, op, .. } => {
                if !self.table.sets.contains_key(set) {
                    return Err(format!("update of set {set}, which is not in the table"));
                }
                if *op != NFT_DYNSET_OP_UPDATE && *op != 0 {
                    return Err(format!("dynset op {op}"));
                }
                st.updated_sets.push(set.clone());
                st.notes.push(format!("update @{set}"));
            }
            KExpr::Counter => {}
            KExpr::Numgen { .. } => unreachable!("numgen forks in exprs()"),
            KExpr::Hash { .. } => unreachable!("hash is run by exprs(), which knows its key"),
        }
        Ok(Flow::Next)
    }

    /// `jhash`: `nft_jhash_eval` over the key registers, the padding bytes included (the
    /// kernel zeroes them on each load, as [`Self::write`] does). Notes the hash and the
    /// slot, the key named by the loads before it in the rule (`before`).
    fn hash(&self, e: &KExpr, before: &[KExpr], st: &mut State) -> Result<Flow, String> {
        let KExpr::Hash {
            sreg,
            dreg,
            len,
            modulus,
            seed,
            offset,
        } = e
        else {
            return Err(format!("not a hash: {e:?}"));
        };
        let key = Self::read(st, *sreg, *len as usize)?;
        let slot = nft_jhash(&key, *modulus, *seed, *offset);
        Self::write(st, *dreg, &slot.to_ne_bytes())?;
        st.notes.push(format!(
            "jhash {} mod {modulus} = {} → slot {slot}",
            self.key_text(before, *sreg, *len),
            slot.wrapping_sub(*offset)
        ));
        Ok(Flow::Next)
    }

    /// The fields in registers `sreg`.. (`len` bytes) as nft names them (`ip saddr . th
    /// sport`), from the last load into each before the hash; `reg N` for a register no
    /// field of ours was loaded into.
    fn key_text(&self, before: &[KExpr], sreg: u32, len: u32) -> String {
        let family = self.table.family;
        let end = sreg.saturating_add(len.div_ceil(4));
        let mut parts = Vec::new();
        let mut r = sreg;
        while r < end {
            let field = before
                .iter()
                .rev()
                .filter_map(|k| loaded_field(k, family))
                .find(|(_, dreg)| *dreg == r)
                .map(|(f, _)| f);
            match field {
                Some(f) => {
                    parts.push(crate::kernel::nft::render::field(f, family));
                    r += (f.reg_len(family) / 4) as u32;
                }
                None => {
                    parts.push(format!("reg {r}"));
                    r += 1;
                }
            }
        }
        parts.join(" . ")
    }

    /// Every base chain of this hook, in priority order; accept moves on to the next one.
    pub(super) fn hook(&self, states: Vec<State>) -> Vec<(State, Option<End>)> {
        let mut live: Vec<State> = states;
        let mut done = Vec::new();
        for (name, _) in self.table.base_chains(self.hook) {
            let mut next = Vec::new();
            for st in live {
                for (st, e) in self.chain(name, st, 0) {
                    match e {
                        ChainEnd::Continue | ChainEnd::Accept => next.push(st),
                        ChainEnd::Final(e) => done.push((st, Some(e))),
                    }
                }
            }
            live = next;
        }
        done.extend(live.into_iter().map(|s| (s, None)));
        done
    }
}

enum Flow {
    Next,
    Break,
    /// A NAT statement: it sets the chain's verdict to accept.
    Accept(String),
    Reject,
}

fn describe_final(e: &End) -> String {
    match e {
        End::Reject { .. } => "reject".into(),
        End::Drop { .. } => "drop".into(),
        End::Unknown { why, .. } => format!("not evaluated: {why}"),
        End::Accept { .. } => "accept".into(),
    }
}

fn sockaddr(a: IpAddr, port: u16) -> String {
    match a {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}
