//! A [`Transaction`]: an ordered list of operations on one table, applied atomically (one
//! nfnetlink batch). Verbs follow knftables: `add` (create or keep), `flush` (empty a chain
//! or set), `delete` (must exist).

use super::{Chain, Element, Family, Rule, Set, SharedElement, Table};

/// An object an operation acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Object {
    // Boxed: an operation is then 24 bytes, not 104, and a full sync at 100k × 10 holds
    // 2.2M of them (229 MB before).
    Table(Box<Table>),
    Chain(Box<Chain>),
    Rule(Box<Rule>),
    Set(Box<Set>),
    /// Shared with the ruleset that planned it: a full sync of 250k elements copies none.
    Element(SharedElement),
}

impl Object {
    /// A short description used in error messages ("chain services", "element of service-ips").
    pub fn describe(&self) -> String {
        match self {
            Object::Table(t) => format!("table {} {}", t.family, t.name),
            Object::Chain(c) => format!("chain {}", c.name),
            Object::Rule(r) => format!("rule in chain {}", r.chain),
            Object::Set(s) => format!(
                "{} {}",
                if s.map || s.endpoints { "map" } else { "set" },
                s.name
            ),
            Object::Element(e) => format!("element of {}", e.set()),
        }
    }
}

/// One operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Create the object, or leave it as it is when it exists (elements: same data required).
    Add(Object),
    /// Remove every rule of a chain, or every element of a set (the object must exist).
    Flush(Object),
    /// Delete the object (it must exist; a chain must be unreferenced).
    Delete(Object),
}

impl Op {
    pub fn object(&self) -> &Object {
        match self {
            Op::Add(o) | Op::Flush(o) | Op::Delete(o) => o,
        }
    }
    pub fn verb(&self) -> &'static str {
        match self {
            Op::Add(_) => "add",
            Op::Flush(_) => "flush",
            Op::Delete(_) => "delete",
        }
    }
}

/// Operations on one table, committed atomically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transaction {
    pub family: Family,
    pub table: String,
    pub ops: Vec<Op>,
    /// The batch asserts every object of the table (a full sync: each set and chain
    /// flushed and filled again), so whatever anyone changed in the table before it is
    /// overwritten. A partial batch leaves alone what it does not change.
    pub whole_table: bool,
}

impl Transaction {
    pub fn new(family: Family, table: impl Into<String>) -> Transaction {
        Transaction {
            family,
            table: table.into(),
            ops: Vec::new(),
            whole_table: false,
        }
    }
    pub fn add(&mut self, o: impl Into<Object>) {
        self.ops.push(Op::Add(o.into()));
    }
    pub fn flush(&mut self, o: impl Into<Object>) {
        self.ops.push(Op::Flush(o.into()));
    }
    pub fn delete(&mut self, o: impl Into<Object>) {
        self.ops.push(Op::Delete(o.into()));
    }
    /// Number of operations; partial-sync tests assert on it.
    pub fn num_ops(&self) -> usize {
        self.ops.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

impl From<Table> for Object {
    fn from(v: Table) -> Object {
        Object::Table(Box::new(v))
    }
}
impl From<Chain> for Object {
    fn from(v: Chain) -> Object {
        Object::Chain(Box::new(v))
    }
}
impl From<Rule> for Object {
    fn from(v: Rule) -> Object {
        Object::Rule(Box::new(v))
    }
}
impl From<Set> for Object {
    fn from(v: Set) -> Object {
        Object::Set(Box::new(v))
    }
}
impl From<Element> for Object {
    fn from(v: Element) -> Object {
        Object::Element(SharedElement::new(v))
    }
}
impl From<SharedElement> for Object {
    fn from(v: SharedElement) -> Object {
        Object::Element(v)
    }
}

#[cfg(test)]
mod size_tests {
    /// A full sync at 100k × 10 holds 2.2M operations: each stays a pointer and a tag.
    #[test]
    fn an_operation_is_a_few_words() {
        assert!(std::mem::size_of::<super::Op>() <= 24);
    }

    /// ~2.2M elements at 100k × 10, each in a [`super::SharedElement`]: 64 bytes of element
    /// and 8 of count take glibc's 80-byte chunk (request + 8, rounded up to 16); 1 more byte
    /// would make it 96.
    #[test]
    fn an_element_with_its_count_fits_an_80_byte_chunk() {
        assert_eq!(std::mem::size_of::<super::Element>(), 64);
        assert!(std::mem::size_of::<super::SharedElement>() == 8);
        assert_eq!(std::mem::size_of::<crate::kernel::nft::Target>(), 19);
        assert_eq!(
            std::mem::size_of::<Option<crate::kernel::nft::Target>>(),
            19
        );
    }
}
