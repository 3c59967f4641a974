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
use std::sync::Arc;

use crate::model::{Endpoint, NodeInfo, ServicePortName};
use crate::proxier::plan::{build_service, release_service_slots};
use crate::proxier::{
    build_ruleset, build_ruleset_with_slots, names, plan_changes, plan_full, plan_transaction,
    Change, Existing, Fragment, LocalDetector, ProxierConfig, Ruleset, SlotAllocator,
};

/// A failed sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Nothing of that family's transaction was applied.
    #[error("sync of the {family} table failed: {error}")]
    Nft { family: Family, error: nft::Error },
    /// An IPVS or rtnetlink request failed; the other changes of the sync were made.
    #[error("IPVS sync: {0}")]
    Ipvs(String),
}

/// Deletes conntrack entries that point at endpoints the state no longer serves. A failure
/// is logged and retried at the next sync; it never undoes the rules.
pub fn reconcile_conntrack(
    ct: &mut (dyn Conntrack + Send),
    state: &ProxyState,
    families: &[Family],
    stats: &mut SyncStats,
) {
    let t0 = std::time::Instant::now();
    for family in families {
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

/// What the sync loop drives: the nftables [`Syncer`] or the IPVS reconciler.
pub trait Backend {
    fn sync(&mut self, state: &Arc<ProxyState>) -> Result<SyncStats, SyncError>;
    /// The next sync re-reads the kernel and re-asserts everything.
    fn force_full_sync(&mut self);
    /// Work remains that needs a sync soon (chains to delete, real servers draining).
    fn has_pending_work(&self) -> bool;
}

impl<N: Nftables> Backend for Syncer<N> {
    fn sync(&mut self, state: &Arc<ProxyState>) -> Result<SyncStats, SyncError> {
        Syncer::sync_shared(self, state)
    }
    fn force_full_sync(&mut self) {
        Syncer::force_full_sync(self)
    }
    fn has_pending_work(&self) -> bool {
        self.has_pending_deletes()
    }
}

impl<I: crate::ipvs::Ipvs, L: crate::rtnl::Links, N: Nftables> Backend
    for crate::ipvs::reconciler::IpvsReconciler<I, L, N>
{
    fn sync(&mut self, state: &Arc<ProxyState>) -> Result<SyncStats, SyncError> {
        crate::ipvs::reconciler::IpvsReconciler::sync(self, state)
    }
    fn force_full_sync(&mut self) {
        crate::ipvs::reconciler::IpvsReconciler::force_full_sync(self)
    }
    fn has_pending_work(&self) -> bool {
        crate::ipvs::reconciler::IpvsReconciler::has_pending_work(self)
    }
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
    /// IPVS mode: virtual server, real server and address changes made.
    pub ipvs_changes: usize,
    /// IPVS mode: virtual servers in place after the sync.
    pub virtual_servers: usize,
    /// IPVS mode: virtual or real servers we had applied that a full sync found missing
    /// (removed by someone else; IPVS sends no notifications) and restored.
    pub restored: usize,
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
    /// The state of the last committed sync: the change detector compares against it. Shared
    /// with the sync loop (an `Arc`), never copied.
    last_state: Option<Arc<ProxyState>>,
    last_cfg: Option<ProxierConfig>,
    last_node: Option<NodeInfo>,
    /// Endpoint-map slots per family, as committed.
    slots: BTreeMap<Family, SlotAllocator>,
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
            last_state: None,
            last_cfg: None,
            last_node: None,
            slots: BTreeMap::new(),
        }
    }

    /// Enables the stale UDP/SCTP conntrack cleanup after each successful sync.
    pub fn with_conntrack(mut self, ct: Box<dyn Conntrack + Send>) -> Self {
        self.conntrack = Some(ct);
        self
    }

    fn reconcile_conntrack(&mut self, state: &ProxyState, stats: &mut SyncStats) {
        if let Some(ct) = self.conntrack.as_mut() {
            reconcile_conntrack(ct.as_mut(), state, &self.families, stats);
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

    /// One sync of a state the caller owns (tests); the sync loop uses [`sync_shared`].
    pub fn sync(&mut self, state: &ProxyState) -> Result<SyncStats, SyncError> {
        self.sync_shared(&Arc::new(state.clone()))
    }

    /// One sync: full after start, a failure or a node label change; partial otherwise.
    pub fn sync_shared(&mut self, shared: &Arc<ProxyState>) -> Result<SyncStats, SyncError> {
        let state: &ProxyState = shared;
        if self.last_node_labels.as_ref() != Some(&state.node.labels) {
            if self.last_node_labels.is_some() {
                tracing::info!("node labels changed; doing a full sync");
            }
            self.need_full = true;
            self.last_node_labels = Some(state.node.labels.clone());
        }
        let cfg = self.effective_config(state);
        // The base fragment and every service fragment depend on the config and the Node:
        // when either changes, rebuild everything.
        if self.last_cfg.as_ref() != Some(&cfg) || self.last_node.as_ref() != Some(&state.node) {
            self.need_full = true;
        }
        let full = self.need_full || self.families.iter().any(|f| !self.last.contains_key(f));
        let mut stats = SyncStats {
            full,
            ..Default::default()
        };
        let res = if full {
            self.sync_full(state, &cfg, &mut stats)
        } else {
            self.sync_partial(state, &cfg, &mut stats)
        };
        match res {
            Err(e) => {
                // The kernel kept the previous ruleset; forget what we thought was there so
                // the next sync re-asserts everything.
                self.need_full = true;
                self.last.clear();
                Err(e)
            }
            Ok(()) => {
                self.need_full = false;
                self.last_cfg = Some(cfg);
                self.last_node = Some(state.node.clone());
                self.last_state = Some(shared.clone());
                for rs in self.last.values() {
                    stats.rules += rs.rule_count();
                    stats.elements += rs.element_count();
                }
                self.reconcile_conntrack(state, &mut stats);
                Ok(stats)
            }
        }
    }

    fn sync_full(
        &mut self,
        state: &ProxyState,
        cfg: &ProxierConfig,
        stats: &mut SyncStats,
    ) -> Result<(), SyncError> {
        let mut first_err = None;
        for family in self.families.clone() {
            let mut slots = SlotAllocator::for_services(state.services.len());
            let rs = build_ruleset_with_slots(state, cfg, family, &mut slots);
            let existing = match self.list_existing(family) {
                Ok(e) => e,
                Err(error) => {
                    first_err.get_or_insert(SyncError::Nft { family, error });
                    continue;
                }
            };
            let pending = self
                .pending_deletes
                .get(&family)
                .cloned()
                .unwrap_or_default();
            let plan = plan_full(&rs, Some(&existing), &pending);
            stats.ops.insert(family, plan.tx.num_ops());
            match self.nft.apply(&plan.tx) {
                Ok(()) => {
                    self.last.insert(family, rs);
                    self.slots.insert(family, slots);
                    self.pending_deletes.insert(family, plan.stale_chains);
                }
                Err(error) => {
                    first_err.get_or_insert(SyncError::Nft { family, error });
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Rebuilds only the fragments of service ports whose inputs changed. Detecting them is
    /// one equality check per service port; planning and kernel work follow the change.
    fn sync_partial(
        &mut self,
        state: &ProxyState,
        cfg: &ProxierConfig,
        stats: &mut SyncStats,
    ) -> Result<(), SyncError> {
        let none = Vec::new();
        let changed: Vec<ServicePortName> = match &self.last_state {
            Some(prev) => changed_service_ports(prev, state)
                .into_iter()
                .cloned()
                .collect(),
            None => state.services.keys().cloned().collect(),
        };
        let mut first_err = None;
        for family in self.families.clone() {
            let Some(last) = self.last.get(&family) else {
                continue;
            };
            let slots = self.slots.entry(family).or_default();
            let changes: Vec<Change> = changed
                .iter()
                .map(|spn| {
                    release_service_slots(spn, slots);
                    let new = state.services.get(spn).map(|sp| {
                        let eps = state.endpoints.get(spn).unwrap_or(&none);
                        build_service(cfg, &state.node, sp, eps, family, slots)
                    });
                    Change {
                        name: spn.clone(),
                        old: last.services.get(spn).cloned(),
                        new: new.filter(|f| *f != Fragment::default()).map(Arc::new),
                    }
                })
                .collect();
            let pending = self
                .pending_deletes
                .get(&family)
                .cloned()
                .unwrap_or_default();
            let base = last.base.clone();
            let plan = plan_changes(last, &base, &changes, &pending);
            stats.ops.insert(family, plan.tx.num_ops());
            let t_apply = std::time::Instant::now();
            let applied = self.nft.apply(&plan.tx);
            tracing::debug!(%family, ops = plan.tx.num_ops(), apply = ?t_apply.elapsed(), "partial sync applied");
            match applied {
                Ok(()) => {
                    let last = self.last.get_mut(&family).expect("checked above");
                    for c in changes {
                        last.set_service(&c.name, c.new);
                    }
                    self.pending_deletes.insert(family, plan.stale_chains);
                }
                Err(error) => {
                    first_err.get_or_insert(SyncError::Nft { family, error });
                }
            }
        }
        first_err.map_or(Ok(()), Err)
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

/// The change detector: service ports whose Service or endpoints differ between the last
/// committed state and `state`, or that exist in only one of them. All four maps are sorted
/// by service port, so this is one merged walk without lookups.
fn changed_service_ports<'a>(
    prev: &'a ProxyState,
    state: &'a ProxyState,
) -> Vec<&'a ServicePortName> {
    // The endpoints of `k` from a sorted iterator that is advanced up to `k`.
    fn eps_at<'b>(
        it: &mut std::iter::Peekable<
            std::collections::btree_map::Iter<'b, ServicePortName, Vec<Endpoint>>,
        >,
        k: &ServicePortName,
    ) -> &'b [Endpoint] {
        while it.peek().is_some_and(|(x, _)| *x < k) {
            it.next();
        }
        match it.peek() {
            Some((x, v)) if *x == k => v.as_slice(),
            _ => &[],
        }
    }
    let mut out = Vec::new();
    let mut old = prev.services.iter().peekable();
    let (mut old_eps, mut new_eps) = (
        prev.endpoints.iter().peekable(),
        state.endpoints.iter().peekable(),
    );
    for (spn, sp) in &state.services {
        while old.peek().is_some_and(|(k, _)| *k < spn) {
            out.push(old.next().expect("peeked").0);
        }
        let same_service = match old.peek() {
            Some((k, s)) if *k == spn => {
                let same = *s == sp;
                old.next();
                same
            }
            _ => false,
        };
        if !same_service || eps_at(&mut old_eps, spn) != eps_at(&mut new_eps, spn) {
            out.push(spn);
        }
    }
    out.extend(old.map(|(k, _)| k));
    out
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
        let mut tx = Transaction::new(family, UPSTREAM_TABLE);
        tx.delete(Table {
            family,
            name: UPSTREAM_TABLE.into(),
            comment: None,
        });
        nft.apply(&tx)?;
        removed.push(format!("table {family} {UPSTREAM_TABLE}"));
    }
    Ok(removed)
}
