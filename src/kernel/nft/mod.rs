//! A small typed model of the nftables objects kube-nlproxy owns (after sigs.k8s.io/knftables):
//! [`Table`], [`Chain`], [`Rule`] with typed [`Expr`]essions, [`Set`]s and maps, and
//! [`Element`]s, batched in a [`Transaction`]. Everything here is pure; `encode` lowers a
//! transaction to one nfnetlink batch, `render` prints it as `nft` syntax, `fake` applies it
//! in memory, and `netlink` (the only I/O file) sends it to the kernel.
//!
//! The path a new expression takes, file by file (each match over expression kinds names
//! every kind, with no catch-all arm, so the compiler lists the places left to do):
//! 1. [`Expr`] here: the typed form the proxiers build;
//! 2. `lower`: its kernel expressions ([`lower::KExpr`]; a new kernel expression also gets
//!    its `NFTA_EXPR_NAME` in `KExpr::name`);
//! 3. `encode`: their netlink attributes (byte tests against `nft --debug=netlink`);
//! 4. `decode`: the same attributes read back from the kernel;
//! 5. `render`: `nft` syntax (the golden files and the kernel-vs-`nft` differential tests);
//! 6. `live`: `canonical_rule`, which renumbers the registers it reads and writes, so
//!    that the kernel's rule and ours compare equal;
//! 7. `eval`: what it does to a packet (explain's machine);
//! 8. `trace`: how explain names it in a path;
//! 9. `fake`: what the in-memory kernel does with it.

pub mod decode;
pub mod encode;
pub mod eval;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod jhash;
pub mod key;
pub mod live;
pub mod lower;
pub mod monitor;
pub mod netlink;
pub(crate) mod plan_only;
#[cfg(test)]
mod proptests;
pub mod render;
#[cfg(any(test, feature = "testing"))]
pub mod trace;
pub mod transaction;
pub(crate) mod uapi;

use std::net::IpAddr;

pub use crate::model::net::{Cidr, Family};

#[cfg(any(test, feature = "testing"))]
pub use fake::FakeNftables;
pub use key::Key;
pub use plan_only::PlanOnly;
pub use transaction::{Object, Op, Transaction};

/// A table: the unit of ownership. We never touch a table we did not name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub family: Family,
    pub name: String,
    pub comment: Option<String>,
}

/// Chain type of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChainType {
    Filter,
    Nat,
}

impl ChainType {
    pub fn name(self) -> &'static str {
        match self {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
        }
    }
}

/// Netfilter hooks of the ip/ip6 families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

impl Hook {
    /// `NF_INET_*` hook number.
    pub fn number(self) -> u32 {
        match self {
            Hook::Prerouting => 0,
            Hook::Input => 1,
            Hook::Forward => 2,
            Hook::Output => 3,
            Hook::Postrouting => 4,
        }
    }
    pub fn from_number(n: u32) -> Option<Hook> {
        Some(match n {
            0 => Hook::Prerouting,
            1 => Hook::Input,
            2 => Hook::Forward,
            3 => Hook::Output,
            4 => Hook::Postrouting,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Hook::Prerouting => "prerouting",
            Hook::Input => "input",
            Hook::Forward => "forward",
            Hook::Output => "output",
            Hook::Postrouting => "postrouting",
        }
    }
}

/// What makes a chain a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BaseChain {
    pub kind: ChainType,
    pub hook: Hook,
    pub priority: i32,
}

/// A chain. Regular chains are only reached by jump/goto/vmap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    pub base: Option<BaseChain>,
    pub comment: Option<String>,
}

impl Chain {
    pub fn regular(name: impl Into<String>) -> Chain {
        Chain {
            name: name.into(),
            base: None,
            comment: None,
        }
    }
    pub fn base(name: impl Into<String>, kind: ChainType, hook: Hook, priority: i32) -> Chain {
        Chain {
            name: name.into(),
            base: Some(BaseChain {
                kind,
                hook,
                priority,
            }),
            comment: None,
        }
    }
}

/// A verdict: the end of a rule, or the data of a verdict-map element.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    Accept,
    Drop,
    Return,
    Jump(Name),
    Goto(Name),
}

impl Verdict {
    /// The chain this verdict refers to, if any.
    pub fn target(&self) -> Option<&str> {
        match self {
            Verdict::Jump(c) | Verdict::Goto(c) => Some(c),
            _ => None,
        }
    }
}

