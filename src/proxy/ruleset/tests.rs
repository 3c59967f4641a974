//! Unit tests of the ruleset, its element index and the planners (pure); the fixtures
//! (`spn`, `service`, `ruleset`) are shared with `table_sync`'s tests.

use super::*;
use crate::kernel::nft::{ElemData, Expr, Field, Key, KeyValue, Op, Transaction, Verdict};
use crate::model::Protocol;

pub(crate) fn spn(name: &str) -> ServicePortName {
    ServicePortName {
        namespace: "ns".into(),
        name: name.into(),
        port: "p".into(),
        protocol: Protocol::Tcp,
    }
}

/// A base with a dispatch chain and one set of service addresses.
pub(crate) fn base() -> Fragment {
    let mut f = Fragment::default();
    f.chain(
        Chain::regular("services"),
        vec![Rule::new("services", vec![Expr::Verdict(Verdict::Accept)])],
    );
    f.set(Set::plain("ips", vec![Field::Daddr]));
    f
}

pub(crate) fn element(addr: &str) -> Element {
    Element::new(
        "ips".into(),
        vec![KeyValue::Addr(addr.parse().unwrap())],
        ElemData::None,
        None,
    )
}

/// A service port: its own chain and its address in the shared set.
pub(crate) fn service(name: &str, addr: &str) -> Arc<Fragment> {
    let mut f = Fragment::default();
    let chain = format!("svc-{name}");
    f.chain(
        Chain::regular(&chain),
        vec![Rule::new(&chain, vec![Expr::Reject])],
    );
    f.element(element(addr));
    Arc::new(f)
}

pub(crate) fn ruleset(services: &[(&str, &str)]) -> Ruleset {
    let table = Table {
        family: Family::Ip,
        name: "t".into(),
        comment: None,
    };
    let mut rs = Ruleset::new(table, base());
    for (n, a) in services {
        rs.set_service(&spn(n), Some(service(n, a)));
    }
    rs
}

#[test]
fn the_index_shares_each_element_with_its_fragment() {
    // Memory: an element lives once, in its fragment; the index points at it.
    let rs = ruleset(&[("a", "10.0.0.1"), ("b", "10.0.0.2")]);
    for (name, f) in &rs.services {
        let e = &f.elements[0];
        let in_force = rs.index.in_force(&key_of(e)).expect("indexed");
        assert!(
            SharedElement::ptr_eq(in_force, e),
            "{name}: a copy, not the fragment's element"
        );
    }
    assert_eq!(rs.element_count(), 2);
}

fn verbs(tx: &Transaction) -> Vec<String> {
    tx.ops
        .iter()
        .map(|o| format!("{} {}", o.verb(), o.object().describe()))
        .collect()
}

#[test]
fn an_element_two_fragments_add_stays_until_both_are_gone() {
    let mut rs = ruleset(&[("a", "10.0.0.1"), ("b", "10.0.0.1")]);
    assert_eq!(rs.element_count(), 1);
    assert_eq!(rs.rule_count(), 3);
    let prev = rs.clone();
    rs.set_service(&spn("a"), None);
    let p = plan_transaction(Some(&prev), &rs, None, &[]);
    assert!(
        !verbs(&p.tx).iter().any(|v| v.starts_with("delete element")),
        "b still adds the element: {:?}",
        verbs(&p.tx)
    );
    assert_eq!(
        p.stale_chains,
        ["svc-a"],
        "a's chain is flushed, deleted next time"
    );
    let prev = rs.clone();
    rs.set_service(&spn("b"), None);
    let p = plan_transaction(Some(&prev), &rs, None, &[]);
    assert!(verbs(&p.tx).contains(&"delete element of ips".to_string()));
    assert_eq!(rs.element_count(), 0);
}

