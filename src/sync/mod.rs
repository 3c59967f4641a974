//! The syncer: turns the model into rulesets and hands the difference from what was last
//! committed to an [`Nftables`] backend, one atomic transaction per family. Generic over the
//! backend so unit tests run whole syncs against the fake.

pub mod runner;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use crate::config::DetectLocal;
use crate::conntrack::{cleanup as ct_cleanup, Conntrack};
use crate::model::ProxyState;
use crate::nft::{self, Family, Nftables, Table, Transaction};
use crate::proxier::{
    build_ruleset, names, plan_transaction, Existing, LocalDetector, ProxierConfig, Ruleset,
};

/// A failed sync of one family. Nothing of that family's transaction was applied.
#[derive(Debug, thiserror::Error)]
#[error("sync of the {family} table failed: {error}")]
pub struct SyncError {
    pub family: Family,
    pub error: nft::Error,
}

/// What a sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncStats {
    pub full: bool,
    /// Operations sent per family.
    pub ops: BTreeMap<Family, usize>,
    pub rules: usize,
    pub elements: usize,
    /// Stale conntrack entries deleted after the sync.
    pub conntrack_deleted: usize,
    /// Time spent reconciling conntrack.
    pub conntrack_duration: Option<std::time::Duration>,
}

/// Keeps our tables in step with the model.
pub struct Syncer<N: Nftables> {
    nft: N,
    cfg: ProxierConfig,
    detect_local: DetectLocal,
    families: Vec<Family>,
    last: BTreeMap<Family, Ruleset>,
    pending_deletes: BTreeMap<Family, Vec<String>>,
    need_full: bool,
    last_node_labels: Option<BTreeMap<String, String>>,
    warned_no_podcidr: bool,
    conntrack: Option<Box<dyn Conntrack + Send>>,
}

impl<N: Nftables> Syncer<N> {
    pub fn new(nft: N, cfg: ProxierConfig, detect_local: DetectLocal) -> Self {
        Syncer {
            nft,
            cfg,
            detect_local,
            families: Family::all().to_vec(),
            last: BTreeMap::new(),
            pending_deletes: BTreeMap::new(),
            need_full: true,
            last_node_labels: None,
            warned_no_podcidr: false,
            conntrack: None,
        }
    }

    /// Enables the stale UDP/SCTP conntrack cleanup after each successful sync.
    pub fn with_conntrack(mut self, ct: Box<dyn Conntrack + Send>) -> Self {
        self.conntrack = Some(ct);
        self
    }

    /// Deletes conntrack entries that point at endpoints the state no longer serves. A
    /// failure is logged and retried at the next sync; it never undoes the rules.
    fn reconcile_conntrack(&mut self, state: &ProxyState, stats: &mut SyncStats) {
        let Some(ct) = self.conntrack.as_mut() else {
            return;
        };
        let t0 = std::time::Instant::now();
        for family in &self.families {
            for proto in ct_cleanup::PROTOCOLS {
                let dests = ct_cleanup::service_destinations(state, *family, proto);
                if dests.is_empty() {
                    continue;
                }
                let res = ct
                    .list(*family, proto.number())
                    .and_then(|flows| ct.delete(&ct_cleanup::stale_flows(&dests, &flows)));
                match res {
                    Ok(n) => stats.conntrack_deleted += n,
                    Err(e) => {
                        tracing::warn!(%family, proto = proto.lower(), "conntrack cleanup failed: {e}")
                    }
                }
            }
        }
        stats.conntrack_duration = Some(t0.elapsed());
        if stats.conntrack_deleted > 0 {
            tracing::info!(
                deleted = stats.conntrack_deleted,
                "deleted stale conntrack entries"
            );
        }
    }

    /// The backend (tests inspect the fake through it).
    pub fn backend(&mut self) -> &mut N {
        &mut self.nft
    }

    /// Forces the next sync to be a full one.
    pub fn force_full_sync(&mut self) {
        self.need_full = true;
    }

