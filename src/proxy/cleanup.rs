//! Removing tables at `--cleanup` and when switching modes: ours (only with our comment),
//! upstream kube-proxy's nftables-mode tables, and the `KUBE-*` chains its iptables and
//! IPVS modes leave in iptables-nft's `filter`, `nat` and `mangle` tables (nf_tables objects,
//! deleted over nfnetlink without the iptables binary). I/O through the [`Nftables`] trait;
//! what to delete is planned by a pure function.

use crate::kernel::ipset::{self, Ipsets};
use crate::kernel::nft::decode::RuleJumps;
use crate::kernel::nft::{self, Chain, Family, Nftables, Rule, Table, Transaction};
use crate::kernel::xtables::{self, Xtables};

use super::names::TABLE_COMMENT;
use super::SyncError;

/// Deletes each of `tables` in both families, where it carries our comment; returns what
/// was removed.
pub fn delete_tables<N: Nftables>(nft: &mut N, tables: &[&str]) -> Result<Vec<String>, SyncError> {
    let mut removed = Vec::new();
    for t in tables {
        removed.extend(cleanup(nft, t).map_err(SyncError::NftCleanup)?);
    }
    Ok(removed)
}

/// Deletes our table in each family. A table of that name whose comment is not ours is left
/// alone and reported: we never touch what we did not create. Returns what was removed.
pub fn cleanup<N: Nftables>(nft: &mut N, table: &str) -> Result<Vec<String>, nft::Error> {
    let mut removed = Vec::new();
    for family in Family::all() {
        let tables = nft.list_tables(family)?;
        let Some(t) = tables.iter().find(|t| t.name == table) else {
            continue;
        };
        if t.comment.as_deref() != Some(TABLE_COMMENT) {
            tracing::warn!(%family, table, comment = t.comment.as_deref().unwrap_or(""), "table has our name but not our comment; left alone");
            continue;
        }
        removed.push(delete_table(nft, family, table)?);
    }
    Ok(removed)
}

/// Deletes one table (and everything in it) in one transaction.
fn delete_table<N: Nftables>(
    nft: &mut N,
    family: Family,
    name: &str,
) -> Result<String, nft::Error> {
    let mut tx = Transaction::new(family, name);
    tx.delete(Table {
        family,
        name: name.into(),
        comment: None,
    });
    nft.apply(&tx)?;
    Ok(format!("table {family} {name}"))
}

/// Upstream kube-proxy's nftables-mode table name.
pub const UPSTREAM_TABLE: &str = "kube-proxy";

/// Deletes what upstream kube-proxy's nftables mode leaves behind: its `kube-proxy` tables in
/// the ip and ip6 families (migration). Its iptables rules cannot be removed without the
/// iptables binaries; see README.
pub fn cleanup_upstream<N: Nftables>(nft: &mut N) -> Result<Vec<String>, nft::Error> {
    let mut removed = Vec::new();
    for family in Family::all() {
        if !nft
            .list_tables(family)?
            .iter()
            .any(|t| t.name == UPSTREAM_TABLE)
        {
            continue;
        }
        removed.push(delete_table(nft, family, UPSTREAM_TABLE)?);
    }
    Ok(removed)
}

/// The chains upstream kube-proxy's iptables mode (pkg/proxy/iptables) and IPVS mode
/// (pkg/proxy/ipvs) create, by exact name; kubelet's `KUBE-FIREWALL`,
/// `KUBE-KUBELET-CANARY` and `KUBE-MARK-DROP` are not among them and are never touched.
pub const UPSTREAM_IPTABLES_CHAINS: &[&str] = &[
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
    "KUBE-FORWARD",
    "KUBE-PROXY-FIREWALL",
    "KUBE-PROXY-CANARY",
    "KUBE-LOAD-BALANCER",
    "KUBE-NODE-PORT",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];
/// Per-service chains of iptables mode (`isServiceChainName`, and the older XLB/FW).
pub const UPSTREAM_IPTABLES_PREFIXES: &[&str] = &[
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-SEP-",
    "KUBE-FW-",
    "KUBE-EXT-",
    "KUBE-XLB-",
];
/// The iptables tables kube-proxy writes to.
pub const IPTABLES_TABLES: &[&str] = &["nat", "filter", "mangle"];

pub fn is_upstream_iptables_chain(name: &str) -> bool {
    UPSTREAM_IPTABLES_CHAINS.contains(&name)
        || UPSTREAM_IPTABLES_PREFIXES
            .iter()
            .any(|p| name.starts_with(p))
}

