//! [`FakeNftables`]: an in-memory nftables that applies transactions atomically with the
//! kernel's existence and reference rules (missing objects, dangling jumps, deleting what is
//! still referenced), so unit tests can run whole syncs without root. A test-time twin of
//! the kernel: netlink-tests keep it honest by comparing against the real thing.

use std::collections::BTreeMap;

use libc::{EBUSY, EEXIST, EINVAL, ENOENT};

use super::decode::ListedTable;
use super::render;
use super::{
    Chain, Element, Error, Expr, Family, Field, KeyValue, Nftables, Object, Op, Rule, Set, Table,
    Transaction,
};

#[derive(Debug, Clone, PartialEq, Eq)]
struct FakeChain {
    chain: Chain,
    rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FakeSet {
    set: Set,
    elements: BTreeMap<super::Key, Element>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct FakeTable {
    comment: Option<String>,
    chains: BTreeMap<String, FakeChain>,
    sets: BTreeMap<String, FakeSet>,
}

/// An in-memory nftables.
#[derive(Debug, Clone, Default)]
pub struct FakeNftables {
    tables: BTreeMap<(Family, String), FakeTable>,
    /// The last transaction applied successfully.
    pub last_transaction: Option<Transaction>,
    /// Number of transactions applied successfully.
    pub applied: usize,
    /// When set, the next `apply` fails with this errno and changes nothing.
    pub fail_next: Option<i32>,
}

fn reject(op: &Op, errno: i32, why: &str) -> Error {
    Error::Rejected {
        op: format!("{} {}", op.verb(), op.object().describe()),
        errno,
        reason: Some(why.to_string()),
    }
}

impl FakeTable {
    fn apply_table_op(&mut self, op: &Op, tb: &Table) -> Result<(), Error> {
        match op {
            Op::Add(_) => self.comment = tb.comment.clone(),
            Op::Flush(_) => {
                for c in self.chains.values_mut() {
                    c.rules.clear();
                }
            }
            Op::Delete(_) => unreachable!("handled by apply"),
        }
        Ok(())
    }

    fn apply_chain_op(&mut self, op: &Op, c: &Chain) -> Result<(), Error> {
        match op {
            Op::Add(_) => match self.chains.get(&c.name) {
                Some(old) if old.chain.base != c.base => {
                    return Err(reject(op, EEXIST, "chain exists with another hook"))
                }
                Some(_) => {}
                None => {
                    let chain = FakeChain {
                        chain: c.clone(),
                        rules: vec![],
                    };
                    self.chains.insert(c.name.clone(), chain);
                }
            },
            Op::Flush(_) => self.chain_mut(op, &c.name)?.rules.clear(),
            Op::Delete(_) => {
                let fc = self.chain_mut(op, &c.name)?;
                if !fc.rules.is_empty() || self.chain_referenced(&c.name) {
                    return Err(reject(op, EBUSY, "chain is not empty or still referenced"));
                }
                self.chains.remove(&c.name);
            }
        }
        Ok(())
    }

    fn apply_rule_op(&mut self, op: &Op, r: &Rule, family: Family) -> Result<(), Error> {
        match op {
            Op::Add(_) => {
                self.chain_mut(op, &r.chain)?;
                for e in &r.exprs {
                    self.check_expr_refs(op, e, family)?;
                }
                self.chain_mut(op, &r.chain)?.rules.push(r.clone());
            }
            // Handles are the kernel's; only foreign rules are deleted by handle (cleanup),
            // and that is proven against the kernel.
            Op::Delete(_) if r.handle.is_some() => {
                return Err(reject(
                    op,
                    libc::EOPNOTSUPP,
                    "the fake does not model rule handles",
                ));
            }
            Op::Flush(_) | Op::Delete(_) => self.chain_mut(op, &r.chain)?.rules.clear(),
        }
        Ok(())
    }

    /// What the kernel checks of one expression of a rule being added: a valid hash, and
    /// that the chain it jumps to and the set it reads exist and fit.
    fn check_expr_refs(&self, op: &Op, e: &Expr, family: Family) -> Result<(), Error> {
        if let Some((errno, why)) = invalid_hash(e, family) {
            return Err(reject(op, errno, why));
        }
        if let Some(c) = e.chain_ref() {
            if !self.chains.contains_key(c) {
                return Err(reject(op, ENOENT, &format!("jump to missing chain {c}")));
            }
        }
        let Some(s) = e.set_ref() else {
            return Ok(());
        };
        let Some(fs) = self.sets.get(s) else {
            return Err(reject(op, ENOENT, &format!("no such set {s}")));
        };
        // A membership test may look in any set or map; a verdict or a NAT lookup needs
        // the map whose data it uses.
        let fits = match e {
            Expr::Vmap { .. } => fs.set.map,
            Expr::DnatMap { .. } | Expr::DnatHash { .. } => {
                fs.set.endpoints && fs.set.key.is_empty()
            }
            Expr::DnatLookup { key, .. } => fs.set.endpoints && fs.set.key == *key,
            Expr::InSet { key, .. } => !fs.set.endpoints || fs.set.key == *key,
            // An update writes the key into a plain (dynamic) set.
            Expr::UpdateSet { .. } => !fs.set.map && !fs.set.endpoints,
            // set_ref is None for every other kind.
            _ => unreachable!("{e:?} names no set"),
        };
        if !fits {
            return Err(reject(op, EINVAL, "set/map type mismatch"));
        }
        Ok(())
    }

    fn apply_set_op(&mut self, op: &Op, s: &Set) -> Result<(), Error> {
        match op {
            Op::Add(_) => match self.sets.get(&s.name) {
                Some(old)
                    if old.set.key != s.key
                        || old.set.map != s.map
                        || old.set.endpoints != s.endpoints
                        || old.set.timeout != s.timeout =>
                {
                    return Err(reject(op, EEXIST, "set exists with another definition"))
                }
                Some(_) => {}
                None => {
                    let set = FakeSet {
                        set: s.clone(),
                        elements: BTreeMap::new(),
                    };
                    self.sets.insert(s.name.clone(), set);
                }
            },
            Op::Flush(_) => self.set_mut(op, &s.name)?.elements.clear(),
            Op::Delete(_) => {
                self.set_mut(op, &s.name)?;
                if self.set_referenced(&s.name) {
                    return Err(reject(op, EBUSY, "set still referenced"));
                }
                self.sets.remove(&s.name);
            }
        }
        Ok(())
    }

    fn apply_element_op(&mut self, op: &Op, e: &Element) -> Result<(), Error> {
        match op {
            Op::Add(_) => {
                if let Some(c) = e.verdict().and_then(|v| v.target()) {
                    if !self.chains.contains_key(c) {
                        return Err(reject(op, ENOENT, &format!("verdict to missing chain {c}")));
                    }
                }
                let fs = self.set_mut(op, e.set())?;
                if !element_fits(&fs.set, e) {
                    return Err(reject(op, EINVAL, "element does not fit the set"));
                }
                match fs.elements.get(&e.key) {
                    Some(old) if old.data() != e.data() => {
                        return Err(reject(op, EEXIST, "element exists with other data"))
                    }
                    _ => {
                        fs.elements.insert(e.key, e.clone());
                    }
                }
            }
            Op::Delete(_) => {
                if self.set_mut(op, e.set())?.elements.remove(&e.key).is_none() {
                    return Err(reject(op, ENOENT, "no such element"));
                }
            }
            Op::Flush(_) => self.set_mut(op, e.set())?.elements.clear(),
        }
        Ok(())
    }

    fn chain_mut(&mut self, op: &Op, name: &str) -> Result<&mut FakeChain, Error> {
        self.chains
            .get_mut(name)
            .ok_or_else(|| reject(op, ENOENT, "no such chain"))
    }

    fn set_mut(&mut self, op: &Op, name: &str) -> Result<&mut FakeSet, Error> {
        self.sets
            .get_mut(name)
            .ok_or_else(|| reject(op, ENOENT, "no such set"))
    }

    fn chain_referenced(&self, name: &str) -> bool {
        self.chains
            .values()
            .flat_map(|c| &c.rules)
            .any(|r| r.exprs.iter().any(|e| e.chain_ref() == Some(name)))
            || self
                .sets
                .values()
                .flat_map(|s| s.elements.values())
                .any(|e| e.verdict().and_then(|v| v.target()) == Some(name))
    }
    fn set_referenced(&self, name: &str) -> bool {
        self.chains
            .values()
            .flat_map(|c| &c.rules)
            .any(|r| r.exprs.iter().any(|e| e.set_ref() == Some(name)))
    }
}

/// Why the kernel would refuse a `jhash` DNAT (`nft_jhash_init`), as an errno and a reason:
/// an empty key (`len` 0), a key past the last register, a modulus of 0, or slots past
/// `u32::MAX`.
fn invalid_hash(e: &Expr, family: Family) -> Option<(i32, &'static str)> {
    let Expr::DnatHash {
        key,
        modulus,
        offset,
        ..
    } = e
    else {
        return None;
    };
    // The key is loaded from NFT_REG32_04: 12 32-bit registers, 48 bytes, to the last.
    let len: usize = key.iter().map(|f| f.reg_len(family)).sum();
    if key.is_empty() || len > 48 {
        return Some((libc::ERANGE, "jhash key of 0 or more than 48 bytes"));
    }
    if *modulus == 0 {
        return Some((libc::ERANGE, "jhash modulus 0"));
    }
    if offset.checked_add(modulus - 1).is_none() {
        return Some((libc::EOVERFLOW, "jhash slots past 2^32"));
    }
    None
}

/// Whether an element's key and data fit its set: each key component of the kind its
/// field holds, as the kernel's key length and the set's typeof would require, and data
/// exactly where the set is a map.
fn element_fits(set: &Set, e: &Element) -> bool {
    let key_fits = if set.endpoints && set.key.is_empty() {
        matches!(e.key.to_vec()[..], [KeyValue::Slot(_)])
    } else {
        set.key.len() == e.key.len()
            && set.key.iter().zip(&e.key).all(|(f, k)| {
                matches!(
                    (f, k),
                    (Field::Saddr | Field::Daddr, KeyValue::Addr(_))
                        | (Field::L4Proto, KeyValue::Proto(_))
                        | (Field::Dport | Field::Sport, KeyValue::Port(_))
                        | (Field::Random(_), KeyValue::Slot(_))
                )
            })
    };
    key_fits && set.map == e.verdict().is_some() && set.endpoints == e.target().is_some()
}

impl FakeNftables {
    pub fn new() -> Self {
        Self::default()
    }

    /// One operation, as the kernel would apply it or refuse it (errno and reason).
    fn apply_op(t: &mut FakeTable, family: Family, op: &Op) -> Result<(), Error> {
        match op.object() {
            Object::Table(tb) => t.apply_table_op(op, tb),
            Object::Chain(c) => t.apply_chain_op(op, c),
            Object::Rule(r) => t.apply_rule_op(op, r, family),
            Object::Set(s) => t.apply_set_op(op, s),
            Object::Element(e) => t.apply_element_op(op, e),
        }
    }

    /// The rules of a chain, if it exists.
    pub fn rules(&self, family: Family, table: &str, chain: &str) -> Option<&[Rule]> {
        self.tables
            .get(&(family, table.to_string()))?
            .chains
            .get(chain)
            .map(|c| c.rules.as_slice())
    }

    /// The elements of a set, if it exists.
    pub fn elements(&self, family: Family, table: &str, set: &str) -> Option<Vec<&Element>> {
        Some(
            self.tables
                .get(&(family, table.to_string()))?
                .sets
                .get(set)?
                .elements
                .values()
                .collect(),
        )
    }

    /// Looks up a map element's verdict.
    pub fn lookup(
        &self,
        family: Family,
        table: &str,
        set: &str,
        key: &[KeyValue],
    ) -> Option<&Element> {
        self.tables
            .get(&(family, table.to_string()))?
            .sets
            .get(set)?
            .elements
            .get(&super::Key::try_from_values(key).ok()?)
    }

    pub fn has_table(&self, family: Family, table: &str) -> bool {
        self.tables.contains_key(&(family, table.to_string()))
    }

    /// A canonical listing of a table as `nft` commands (sorted), for golden comparisons.
    pub fn dump(&self, family: Family, table: &str) -> String {
        let Some(t) = self.tables.get(&(family, table.to_string())) else {
            return String::new();
        };
        let mut tx = Transaction::new(family, table);
        tx.add(super::Table {
            family,
            name: table.into(),
            comment: t.comment.clone(),
        });
        for s in t.sets.values() {
            tx.add(s.set.clone());
        }
        for c in t.chains.values() {
            tx.add(c.chain.clone());
        }
        for c in t.chains.values() {
            for r in &c.rules {
                tx.add(r.clone());
            }
        }
        for s in t.sets.values() {
            for e in s.elements.values() {
                tx.add(e.clone());
            }
        }
        render::transaction(&tx)
    }
}

impl Nftables for FakeNftables {
    fn apply(&mut self, tx: &Transaction) -> Result<(), Error> {
        if tx.is_empty() {
            return Ok(()); // as the netlink client: nothing is sent
        }
        if let Some(errno) = self.fail_next.take() {
            return Err(Error::Rejected {
                op: "injected failure".into(),
                errno,
                reason: None,
            });
        }
        let mut next = self.tables.clone();
        let key = (tx.family, tx.table.clone());
        for op in &tx.ops {
            match (op, op.object()) {
                (Op::Add(_), Object::Table(_)) => {
                    next.entry(key.clone()).or_default();
                }
                (Op::Delete(_), Object::Table(_)) => {
                    if next.remove(&key).is_none() {
                        return Err(reject(op, libc::ENOENT, "no such table"));
                    }
                    continue;
                }
                _ => {}
            }
            let t = next
                .get_mut(&key)
                .ok_or_else(|| reject(op, libc::ENOENT, "no such table"))?;
            Self::apply_op(t, tx.family, op)?;
        }
        self.tables = next;
        self.last_transaction = Some(tx.clone());
        self.applied += 1;
        Ok(())
    }

    fn list_tables(&mut self, family: Family) -> Result<Vec<ListedTable>, Error> {
        Ok(self
            .tables
            .iter()
            .filter(|((f, _), _)| *f == family)
            .map(|((f, n), t)| ListedTable {
                family: *f,
                name: n.clone(),
                comment: t.comment.clone(),
            })
            .collect())
    }

    fn list_chains(&mut self, family: Family, table: &str) -> Result<Vec<String>, Error> {
        Ok(self
            .tables
            .get(&(family, table.to_string()))
            .map(|t| t.chains.keys().cloned().collect())
            .unwrap_or_default())
    }

    fn list_sets(&mut self, family: Family, table: &str) -> Result<Vec<String>, Error> {
        Ok(self
            .tables
            .get(&(family, table.to_string()))
            .map(|t| t.sets.keys().cloned().collect())
            .unwrap_or_default())
    }

    fn list_rule_jumps(
        &mut self,
        family: Family,
        table: &str,
    ) -> Result<Vec<super::decode::RuleJumps>, Error> {
        let Some(t) = self.tables.get(&(family, table.to_string())) else {
            return Ok(vec![]);
        };
        Ok(t.chains
            .iter()
            .flat_map(|(name, c)| {
                c.rules
                    .iter()
                    .enumerate()
                    .map(move |(i, r)| super::decode::RuleJumps {
                        table: table.to_string(),
                        chain: name.clone(),
                        handle: i as u64 + 1,
                        targets: r
                            .exprs
                            .iter()
                            .filter_map(|e| e.chain_ref().map(str::to_string))
                            .collect(),
                    })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::nft::{ElemData, Field, Table, Verdict};

    fn base(tx: &mut Transaction) {
        tx.add(Table {
            family: Family::Ip,
            name: "t".into(),
            comment: None,
        });
        tx.add(Chain::regular("a"));
        tx.add(Chain::regular("b"));
        tx.add(Set::vmap("m", vec![Field::L4Proto, Field::Dport]));
    }

    #[test]
    fn failed_transaction_changes_nothing() {
        let mut f = FakeNftables::new();
        let mut tx = Transaction::new(Family::Ip, "t");
        base(&mut tx);
        f.apply(&tx).unwrap();
        let before = f.dump(Family::Ip, "t");
        let mut bad = Transaction::new(Family::Ip, "t");
        bad.add(Chain::regular("c"));
        bad.add(Rule::new(
            "c",
            vec![Expr::Verdict(Verdict::Goto("missing".into()))],
        ));
        let e = f.apply(&bad).unwrap_err();
        assert!(e.is_not_found(), "{e}");
        assert!(e.to_string().contains("rule in chain c"), "{e}");
        assert_eq!(f.dump(Family::Ip, "t"), before);
    }

    #[test]
    fn referenced_chain_cannot_be_deleted() {
        let mut f = FakeNftables::new();
        let mut tx = Transaction::new(Family::Ip, "t");
        base(&mut tx);
        tx.add(Element::new(
            "m".into(),
            vec![KeyValue::Proto(6), KeyValue::Port(80)],
            ElemData::Verdict(Verdict::Goto("b".into())),
            None,
        ));
        f.apply(&tx).unwrap();
        let mut del = Transaction::new(Family::Ip, "t");
        del.delete(Chain::regular("b"));
        assert!(f.apply(&del).unwrap_err().is_busy());
    }

    #[test]
    fn element_data_cannot_change_in_place() {
        let mut f = FakeNftables::new();
        let mut tx = Transaction::new(Family::Ip, "t");
        base(&mut tx);
        let e = Element::new(
            "m".into(),
            vec![KeyValue::Proto(6), KeyValue::Port(80)],
            ElemData::Verdict(Verdict::Goto("a".into())),
            None,
        );
        tx.add(e.clone());
        f.apply(&tx).unwrap();
        let e = Element::new(
            e.set().clone(),
            e.key,
            ElemData::Verdict(Verdict::Goto("b".into())),
            None,
        );
        let mut tx = Transaction::new(Family::Ip, "t");
        tx.add(e);
        assert!(f.apply(&tx).unwrap_err().is_exists());
    }

    /// A `jhash` DNAT needs a slot-keyed endpoint map (as `DnatMap`), and a rule the kernel
    /// would take (`nft_jhash_init`).
    #[test]
    fn a_jhash_dnat_needs_a_slot_map_and_a_valid_hash() {
        let mut f = FakeNftables::new();
        let mut tx = Transaction::new(Family::Ip, "t");
        base(&mut tx);
        tx.add(Set::endpoint_map("slots"));
        tx.add(Set::endpoint_map_by(
            "by-addr",
            vec![Field::Daddr, Field::L4Proto, Field::Dport],
        ));
        f.apply(&tx).unwrap();
        let hash = |key: Vec<Field>, modulus, offset, map: &str| {
            let mut tx = Transaction::new(Family::Ip, "t");
            tx.add(Rule::new(
                "a",
                vec![Expr::DnatHash {
                    key,
                    modulus,
                    seed: 1,
                    offset,
                    map: map.into(),
                }],
            ));
            tx
        };
        let maglev = || vec![Field::Saddr, Field::Sport, Field::Daddr, Field::Dport];
        let errno = |f: &mut FakeNftables, tx| f.apply(&tx).unwrap_err().errno();
        assert_eq!(errno(&mut f, hash(maglev(), 7, 0, "m")), Some(libc::EINVAL));
        assert_eq!(
            errno(&mut f, hash(maglev(), 7, 0, "by-addr")),
            Some(libc::EINVAL)
        );
        assert_eq!(
            errno(&mut f, hash(maglev(), 7, 0, "nope")),
            Some(libc::ENOENT)
        );
        assert_eq!(
            errno(&mut f, hash(vec![], 7, 0, "slots")),
            Some(libc::ERANGE)
        );
        assert_eq!(
            errno(&mut f, hash(maglev(), 0, 0, "slots")),
            Some(libc::ERANGE)
        );
        assert_eq!(
            errno(&mut f, hash(maglev(), 7, u32::MAX - 5, "slots")),
            Some(libc::EOVERFLOW)
        );
        // Past the last register: four IPv6 addresses are 64 bytes from NFT_REG32_04.
        let mut six = Transaction::new(Family::Ip6, "t");
        six.add(super::super::Table {
            family: Family::Ip6,
            name: "t".into(),
            comment: None,
        });
        six.add(Chain::regular("a"));
        six.add(Set::endpoint_map("slots"));
        six.ops
            .extend(hash(vec![Field::Saddr; 4], 7, 0, "slots").ops);
        assert_eq!(errno(&mut f, six), Some(libc::ERANGE));
        assert_eq!(f.applied, 1, "nothing of a refused transaction applied");
        f.apply(&hash(maglev(), 7, u32::MAX - 6, "slots")).unwrap();
        assert_eq!(f.rules(Family::Ip, "t", "a").unwrap().len(), 1);
        // The map is in use.
        let mut del = Transaction::new(Family::Ip, "t");
        del.delete(Set::endpoint_map("slots"));
        assert!(f.apply(&del).unwrap_err().is_busy());
    }
}