/// A packet field usable in matches, set keys and concatenations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    /// Source address of the table's family.
    Saddr,
    /// Destination address of the table's family.
    Daddr,
    /// `meta l4proto`.
    L4Proto,
    /// `th dport` (TCP, UDP, SCTP destination port).
    Dport,
    /// `th sport` (TCP, UDP, SCTP source port): a key component of [`Expr::DnatHash`].
    Sport,
    /// `numgen random mod N`: 0..N uniformly, a 32-bit integer in host byte order. Only as
    /// the last component of an endpoint map's key (see [`Expr::DnatLookup`]).
    Random(u32),
}

impl Field {
    /// Length of the field's value in bytes.
    pub fn len(self, family: Family) -> usize {
        match self {
            Field::Saddr | Field::Daddr => family.addr_len(),
            Field::L4Proto => 1,
            Field::Dport | Field::Sport => 2,
            Field::Random(_) => 4,
        }
    }
    /// Length rounded up to the 32-bit registers a concatenation uses.
    pub fn reg_len(self, family: Family) -> usize {
        (self.len(family) + 3) & !3
    }
}

/// One component of a set element's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyValue {
    Addr(IpAddr),
    Proto(u8),
    Port(u16),
    /// A slot of an endpoint map (a 32-bit integer in host byte order, as `numgen` yields).
    Slot(u32),
}

/// A named set, or a verdict map when `map` is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    pub name: String,
    /// The key: one field, or a concatenation.
    pub key: Vec<Field>,
    /// A verdict map (`type … : verdict`).
    pub map: bool,
    /// Element timeout in seconds; makes the set `flags dynamic,timeout` so rules may add to it.
    pub timeout: Option<u32>,
    pub comment: Option<String>,
    /// An endpoint map: key → address . port of the table's family, `map` false. With an
    /// empty `key` the key is a slot (a `numgen` value); otherwise the fields of `key`
    /// (see [`Expr::DnatLookup`]).
    pub endpoints: bool,
}

impl Set {
    pub fn plain(name: impl Into<String>, key: Vec<Field>) -> Set {
        Set {
            name: name.into(),
            key,
            map: false,
            timeout: None,
            comment: None,
            endpoints: false,
        }
    }
    /// An endpoint map (`typeof numgen random mod 1 : ip daddr . tcp dport`).
    pub fn endpoint_map(name: impl Into<String>) -> Set {
        Set {
            endpoints: true,
            ..Set::plain(name, vec![])
        }
    }
    /// An endpoint map keyed by packet fields
    /// (`type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service`).
    pub fn endpoint_map_by(name: impl Into<String>, key: Vec<Field>) -> Set {
        Set {
            endpoints: true,
            ..Set::plain(name, key)
        }
    }
    pub fn vmap(name: impl Into<String>, key: Vec<Field>) -> Set {
        Set {
            map: true,
            ..Set::plain(name, key)
        }
    }
}

/// A set, chain or comment name that many objects share: the ~220k elements of a 10k-service
/// ruleset name ~10 sets, ~10k chains and ~10k comments between them, so each is held once
/// and counted, not copied into every element.
pub type Name = crate::model::intern::ArcStr;

/// The shared [`Name`] of a set or other name that recurs across fragments (set names:
/// ~10, plus the endpoint maps, ≤ 256).
pub use crate::model::intern::shared as shared_name;

/// An element as the ruleset holds it, shared by the fragment that adds it and the index of
/// elements in force. `triomphe`'s `Arc` keeps one count, not a strong and a weak one: with a
/// 64-byte element the block is 72 bytes, which glibc's malloc serves from an 80-byte chunk
/// (~2.2M elements at 100k Services × 10 endpoints; issue #18).
pub type SharedElement = triomphe::Arc<Element>;

/// An element of a set or verdict map, in 64 bytes: its key inline, its DNAT target inline,
/// and what elements of one set mostly have in common (the set's name; no verdict, no
/// comment) behind one shared pointer. Fields of their own for the set, the verdict and the
/// comment took 80 bytes, a 96-byte chunk with the `Arc` around it: 16 bytes × 2.2M
/// elements at 100k × 10 is 35 MiB (issue #18).
#[derive(Clone, PartialEq, Eq)]
pub struct Element {
    head: triomphe::Arc<ElemHead>,
    pub key: Key,
    target: Option<Target>,
}