/// Plans the removal of upstream's chains from one iptables-nft table: the jump rules in
/// other chains that lead to them (deleted by handle, every other rule stays), then each of
/// our chains flushed and deleted. `None` when the table holds none of them.
pub fn plan_iptables_cleanup(
    family: Family,
    table: &str,
    chains: &[String],
    rules: &[RuleJumps],
) -> Option<Transaction> {
    let owned: Vec<&String> = chains
        .iter()
        .filter(|c| is_upstream_iptables_chain(c))
        .collect();
    if owned.is_empty() {
        return None;
    }
    let mut tx = Transaction::new(family, table);
    for r in rules {
        if !is_upstream_iptables_chain(&r.chain)
            && r.targets.iter().any(|t| is_upstream_iptables_chain(t))
        {
            tx.delete(Rule::by_handle(r.chain.clone(), r.handle));
        }
    }
    for c in &owned {
        tx.flush(Chain::regular(c.as_str()));
    }
    for c in &owned {
        tx.delete(Chain::regular(c.as_str()));
    }
    Some(tx)
}

/// Deletes upstream's iptables-mode and IPVS-mode chains from iptables-nft's tables in both
/// families, each table in one transaction; returns what was removed.
pub fn cleanup_upstream_iptables<N: Nftables>(nft: &mut N) -> Result<Vec<String>, nft::Error> {
    let mut removed = Vec::new();
    for family in Family::all() {
        let present = nft.list_tables(family)?;
        for table in IPTABLES_TABLES {
            if !present.iter().any(|t| t.name == *table) {
                continue;
            }
            let chains = nft.list_chains(family, table)?;
            let rules = nft.list_rule_jumps(family, table)?;
            let Some(tx) = plan_iptables_cleanup(family, table, &chains, &rules) else {
                continue;
            };
            let n_chains = chains
                .iter()
                .filter(|c| is_upstream_iptables_chain(c))
                .count();
            let n_jumps = tx.num_ops() - 2 * n_chains;
            nft.apply(&tx)?;
            removed.push(format!(
                "iptables-nft table {family} {table}: {n_chains} KUBE-* chains, {n_jumps} jump rules"
            ));
        }
    }
    Ok(removed)
}

/// Deletes upstream's chains (and the jumps into them) from legacy x_tables
/// (`iptables-legacy`), in tables that exist only: each table is read, rewritten without
/// them and replaced in one `IPT_SO_SET_REPLACE`. Returns what was removed.
pub fn cleanup_upstream_legacy<X: Xtables>(x: &mut X) -> Result<Vec<String>, xtables::Error> {
    let mut removed = Vec::new();
    for family in Family::all() {
        for table in x.tables(family)? {
            if !IPTABLES_TABLES.contains(&table.as_str()) {
                continue;
            }
            let old = x.get(family, &table)?;
            let rewrite = xtables::blob::remove_chains(
                xtables::layout(family),
                &old,
                is_upstream_iptables_chain,
            )
            .map_err(|why| xtables::Error::Malformed {
                family,
                table: table.clone(),
                why,
            })?;
            let Some(r) = rewrite else { continue };
            x.replace(family, &old, &r)?;
            removed.push(format!(
                "iptables-legacy table {family} {table}: {} KUBE-* chains, {} jump rules",
                r.removed_chains.len(),
                r.removed_jumps
            ));
        }
    }
    Ok(removed)
}

/// The ipsets upstream's IPVS mode creates (pkg/proxy/ipvs/ipset.go), IPv4 names; IPv6
/// ones carry `KUBE-6-` instead of `KUBE-`.
pub const UPSTREAM_IPSETS: &[&str] = &[
    "KUBE-LOOP-BACK",
    "KUBE-CLUSTER-IP",
    "KUBE-EXTERNAL-IP",
    "KUBE-EXTERNAL-IP-LOCAL",
    "KUBE-LOAD-BALANCER",
    "KUBE-LOAD-BALANCER-LOCAL",
    "KUBE-LOAD-BALANCER-FW",
    "KUBE-LOAD-BALANCER-SOURCE-IP",
    "KUBE-LOAD-BALANCER-SOURCE-CIDR",
    "KUBE-NODE-PORT-TCP",
    "KUBE-NODE-PORT-LOCAL-TCP",
    "KUBE-NODE-PORT-UDP",
    "KUBE-NODE-PORT-LOCAL-UDP",
    "KUBE-NODE-PORT-SCTP-HASH",
    "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
    "KUBE-HEALTH-CHECK-NODE-PORT",
    "KUBE-IPVS-IPS",
];

pub fn is_upstream_ipset(name: &str) -> bool {
    UPSTREAM_IPSETS.contains(&name)
        || name
            .strip_prefix("KUBE-6-")
            .is_some_and(|rest| UPSTREAM_IPSETS.contains(&format!("KUBE-{rest}").as_str()))
}