#[test]
fn the_index_keeps_counts_only_for_keys_with_several_contributors() {
    let mut rs = ruleset(&[("a", "10.0.0.1"), ("b", "10.0.0.1"), ("c", "10.0.0.2")]);
    assert_eq!(rs.element_count(), 2);
    let shared_key = key_of(&rs.services[&spn("a")].elements[0]);
    let own_key = key_of(&rs.services[&spn("c")].elements[0]);
    assert_eq!(
        rs.index.shared.len(),
        1,
        "only 10.0.0.1 has two contributors"
    );
    assert_eq!(rs.index.get(&shared_key).unwrap().1.count, 2);
    assert_eq!(rs.index.get(&own_key).unwrap().1, Slot::ONE);
    rs.set_service(&spn("b"), None);
    assert!(rs.index.shared.is_empty(), "back to one contributor");
    assert_eq!(rs.index.get(&shared_key).unwrap().1, Slot::ONE);
    // Two owners that disagree: counted and marked until one is left.
    let mut rs = ruleset(&[]);
    rs.set_service(&spn("a"), Some(claim("a", "1.2.3.4")));
    rs.set_service(&spn("b"), Some(claim("b", "1.2.3.4")));
    // Each claim adds the address to `ips` (the same data) and to `vm` (its own chain).
    let k = key_of(&rs.services[&spn("a")].elements[1]);
    let (in_force, slot) = rs.index.get(&k).unwrap();
    assert!(SharedElement::ptr_eq(
        in_force,
        &rs.services[&spn("a")].elements[1]
    ));
    assert_eq!((slot.count, slot.mixed), (2, true));
    rs.set_service(&spn("a"), None);
    let (in_force, slot) = rs.index.get(&k).unwrap();
    assert!(SharedElement::ptr_eq(
        in_force,
        &rs.services[&spn("b")].elements[1]
    ));
    assert_eq!(slot, Slot::ONE);
    assert!(rs.index.shared.is_empty());
    rs.set_service(&spn("b"), None);
    assert!(rs.index.get(&k).is_none() && rs.element_count() == 0);
}

#[test]
fn no_change_plans_an_empty_transaction() {
    let rs = ruleset(&[("a", "10.0.0.1")]);
    let p = plan_transaction(Some(&rs), &rs.clone(), None, &[]);
    assert!(p.tx.ops.is_empty(), "{:?}", verbs(&p.tx));
    assert!(p.stale_chains.is_empty());
}

#[test]
fn a_full_plan_flushes_what_the_kernel_has_and_clears_leftovers() {
    let rs = ruleset(&[("a", "10.0.0.1")]);
    let existing = Existing {
        chains: ["services", "svc-a", "svc-old", "svc-older"]
            .map(String::from)
            .into(),
        sets: ["ips", "old-set"].map(String::from).into(),
    };
    let pending = ["svc-older".into(), "gone-already".into()];
    let p = plan_full(&rs, Some(&existing), &pending);
    let v = verbs(&p.tx);
    // Pending deletes first, only of chains the kernel still has; existing chains and
    // sets are flushed before being refilled.
    assert_eq!(v[0], "delete chain svc-older", "{v:?}");
    assert!(
        !v.contains(&"delete chain gone-already".to_string()),
        "{v:?}"
    );
    for want in [
        "add table ip t",
        "flush chain services",
        "flush chain svc-a",
        "flush set ips",
        "add element of ips",
        "flush chain svc-old",
        "delete set old-set",
    ] {
        assert!(v.contains(&want.to_string()), "{want} missing from {v:?}");
    }
    // The unknown chain is emptied now and deleted by the next sync.
    assert_eq!(p.stale_chains, ["svc-old"]);
}

#[test]
fn a_changed_fragment_replaces_only_its_own_objects() {
    let prev = ruleset(&[("a", "10.0.0.1"), ("b", "10.0.0.2")]);
    let mut next = prev.clone();
    next.set_service(&spn("b"), Some(service("b", "10.0.0.3")));
    let v = verbs(&plan_transaction(Some(&prev), &next, None, &[]).tx);
    assert!(v.iter().all(|o| !o.contains("svc-a")), "{v:?}");
    assert!(v.contains(&"delete element of ips".to_string()), "{v:?}");
    assert!(v.contains(&"add element of ips".to_string()), "{v:?}");
}

/// A service port whose element in the verdict map `vm` sends `addr` to its own chain.
fn claim(name: &str, addr: &str) -> Arc<Fragment> {
    let mut f = (*service(name, addr)).clone();
    f.element(Element::new(
        "vm".into(),
        vec![KeyValue::Addr(addr.parse().unwrap())],
        ElemData::Verdict(Verdict::Goto(format!("svc-{name}").into())),
        Some(name.into()),
    ));
    Arc::new(f)
}

