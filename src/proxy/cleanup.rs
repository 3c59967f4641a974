//! Removing tables at `--cleanup` and when switching modes: ours (only with our comment)
//! and upstream kube-proxy's nftables-mode tables. I/O through the [`Nftables`] trait.

use crate::kernel::nft::{self, Family, Nftables, Table, Transaction};

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
            tracing::warn!(%family, table, comment = ?t.comment, "table has our name but not our comment; left alone");
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::nft::FakeNftables;

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
