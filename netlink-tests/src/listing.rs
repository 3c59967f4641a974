//! Lists one of our tables back from the kernel in a canonical form (chains with their rules
//! as kernel expressions, set elements sorted), so two kernels' states can be compared
//! exactly, whatever order the kernel prints them in.

use std::collections::BTreeMap;

use kube_nlproxy::kernel::nft::lower::KExpr;
use kube_nlproxy::kernel::nft::netlink::NetlinkNftables;
use kube_nlproxy::kernel::nft::{Family, Nftables, Verdict};

/// Chains (sorted), rules per chain (in order), elements per set (sorted).
pub type Listing = (
    Vec<String>,
    BTreeMap<String, Vec<Vec<KExpr>>>,
    BTreeMap<String, Vec<(Vec<u8>, Option<Verdict>)>>,
);

/// Lists table `t` of `family` through `n` (in the calling thread's namespace).
pub fn kernel_listing(n: &mut NetlinkNftables, family: Family, t: &str) -> Listing {
    let mut chains = n.list_chains(family, t).unwrap();
    chains.sort();
    let mut rules: BTreeMap<String, Vec<Vec<KExpr>>> =
        chains.iter().map(|c| (c.clone(), vec![])).collect();
    for r in n.list_rules(family, t).unwrap() {
        rules.get_mut(&r.chain).unwrap().push(r.exprs);
    }
    let mut elems = BTreeMap::new();
    for s in n.list_sets(family, t).unwrap() {
        let mut v: Vec<_> = n
            .list_elements(family, t, &s)
            .unwrap()
            .into_iter()
            .map(|e| (e.key, e.verdict))
            .collect();
        v.sort();
        elems.insert(s, v);
    }
    (chains, rules, elems)
}