    /// Whether flushed chains still wait for deletion (the caller syncs again soon).
    pub fn has_pending_deletes(&self) -> bool {
        self.pending_deletes.values().any(|v| !v.is_empty())
    }

    fn effective_config(&mut self, state: &ProxyState) -> ProxierConfig {
        let mut cfg = self.cfg.clone();
        if self.detect_local == DetectLocal::NodeCidr {
            if state.node.pod_cidrs.is_empty() {
                if !self.warned_no_podcidr {
                    tracing::warn!(node = %state.node.name, "detect-local-mode NodeCIDR but the Node has no podCIDRs; local traffic is not detected");
                    self.warned_no_podcidr = true;
                }
                cfg.local_detector = LocalDetector::None;
            } else {
                cfg.local_detector = LocalDetector::Cidrs(state.node.pod_cidrs.clone());
            }
        }
        cfg
    }

    /// Plans the transactions of a sync without applying them (for `--dry-run` and tests).
    pub fn plan(&mut self, state: &ProxyState) -> Vec<Transaction> {
        let cfg = self.effective_config(state);
        self.families
            .iter()
            .map(|f| {
                let rs = build_ruleset(state, &cfg, *f);
                plan_transaction(None, &rs, None, &[]).tx
            })
            .collect()
    }

    /// One sync: full after start, a failure or a node label change; partial otherwise.
    pub fn sync(&mut self, state: &ProxyState) -> Result<SyncStats, SyncError> {
        if self.last_node_labels.as_ref() != Some(&state.node.labels) {
            if self.last_node_labels.is_some() {
                tracing::info!("node labels changed; doing a full sync");
            }
            self.need_full = true;
            self.last_node_labels = Some(state.node.labels.clone());
        }
        let cfg = self.effective_config(state);
        let full = self.need_full;
        let mut stats = SyncStats {
            full,
            ..Default::default()
        };
        let mut first_err = None;
        for family in self.families.clone() {
            let rs = build_ruleset(state, &cfg, family);
            stats.rules += rs.rule_count();
            stats.elements += rs.element_count();
            let existing = if full {
                match self.list_existing(family) {
                    Ok(e) => Some(e),
                    Err(source) => {
                        first_err.get_or_insert(SyncError {
                            family,
                            error: source,
                        });
                        continue;
                    }
                }
            } else {
                None
            };
            let prev = if full { None } else { self.last.get(&family) };
            let pending = self
                .pending_deletes
                .get(&family)
                .cloned()
                .unwrap_or_default();
            let plan = plan_transaction(prev, &rs, existing.as_ref(), &pending);
            stats.ops.insert(family, plan.tx.num_ops());
            match self.nft.apply(&plan.tx) {
                Ok(()) => {
                    self.last.insert(family, rs);
                    self.pending_deletes.insert(family, plan.stale_chains);
                }
                Err(source) => {
                    // The kernel kept the previous ruleset; forget what we thought was there
                    // so the next sync re-asserts everything.
                    self.last.remove(&family);
                    first_err.get_or_insert(SyncError {
                        family,
                        error: source,
                    });
                }
            }
        }
        match first_err {
            Some(e) => {
                self.need_full = true;
                Err(e)
            }
            None => {
                self.need_full = false;
                self.reconcile_conntrack(state, &mut stats);
                Ok(stats)
            }
        }
    }

    fn list_existing(&mut self, family: Family) -> Result<Existing, nft::Error> {
        Ok(Existing {
            chains: self
                .nft
                .list_chains(family, &self.cfg.table)?
                .into_iter()
                .collect(),
            sets: self
                .nft
                .list_sets(family, &self.cfg.table)?
                .into_iter()
                .collect(),
        })
    }
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
        if t.comment.as_deref() != Some(names::TABLE_COMMENT) {
            tracing::warn!(%family, table, comment = ?t.comment, "table has our name but not our comment; left alone");
            continue;
        }
        let mut tx = Transaction::new(family, table);
        tx.delete(Table {
            family,
            name: table.into(),
            comment: None,
        });
        nft.apply(&tx)?;
        removed.push(format!("table {family} {table}"));
    }
    Ok(removed)
}
