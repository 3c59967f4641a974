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

/// Table `table` of `family` in `ns` as `nft -j` lists it (the independent oracle: the
/// real `nft`, not our decoder), one line per object, with what two equal tables may list
/// differently taken out: handles, the order of set elements (hash order) and the values
/// of counters (the traffic each kernel saw).
pub fn nft_canonical(ns: &crate::ns::NetNs, family: &str, table: &str) -> Vec<String> {
    let out = ns.sh(&format!("nft -j list table {family} {table}"));
    let v: serde_json::Value = serde_json::from_str(&out).expect("nft -j prints JSON");
    let mut lines = Vec::new();
    let mut pos = BTreeMap::<String, usize>::new();
    for item in v["nftables"].as_array().expect("nftables array") {
        let mut item = item.clone();
        let Some((kind, body)) = item.as_object_mut().and_then(|o| o.iter_mut().next()) else {
            continue;
        };
        if kind == "metainfo" {
            continue;
        }
        let kind = kind.clone();
        zero_counters(body);
        let body = body.as_object_mut().expect("object");
        body.remove("handle");
        if let Some(serde_json::Value::Array(elems)) = body.get_mut("elem") {
            elems.sort_by_key(|e| e.to_string());
        }
        let key = if kind == "rule" {
            let chain = body["chain"].as_str().unwrap_or("").to_string();
            let n = pos.entry(chain.clone()).or_default();
            *n += 1;
            format!("rule {chain} #{n:04}")
        } else {
            kind.clone()
        };
        lines.push(format!("{key} {}", serde_json::Value::Object(body.clone())));
    }
    lines.sort();
    lines
}

/// Sets every `"counter": {"packets": N, "bytes": M}` under `v` to zeros.
fn zero_counters(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(o) => {
            for (k, child) in o.iter_mut() {
                if k == "counter" {
                    if let Some(c) = child.as_object_mut() {
                        for n in ["packets", "bytes"] {
                            if c.contains_key(n) {
                                c.insert(n.into(), 0.into());
                            }
                        }
                    }
                }
                zero_counters(child);
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(zero_counters),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn counters_are_zeroed_wherever_they_are() {
        let mut v = serde_json::json!({"rule": {"expr": [
            {"counter": {"packets": 3, "bytes": 180}},
            {"match": {"right": {"set": [1, 2]}}},
        ]}});
        super::zero_counters(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"rule": {"expr": [
                {"counter": {"packets": 0, "bytes": 0}},
                {"match": {"right": {"set": [1, 2]}}},
            ]}})
        );
    }
}
