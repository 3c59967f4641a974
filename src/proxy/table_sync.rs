//! [`TableSync`]: the one lifecycle of an nftables table that every mode shares (the
//! nftables mode's whole ruleset, the IPVS and userspace modes' companion tables). List the
//! kernel's chains and sets at a full sync, plan the difference from what was last
//! committed, apply it as one atomic transaction per family, remember it, and forget it
//! after a failure so that the next sync re-asserts everything. I/O only through the
//! [`Nftables`] trait, so every mode's tests run it against the fake.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::kernel::nft::{self, Family, Nftables};
use crate::model::ServicePortName;

use super::ruleset::{plan_changes, plan_transaction, Change, Existing, Fragment, Ruleset};
use super::{SyncError, SyncStats};

/// What was committed to one table name in each family, and the chains awaiting deletion.
#[derive(Debug, Default)]
pub struct TableSync {
    table: String,
    last: BTreeMap<Family, Ruleset>,
    /// Chains left flushed by the last transaction; the next one deletes them (deleting in
    /// the batch that drops their last reference fails on kernels before 6.2).
    pending_deletes: BTreeMap<Family, Vec<String>>,
}

impl TableSync {
    pub fn new(table: impl Into<String>) -> Self {
        TableSync {
            table: table.into(),
            ..Default::default()
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// What was last committed in `family`, if that commit succeeded.
    pub fn last(&self, family: Family) -> Option<&Ruleset> {
        self.last.get(&family)
    }

    /// Every family's committed ruleset.
    pub fn committed(&self) -> impl Iterator<Item = &Ruleset> {
        self.last.values()
    }

    /// Forgets what was committed: the next sync of each family is a full one.
    pub fn forget(&mut self) {
        self.last.clear();
    }

    /// Flushed chains wait for deletion: sync again soon.
    pub fn has_pending_deletes(&self) -> bool {
        self.pending_deletes.values().any(|v| !v.is_empty())
    }

    fn list_existing<N: Nftables>(
        &self,
        nft: &mut N,
        family: Family,
    ) -> Result<Existing, nft::Error> {
        Ok(Existing {
            chains: nft.list_chains(family, &self.table)?.into_iter().collect(),
            sets: nft.list_sets(family, &self.table)?.into_iter().collect(),
        })
    }

    fn pending(&self, family: Family) -> Vec<String> {
        self.pending_deletes
            .get(&family)
            .cloned()
            .unwrap_or_default()
    }

    /// Brings `next.family()`'s table to `next`: a full sync (listing the kernel, flushing and
    /// re-asserting every object) when `full` or nothing is remembered, otherwise only the
    /// fragments that differ from the last commit. On failure the kernel keeps its previous
    /// ruleset and this family is forgotten.
    pub fn sync<N: Nftables>(
        &mut self,
        nft: &mut N,
        next: Ruleset,
        full: bool,
        stats: &mut SyncStats,
    ) -> Result<(), SyncError> {
        let family = next.family();
        let res = (|| {
            let existing = if full || !self.last.contains_key(&family) {
                Some(self.list_existing(nft, family)?)
            } else {
                None
            };
            let prev = existing.is_none().then(|| self.last.get(&family)).flatten();
            let plan = plan_transaction(prev, &next, existing.as_ref(), &self.pending(family));
            stats.ops.insert(family, plan.tx.num_ops());
            if !plan.tx.ops.is_empty() {
                nft.apply(&plan.tx)?;
            }
            Ok(plan.stale_chains)
        })();
        self.remember(family, res.map(|stale| (next, stale)))
    }

    /// Applies known changes of single service ports on top of the last commit of `family`
    /// (the nftables mode's partial sync: planning and kernel work follow the change, not the
    /// cluster). `build` gives each changed service port's new fragment, `None` for gone;
    /// `rebase` a new base fragment when the changes need one (shared chains that the
    /// changed service ports start or stop using), `None` to keep it.
    pub fn sync_changes<N: Nftables>(
        &mut self,
        nft: &mut N,
        family: Family,
        changed: &[ServicePortName],
        mut build: impl FnMut(&ServicePortName) -> Option<Fragment>,
        rebase: impl FnOnce(&[Change]) -> Option<Fragment>,
        stats: &mut SyncStats,
    ) -> Result<(), SyncError> {
        let Some(last) = self.last.get(&family) else {
            return Ok(());
        };
        let changes: Vec<Change> = changed
            .iter()
            .map(|spn| Change {
                name: spn.clone(),
                old: last.services.get(spn).cloned(),
                new: build(spn)
                    .filter(|f| *f != Fragment::default())
                    .map(Arc::new),
            })
            .collect();
        let new_base = rebase(&changes).map(Arc::new);
        let base = new_base.as_ref().unwrap_or(&last.base);
        let plan = plan_changes(last, base, &changes, &self.pending(family));
        stats.ops.insert(family, plan.tx.num_ops());
        let t_apply = std::time::Instant::now();
        let applied = if plan.tx.ops.is_empty() {
            Ok(())
        } else {
            nft.apply(&plan.tx)
        };
        tracing::debug!(%family, ops = plan.tx.num_ops(), apply = ?t_apply.elapsed(), "partial sync applied");
        match applied {
            Ok(()) => {
                if let Some(last) = self.last.get_mut(&family) {
                    if let Some(b) = new_base {
                        last.set_base(b);
                    }
                    for c in changes {
                        last.set_service(&c.name, c.new);
                    }
                }
                self.pending_deletes.insert(family, plan.stale_chains);
                Ok(())
            }
            Err(error) => {
                self.last.remove(&family);
                Err(SyncError::Nft { family, error })
            }
        }
    }

    fn remember(
        &mut self,
        family: Family,
        res: Result<(Ruleset, Vec<String>), nft::Error>,
    ) -> Result<(), SyncError> {
        match res {
            Ok((rs, stale)) => {
                self.pending_deletes.insert(family, stale);
                // Freeing a replaced 100k × 10 ruleset takes ~1 s: not on the sync path.
                self.last.insert(family, rs);
                Ok(())
            }
            Err(error) => {
                self.last.remove(&family);
                Err(SyncError::Nft { family, error })
            }
        }
    }

    /// Adds the committed rules and elements of every family to `stats`.
    pub fn count(&self, stats: &mut SyncStats) {
        for rs in self.last.values() {
            stats.rules += rs.rule_count();
            stats.elements += rs.element_count();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::nft::FakeNftables;
    use crate::proxy::ruleset::tests::{ruleset, service, spn};

    #[test]
    fn first_sync_is_full_then_an_unchanged_sync_sends_nothing() {
        let (mut nft, mut ts) = (FakeNftables::new(), TableSync::new("t"));
        let mut stats = SyncStats::default();
        ts.sync(&mut nft, ruleset(&[("a", "10.0.0.1")]), false, &mut stats)
            .unwrap();
        assert!(nft.rules(Family::Ip, "t", "svc-a").is_some());
        assert_eq!(nft.applied, 1);
        let mut stats = SyncStats::default();
        ts.sync(&mut nft, ruleset(&[("a", "10.0.0.1")]), false, &mut stats)
            .unwrap();
        assert_eq!(stats.ops[&Family::Ip], 0);
        assert_eq!(nft.applied, 1, "nothing applied when nothing changed");
        ts.count(&mut stats);
        assert_eq!((stats.rules, stats.elements), (2, 1));
    }

    #[test]
    fn a_failed_apply_keeps_the_kernel_and_forgets_so_the_next_sync_is_full() {
        let (mut nft, mut ts) = (FakeNftables::new(), TableSync::new("t"));
        let mut stats = SyncStats::default();
        ts.sync(&mut nft, ruleset(&[("a", "10.0.0.1")]), false, &mut stats)
            .unwrap();
        let before = nft.dump(Family::Ip, "t");
        nft.fail_next = Some(libc::ENOMEM);
        let err = ts
            .sync(&mut nft, ruleset(&[("b", "10.0.0.2")]), false, &mut stats)
            .unwrap_err();
        assert!(
            matches!(
                err,
                SyncError::Nft {
                    family: Family::Ip,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(
            nft.dump(Family::Ip, "t"),
            before,
            "kernel kept the old ruleset"
        );
        assert!(ts.last(Family::Ip).is_none());
        // The retry lists the kernel and re-asserts everything, removing a's chain.
        ts.sync(&mut nft, ruleset(&[("b", "10.0.0.2")]), false, &mut stats)
            .unwrap();
        assert!(nft.rules(Family::Ip, "t", "svc-b").is_some());
        assert_eq!(
            nft.rules(Family::Ip, "t", "svc-a").map(|r| r.len()),
            Some(0)
        );
        assert!(
            ts.has_pending_deletes(),
            "svc-a is deleted by the next sync"
        );
        ts.sync(&mut nft, ruleset(&[("b", "10.0.0.2")]), false, &mut stats)
            .unwrap();
        assert!(nft.rules(Family::Ip, "t", "svc-a").is_none());
        assert!(!ts.has_pending_deletes());
    }

    #[test]
    fn known_changes_touch_only_their_service_port() {
        let (mut nft, mut ts) = (FakeNftables::new(), TableSync::new("t"));
        let mut stats = SyncStats::default();
        ts.sync(
            &mut nft,
            ruleset(&[("a", "10.0.0.1"), ("b", "10.0.0.2")]),
            true,
            &mut stats,
        )
        .unwrap();
        let mut stats = SyncStats::default();
        ts.sync_changes(
            &mut nft,
            Family::Ip,
            &[spn("b")],
            |_| Some((*service("b", "10.0.0.3")).clone()),
            |_| None,
            &mut stats,
        )
        .unwrap();
        let tx = nft.last_transaction.clone().unwrap();
        assert!(
            tx.ops
                .iter()
                .all(|o| !o.object().describe().contains("svc-a")),
            "{tx:?}"
        );
        // Delete the old element, add the new one, and re-assert b's chain.
        assert!(stats.ops[&Family::Ip] >= 2);
        let ips = nft.elements(Family::Ip, "t", "ips").unwrap();
        assert_eq!(ips.len(), 2);
        // A family never synced in full has nothing to change.
        ts.sync_changes(
            &mut nft,
            Family::Ip6,
            &[spn("b")],
            |_| None,
            |_| None,
            &mut stats,
        )
        .unwrap();
    }
}