/// Destroys upstream's IPVS-mode ipsets (after its iptables rules, which reference them,
/// are gone); other sets stay. Returns what was removed.
pub fn cleanup_upstream_ipsets<I: Ipsets>(ipsets: &mut I) -> Result<Vec<String>, ipset::Error> {
    let mut removed = Vec::new();
    for name in ipsets.list_names()? {
        if !is_upstream_ipset(&name) {
            continue;
        }
        // nf_tables releases a deleted rule's set reference in deferred work after the
        // commit (tens of ms): a set referenced a moment ago reads busy for that long.
        let mut tries = 0;
        loop {
            match ipsets.destroy(&name) {
                Err(ipset::Error::Busy(_)) if tries < 40 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(25));
                }
                other => break other?,
            }
        }
        removed.push(format!("ipset {name}"));
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::nft::FakeNftables;

    #[test]
    fn upstream_ipsets_by_name_in_both_families() {
        for yes in [
            "KUBE-CLUSTER-IP",
            "KUBE-6-CLUSTER-IP",
            "KUBE-6-NODE-PORT-LOCAL-TCP",
            "KUBE-IPVS-IPS",
        ] {
            assert!(is_upstream_ipset(yes), "{yes}");
        }
        for no in [
            "KUBE-6-",
            "KUBE-FOO",
            "cali40all-ipam-pools",
            "KUBE-CLUSTER-IP-X",
            "kube-cluster-ip",
        ] {
            assert!(!is_upstream_ipset(no), "{no}");
        }
    }

    fn jumps(chain: &str, handle: u64, targets: &[&str]) -> RuleJumps {
        RuleJumps {
            table: "nat".into(),
            chain: chain.into(),
            handle,
            targets: targets.iter().map(|t| t.to_string()).collect(),
        }
    }

    #[test]
    fn iptables_cleanup_takes_only_kube_proxys_chains_and_jumps() {
        let chains: Vec<String> = [
            "PREROUTING",
            "OUTPUT",
            "POSTROUTING",
            "KUBE-SERVICES",
            "KUBE-SVC-ABC",
            "KUBE-SEP-XYZ",
            "KUBE-MARK-MASQ",
            "KUBE-POSTROUTING",
            "KUBE-KUBELET-CANARY",
            "KUBE-MARK-DROP",
            "DOCKER",
        ]
        .map(String::from)
        .into();
        let rules = vec![
            jumps("PREROUTING", 5, &["KUBE-SERVICES"]),
            jumps("PREROUTING", 6, &["DOCKER"]),
            jumps("OUTPUT", 7, &["KUBE-SERVICES"]),
            jumps("POSTROUTING", 8, &["KUBE-POSTROUTING"]),
            jumps("POSTROUTING", 9, &[]),
            jumps("KUBE-SERVICES", 10, &["KUBE-SVC-ABC"]),
            jumps("KUBE-SVC-ABC", 11, &["KUBE-SEP-XYZ"]),
            jumps("KUBE-SEP-XYZ", 12, &["KUBE-MARK-MASQ"]),
            jumps("KUBE-KUBELET-CANARY", 13, &["KUBE-MARK-DROP"]),
        ];
        let tx = plan_iptables_cleanup(Family::Ip, "nat", &chains, &rules).unwrap();
        let text = crate::kernel::nft::render::transaction(&tx);
        for want in [
            "delete rule ip nat PREROUTING handle 5",
            "delete rule ip nat OUTPUT handle 7",
            "delete rule ip nat POSTROUTING handle 8",
            "delete chain ip nat KUBE-SEP-XYZ",
            "delete chain ip nat KUBE-MARK-MASQ",
        ] {
            assert!(text.contains(want), "{want} in\n{text}");
        }
        for keep in [
            "handle 6",
            "handle 9",
            "KUBE-KUBELET-CANARY",
            "KUBE-MARK-DROP",
            "DOCKER",
        ] {
            assert!(!text.contains(keep), "{keep} kept:\n{text}");
        }
        // Every chain is flushed before any is deleted (they jump to each other).
        let first_delete = text.find("delete chain").unwrap();
        assert!(text.rfind("flush chain").unwrap() < first_delete, "{text}");
        assert_eq!(
            plan_iptables_cleanup(Family::Ip, "nat", &chains[..3], &rules[..2]),
            None
        );
    }

    fn create(nft: &mut FakeNftables, family: Family, name: &str, comment: Option<&str>) {
        let mut tx = Transaction::new(family, name);
        tx.add(Table {
            family,
            name: name.into(),
            comment: comment.map(String::from),
        });
        nft.apply(&tx).unwrap();
    }

    #[test]
    fn only_tables_with_our_comment_are_deleted() {
        let mut nft = FakeNftables::new();
        create(&mut nft, Family::Ip, "ours", Some(TABLE_COMMENT));
        create(&mut nft, Family::Ip6, "ours", Some(TABLE_COMMENT));
        create(&mut nft, Family::Ip, "theirs", Some("someone else"));
        let removed = delete_tables(&mut nft, &["ours", "theirs", "absent"]).unwrap();
        assert_eq!(removed, ["table ip ours", "table ip6 ours"]);
        assert!(!nft.has_table(Family::Ip, "ours"));
        assert!(nft.has_table(Family::Ip, "theirs"));
    }

    #[test]
    fn upstream_tables_are_deleted_whatever_their_comment() {
        let mut nft = FakeNftables::new();
        create(
            &mut nft,
            Family::Ip,
            UPSTREAM_TABLE,
            Some("rules for kube-proxy"),
        );
        assert_eq!(cleanup_upstream(&mut nft).unwrap(), ["table ip kube-proxy"]);
        assert!(cleanup_upstream(&mut nft).unwrap().is_empty());
    }
}