/// The part of an element that many elements share: every element of a plain set or an
/// endpoint map without a comment has the same one (one per set and thread, from
/// [`plain_head`]); a verdict map element, whose verdict and comment are its own, has its
/// own.
#[derive(Debug, PartialEq, Eq)]
struct ElemHead {
    set: Name,
    verdict: Option<Verdict>,
    comment: Option<Name>,
}

/// The shared head of the elements of `set` with no verdict and no comment, from a
/// per-thread cache: the last one used (elements come set by set), else a map by name.
/// A head that misses the cache is a separate but equal head, which costs memory, never
/// correctness.
fn plain_head(set: Name) -> triomphe::Arc<ElemHead> {
    type Heads = (
        Option<triomphe::Arc<ElemHead>>,
        crate::model::intern::BoundedCache<Name, triomphe::Arc<ElemHead>>,
    );
    thread_local! {
        static HEADS: std::cell::RefCell<Heads> = Default::default();
    }
    HEADS.with(|h| {
        let (last, by_name) = &mut *h.borrow_mut();
        if let Some(l) = last.as_ref().filter(|l| l.set == set) {
            return l.clone();
        }
        let head = by_name.get_or_insert(&set, || {
            let head = triomphe::Arc::new(ElemHead {
                set: set.clone(),
                verdict: None,
                comment: None,
            });
            (set.clone(), head)
        });
        *last = Some(head.clone());
        head
    })
}

/// What a set element maps its key to: nothing in a plain set, a verdict in a verdict map,
/// an endpoint in an endpoint map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElemData {
    /// An element of a plain set.
    None,
    /// An element of a verdict map.
    Verdict(Verdict),
    /// An element of an endpoint map: the DNAT target.
    Target(Target),
}

/// An endpoint map element's DNAT target: an address and a port in 19 bytes, aligned to one,
/// where a `SocketAddr` takes 32 (its IPv6 flow label and scope, which a DNAT target has no
/// use for) and an `IpAddr` and a `u16` 20: with it an element fits in 64 bytes (issue #18).
/// An IPv4 address is held in the first four bytes, the rest zero, so equal targets have
/// equal bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Target {
    addr: [u8; 16],
    port: [u8; 2],
    v6: bool,
}

impl Target {
    pub fn new(ip: IpAddr, port: u16) -> Target {
        let mut addr = [0; 16];
        let v6 = match ip {
            IpAddr::V4(a) => {
                addr[..4].copy_from_slice(&a.octets());
                false
            }
            IpAddr::V6(a) => {
                addr = a.octets();
                true
            }
        };
        Target {
            addr,
            port: port.to_ne_bytes(),
            v6,
        }
    }
    pub fn ip(&self) -> IpAddr {
        if self.v6 {
            IpAddr::from(self.addr)
        } else {
            IpAddr::from([self.addr[0], self.addr[1], self.addr[2], self.addr[3]])
        }
    }
    pub fn port(&self) -> u16 {
        u16::from_ne_bytes(self.port)
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("ip", &self.ip())
            .field("port", &self.port())
            .finish()
    }
}

impl From<std::net::SocketAddr> for Target {
    fn from(a: std::net::SocketAddr) -> Target {
        Target::new(a.ip(), a.port())
    }
}

impl From<Target> for std::net::SocketAddr {
    fn from(t: Target) -> std::net::SocketAddr {
        std::net::SocketAddr::new(t.ip(), t.port())
    }
}