fn in_force<'a>(rs: &'a Ruleset, set: &str) -> Vec<&'a Element> {
    rs.elements().filter(|e| &**e.set() == set).collect()
}

/// Built at once or one fragment at a time: the same ruleset, shared keys' owners and
/// counts included.
#[test]
fn a_ruleset_built_at_once_equals_one_built_fragment_by_fragment() {
    let frags = [("c", "1.2.3.4"), ("a", "1.2.3.1"), ("b", "1.2.3.4")];
    let mut one_by_one = ruleset(&[]);
    for (n, a) in frags {
        one_by_one.set_service(&spn(n), Some(claim(n, a)));
    }
    let table = one_by_one.table.clone();
    let at_once = Ruleset::with_services(
        table,
        base(),
        frags.iter().map(|(n, a)| (spn(n), claim(n, a))),
    );
    assert_eq!(at_once, one_by_one);
    assert_eq!(at_once.rule_count(), one_by_one.rule_count());
    assert_eq!(at_once.element_count(), one_by_one.element_count());
    let owner = |rs: &Ruleset| {
        let mut v: Vec<_> = in_force(rs, "vm")
            .iter()
            .map(|e| e.verdict().cloned())
            .collect();
        v.sort_by_key(|v| format!("{v:?}")); // the index's order is its own
        v
    };
    assert_eq!(owner(&at_once), owner(&one_by_one));
    // Removing one of the two claimants leaves the other's element in force.
    let mut a = at_once.clone();
    let mut b = one_by_one.clone();
    a.set_service(&spn("b"), None);
    b.set_service(&spn("b"), None);
    assert_eq!(owner(&a), owner(&b));
    assert_eq!(
        owner(&a),
        [
            Some(Verdict::Goto("svc-a".into())),
            Some(Verdict::Goto("svc-c".into()))
        ]
    );
}

/// A full plan adds each key once, the element in force, with a set's elements
/// together and sets in name order, whatever order the fragments arrived in.
#[test]
fn a_full_plan_adds_each_key_once_grouped_by_set() {
    let elements = |order: &[&str]| -> Vec<(String, Key, Option<Verdict>)> {
        let mut rs = ruleset(&[]);
        for n in order {
            // b and c claim one address (b owns it by name); a has its own.
            let addr = if *n == "a" { "1.2.3.1" } else { "1.2.3.4" };
            rs.set_service(&spn(n), Some(claim(n, addr)));
        }
        plan_full(&rs, None, &[])
            .tx
            .ops
            .iter()
            .filter_map(|o| match o.object() {
                crate::kernel::nft::Object::Element(e) => {
                    Some((e.set().to_string(), e.key, e.verdict().cloned()))
                }
                _ => None,
            })
            .collect()
    };
    let got = elements(&["c", "a", "b"]);
    assert_eq!(got, elements(&["a", "b", "c"]), "deterministic");
    let sets: Vec<&str> = got.iter().map(|(s, _, _)| s.as_str()).collect();
    assert_eq!(sets, ["ips", "ips", "vm", "vm"]);
    let shared = got
        .iter()
        .filter(|(s, k, _)| s == "vm" && *k == [KeyValue::Addr("1.2.3.4".parse().unwrap())])
        .collect::<Vec<_>>();
    assert_eq!(shared.len(), 1, "{got:?}");
    assert_eq!(
        shared[0].2,
        Some(Verdict::Goto("svc-b".into())),
        "b owns it"
    );
}