impl Element {
    /// An element of `set` keyed by `key` that maps it to `data`, with an optional comment.
    pub fn new(set: Name, key: impl Into<Key>, data: ElemData, comment: Option<Name>) -> Element {
        let (verdict, target) = match data {
            ElemData::None => (None, None),
            ElemData::Verdict(v) => (Some(v), None),
            ElemData::Target(t) => (None, Some(t)),
        };
        let head = if verdict.is_none() && comment.is_none() {
            plain_head(set)
        } else {
            triomphe::Arc::new(ElemHead {
                set,
                verdict,
                comment,
            })
        };
        Element {
            head,
            key: key.into(),
            target,
        }
    }
    /// The set (or map) this element belongs to.
    pub fn set(&self) -> &Name {
        &self.head.set
    }
    pub fn comment(&self) -> Option<&Name> {
        self.head.comment.as_ref()
    }
    /// What the key maps to.
    pub fn data(&self) -> ElemData {
        match (self.target, &self.head.verdict) {
            (Some(t), _) => ElemData::Target(t),
            (None, Some(v)) => ElemData::Verdict(v.clone()),
            (None, None) => ElemData::None,
        }
    }
    /// The verdict, for verdict maps.
    pub fn verdict(&self) -> Option<&Verdict> {
        self.head.verdict.as_ref()
    }
    /// The endpoint, for endpoint maps.
    pub fn target(&self) -> Option<std::net::SocketAddr> {
        self.target.map(Into::into)
    }
    /// The same element with `comment` instead of its own.
    pub fn with_comment(&self, comment: Option<Name>) -> Element {
        Element::new(self.set().clone(), self.key, self.data(), comment)
    }
    /// Whether `o` maps its key to what this one does, with the same comment (the set and
    /// key aside).
    pub fn same_data(&self, o: &Element) -> bool {
        self.target == o.target
            && (triomphe::Arc::ptr_eq(&self.head, &o.head)
                || (self.head.verdict == o.head.verdict && self.head.comment == o.head.comment))
    }
}

/// As the struct with a field per part printed, before the parts moved behind a shared
/// pointer: logs and test failures read the same.
impl std::fmt::Debug for Element {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Element")
            .field("set", self.set())
            .field("key", &self.key)
            .field("data", &self.data())
            .field("comment", &self.comment())
            .finish()
    }
}

/// Comparison of a field with a value or prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Neq,
}

/// A typed rule expression: a match (which may end evaluation of the rule) or a statement.
/// Each lowers to one or more kernel expressions in [`lower`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    /// `ip saddr 10.0.0.0/8`, `ip daddr != 127.0.0.0/8`.
    Addr {
        field: Field,
        op: CmpOp,
        value: Cidr,
    },
    /// `meta l4proto tcp`.
    L4Proto(u8),
    /// `iifname "cni0"`, or with `prefix` `iifname "veth*"` (`!=` with `CmpOp::Neq`).
    IifName {
        name: String,
        prefix: bool,
        op: CmpOp,
    },
    /// `ip saddr . ip daddr @set` (or `!= @set`).
    InSet {
        key: Vec<Field>,
        set: String,
        negate: bool,
    },
    /// `ct state new`.
    CtStateNew,
    /// `ct state invalid`: conntrack could not make sense of the packet (an out-of-window
    /// TCP segment, an ACK for no connection with `nf_conntrack_tcp_loose` 0, …).
    CtStateInvalid,
    /// `ct status dnat`: the connection was destination-NATed.
    CtStatusDnat,
    /// `fib daddr type local` / `fib saddr type local`.
    FibLocal(Field),
    /// `meta mark & BIT == 0`.
    MarkBitClear(u32),
    /// `numgen random mod N == 0`: true with probability 1/N.
    NumgenZero(u32),
    /// `ip daddr . meta l4proto . th dport vmap @map`.
    Vmap { key: Vec<Field>, map: String },
    /// `meta mark set meta mark | BIT`.
    MarkOr(u32),
    /// `meta mark set meta mark ^ BIT`.
    MarkXor(u32),
    /// `masquerade [fully-random]`.
    Masquerade { fully_random: bool },
    /// `dnat to ADDR:PORT`.
    Dnat { addr: IpAddr, port: u16 },
    /// `dnat to numgen random mod MODULUS offset OFFSET map @MAP`: one of the endpoints in
    /// slots OFFSET..OFFSET+MODULUS of an endpoint map, uniformly.
    DnatMap {
        modulus: u32,
        offset: u32,
        map: String,
    },
    /// `dnat to jhash KEY mod MODULUS seed SEED offset OFFSET map @MAP`: the endpoint in slot
    /// OFFSET + reciprocal_scale(jhash(KEY's registers, their length, SEED), MODULUS) of an
    /// endpoint map keyed by slot (as [`Expr::DnatMap`] uses), so one flow always picks the
    /// same slot, on every node (Maglev). KEY is loaded as nft loads a concatenation, each
    /// field padded to 32 bits, and those bytes are hashed: 16 for `ip saddr . th sport .
    /// ip daddr . th dport`, 40 for ip6 (a lone field, as in nft, only its own bytes: 2
    /// for `th sport`); see [`jhash::nft_jhash`]. The seed is always sent: without
    /// `NFTA_HASH_SEED` the kernel draws a random seed per rule, and nodes would disagree
    /// on the slot.
    DnatHash {
        key: Vec<Field>,
        modulus: u32,
        seed: u32,
        offset: u32,
        map: String,
    },
    /// `dnat to KEY map @MAP`: to the endpoint that an endpoint map keyed by packet fields
    /// holds for the packet's KEY; no match when it holds none. A KEY ending in
    /// [`Field::Random`] picks one of N elements of the packet's address and port.
    DnatLookup { key: Vec<Field>, map: String },
    /// `redirect to :PORT`: to this host's address of the incoming interface (loopback for
    /// locally generated packets).
    Redirect { port: u16 },
    /// `reject` (ICMP port unreachable).
    Reject,
    /// `update @set { ip saddr }`: refresh or add the key with the set's timeout.
    UpdateSet { set: String, key: Field },
    /// `counter`.
    Counter,
    /// The rule's verdict.
    Verdict(Verdict),
}

impl Expr {
    /// Sets this expression reads or writes.
    pub fn set_ref(&self) -> Option<&str> {
        match self {
            Expr::InSet { set, .. } | Expr::UpdateSet { set, .. } => Some(set),
            Expr::Vmap { map, .. }
            | Expr::DnatMap { map, .. }
            | Expr::DnatHash { map, .. }
            | Expr::DnatLookup { map, .. } => Some(map),
            // Every other kind by name: a new one that reads a set must not compile here
            // as one that does not (the fake kernel's set checks rely on this).
            Expr::Addr { .. }
            | Expr::L4Proto(_)
            | Expr::IifName { .. }
            | Expr::CtStateNew
            | Expr::CtStateInvalid
            | Expr::CtStatusDnat
            | Expr::FibLocal(_)
            | Expr::MarkBitClear(_)
            | Expr::NumgenZero(_)
            | Expr::MarkOr(_)
            | Expr::MarkXor(_)
            | Expr::Masquerade { .. }
            | Expr::Dnat { .. }
            | Expr::Redirect { .. }
            | Expr::Reject
            | Expr::Counter
            | Expr::Verdict(_) => None,
        }
    }
    /// The chain this expression jumps to, if any.
    pub fn chain_ref(&self) -> Option<&str> {
        match self {
            Expr::Verdict(v) => v.target(),
            // Only a verdict names a chain; a vmap's chains are in its elements.
            _ => None,
        }
    }
}

/// A rule, appended to its chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub chain: String,
    pub exprs: Vec<Expr>,
    pub comment: Option<String>,
    /// The kernel's handle of an existing rule: `delete` then removes that one rule
    /// (another program's rule, at cleanup) instead of flushing the chain.
    pub handle: Option<u64>,
}

impl Rule {
    pub fn new(chain: impl Into<String>, exprs: Vec<Expr>) -> Rule {
        Rule {
            chain: chain.into(),
            exprs,
            comment: None,
            handle: None,
        }
    }
    /// An existing rule, by its kernel handle (for `delete`).
    pub fn by_handle(chain: impl Into<String>, handle: u64) -> Rule {
        Rule {
            handle: Some(handle),
            ..Rule::new(chain, Vec::new())
        }
    }
    pub fn with_comment(mut self, c: impl Into<String>) -> Rule {
        self.comment = Some(c.into());
        self
    }
}

pub use crate::model::net::proto;

/// An error applying or listing nftables state.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kernel (or the fake, imitating it) rejected an operation of a transaction; nothing
    /// of the transaction was applied.
    #[error("{op}: {}{}", std::io::Error::from_raw_os_error(*errno), reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default())]
    Rejected {
        /// The failing operation, e.g. `add rule in chain services`.
        op: String,
        errno: i32,
        reason: Option<String>,
    },
    /// The netlink transport failed.
    #[error(transparent)]
    Netlink(#[from] crate::kernel::netlink::Error),
    /// A kernel reply could not be decoded.
    #[error(transparent)]
    Decode(#[from] crate::kernel::netlink::DecodeError),
}

impl Error {
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Rejected { errno, .. } => Some(*errno),
            Error::Netlink(e) => e.errno(),
            Error::Decode(_) => None,
        }
    }
    pub fn is_not_found(&self) -> bool {
        self.errno() == Some(libc::ENOENT)
    }
    pub fn is_exists(&self) -> bool {
        self.errno() == Some(libc::EEXIST)
    }
    pub fn is_busy(&self) -> bool {
        self.errno() == Some(libc::EBUSY)
    }
}