#[test]
fn a_shared_key_has_a_fixed_owner_and_passes_on_when_it_goes() {
    // Whatever the order they arrive in, "a" (first by name) owns the shared address.
    for order in [["a", "b"], ["b", "a"]] {
        let mut rs = ruleset(&[]);
        for n in order {
            rs.set_service(&spn(n), Some(claim(n, "1.2.3.4")));
        }
        let vm = in_force(&rs, "vm");
        assert_eq!(vm.len(), 1);
        assert_eq!(
            vm[0].verdict().cloned(),
            Some(Verdict::Goto("svc-a".into())),
            "{order:?}"
        );
    }
    // The owner goes: in the same plan its element is replaced by b's, never left
    // pointing at a chain that is being removed.
    let mut prev = ruleset(&[]);
    prev.set_service(&spn("a"), Some(claim("a", "1.2.3.4")));
    prev.set_service(&spn("b"), Some(claim("b", "1.2.3.4")));
    let change = Change {
        name: spn("a"),
        old: prev.services.get(&spn("a")).cloned(),
        new: None,
    };
    let p = plan_changes(&prev, &prev.base, &[change], &[]);
    let v = verbs(&p.tx);
    let added: Vec<_> =
        p.tx.ops
            .iter()
            .filter_map(|o| match o {
                Op::Add(crate::kernel::nft::Object::Element(e)) if &**e.set() == "vm" => {
                    Some(e.verdict().cloned())
                }
                _ => None,
            })
            .collect();
    assert_eq!(added, [Some(Verdict::Goto("svc-b".into()))], "{v:?}");
    let mut next = prev.clone();
    next.set_service(&spn("a"), None);
    assert_eq!(
        in_force(&next, "vm")[0].verdict().cloned(),
        Some(Verdict::Goto("svc-b".into()))
    );
    // b going too removes the key.
    next.set_service(&spn("b"), None);
    assert!(in_force(&next, "vm").is_empty());
}

#[test]
fn the_older_service_owns_a_shared_key_then_the_name_decides() {
    let aged = |name: &str, created: Option<i64>| {
        let mut f = (*claim(name, "1.2.3.4")).clone();
        f.created = created;
        Arc::new(f)
    };
    // "b" is older: it owns the key although "a" sorts first by name.
    for order in [["a", "b"], ["b", "a"]] {
        let mut rs = ruleset(&[]);
        for n in order {
            let created = if n == "b" { Some(100) } else { Some(200) };
            rs.set_service(&spn(n), Some(aged(n, created)));
        }
        assert_eq!(
            in_force(&rs, "vm")[0].verdict().cloned(),
            Some(Verdict::Goto("svc-b".into())),
            "{order:?}"
        );
    }
    // Without a creation time (manifests), a port comes after those with one.
    let mut rs = ruleset(&[]);
    rs.set_service(&spn("a"), Some(aged("a", None)));
    rs.set_service(&spn("b"), Some(aged("b", Some(5))));
    assert_eq!(
        in_force(&rs, "vm")[0].verdict().cloned(),
        Some(Verdict::Goto("svc-b".into()))
    );
    // Equal times: the name.
    let mut rs = ruleset(&[]);
    rs.set_service(&spn("b"), Some(aged("b", Some(5))));
    rs.set_service(&spn("a"), Some(aged("a", Some(5))));
    assert_eq!(
        in_force(&rs, "vm")[0].verdict().cloned(),
        Some(Verdict::Goto("svc-a".into()))
    );
}

/// A key whose first contributor goes while others that agree with it stay is still in a
/// full plan of the ruleset changed in place, once. (The index still holds the key by the
/// element of the contributor that went, and the plan used to send only the element the
/// index held.)
#[test]
fn a_full_plan_of_a_ruleset_changed_in_place_keeps_a_key_its_first_contributor_left() {
    let ips = |rs: &Ruleset| -> Vec<Key> {
        plan_full(rs, None, &[])
            .tx
            .ops
            .iter()
            .filter_map(|o| match o.object() {
                crate::kernel::nft::Object::Element(e) if &**e.set() == "ips" => Some(e.key),
                _ => None,
            })
            .collect()
    };
    let one = vec![Key::from([KeyValue::Addr("10.0.0.1".parse().unwrap())])];
    for (services, gone) in [
        (&[("a", "10.0.0.1"), ("b", "10.0.0.1")][..], "a"),
        (
            &[("a", "10.0.0.1"), ("b", "10.0.0.1"), ("c", "10.0.0.1")][..],
            "a",
        ),
        (
            &[("a", "10.0.0.1"), ("b", "10.0.0.1"), ("c", "10.0.0.1")][..],
            "b",
        ),
    ] {
        let mut rs = ruleset(services);
        rs.set_service(&spn(gone), None);
        assert_eq!(ips(&rs), one, "{services:?} without {gone}");
        let fresh =
            Ruleset::with_services(rs.table.clone(), (*rs.base).clone(), rs.services.clone());
        assert_eq!(ips(&fresh), one, "built at once");
    }
}