/// What the proxy needs from nftables: apply a transaction atomically, and list the names of
/// what exists in one of its tables (to reconcile after a restart and clean up).
pub trait Nftables {
    /// Applies every operation of `tx`, or none of them.
    fn apply(&mut self, tx: &Transaction) -> Result<(), Error>;
    /// Tables of a family (name and comment).
    fn list_tables(&mut self, family: Family) -> Result<Vec<decode::ListedTable>, Error>;
    /// Chain names of a table; an absent table lists as empty.
    fn list_chains(&mut self, family: Family, table: &str) -> Result<Vec<String>, Error>;
    /// Set and map names of a table; an absent table lists as empty.
    fn list_sets(&mut self, family: Family, table: &str) -> Result<Vec<String>, Error>;
    /// Every rule of a table (any program's) by chain and handle, with the chains it jumps
    /// or goes to; expressions are not decoded beyond that, so foreign rules list too.
    fn list_rule_jumps(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Vec<decode::RuleJumps>, Error>;
}

#[cfg(test)]
mod element_tests {
    use super::*;

    fn key(a: &str) -> Key {
        [KeyValue::Addr(a.parse().unwrap())].into()
    }

    #[test]
    fn plain_elements_of_one_set_share_one_head_and_others_own_theirs() {
        let s = shared_name("cluster-ips");
        let a = Element::new(s.clone(), key("10.0.0.1"), ElemData::None, None);
        let b = Element::new("cluster-ips".into(), key("10.0.0.2"), ElemData::None, None);
        assert!(triomphe::Arc::ptr_eq(&a.head, &b.head));
        let other = Element::new("hairpin".into(), key("10.0.0.1"), ElemData::None, None);
        assert!(!triomphe::Arc::ptr_eq(&a.head, &other.head));
        assert_eq!(&**other.set(), "hairpin");
        let v = Element::new(
            s.clone(),
            key("10.0.0.3"),
            ElemData::Verdict(Verdict::Goto("svc".into())),
            Some("ns/svc:http".into()),
        );
        assert!(!triomphe::Arc::ptr_eq(&a.head, &v.head));
        assert_eq!(v.verdict(), Some(&Verdict::Goto("svc".into())));
        assert_eq!(v.comment().map(|c| &**c), Some("ns/svc:http"));
        assert_eq!(a.verdict(), None);
        assert_eq!(a.comment(), None);
    }

    #[test]
    fn data_reads_back_as_built_and_same_data_compares_all_of_it() {
        let t = Target::new("fd00::7".parse().unwrap(), 8443);
        for data in [
            ElemData::None,
            ElemData::Verdict(Verdict::Drop),
            ElemData::Target(t),
        ] {
            let e = Element::new("m".into(), key("10.0.0.1"), data.clone(), None);
            assert_eq!(e.data(), data);
            assert!(e.same_data(&e.clone()));
            let commented = e.with_comment(Some("c".into()));
            assert!(!e.same_data(&commented));
            assert_eq!(commented.data(), data);
        }
        let a = Element::new("m".into(), key("10.0.0.1"), ElemData::Target(t), None);
        let t2 = Target::new("fd00::7".parse().unwrap(), 8444);
        let b = Element::new("m".into(), key("10.0.0.1"), ElemData::Target(t2), None);
        assert!(!a.same_data(&b));
        assert_ne!(a, b);
        let text = format!("{a:?}");
        assert!(
            text.contains("set: \"m\"") && text.contains("8443"),
            "{text}"
        );
    }

    #[test]
    fn targets_round_trip_both_families_and_differ_by_family() {
        for (ip, port) in [("10.1.2.3", 80), ("fd00::1:2", 65535), ("0.0.0.0", 0)] {
            let ip: IpAddr = ip.parse().unwrap();
            let t = Target::new(ip, port);
            assert_eq!((t.ip(), t.port()), (ip, port));
        }
        // 0.0.0.0 and :: are both sixteen zero bytes here: the family keeps them apart.
        let v4 = Target::new("0.0.0.0".parse().unwrap(), 1);
        let v6 = Target::new("::".parse().unwrap(), 1);
        assert_ne!(v4, v6);
    }
}
