//! [`NftablesProxier`]: the nftables mode's driver. Turns the model into one ruleset per
//! family and hands the difference from what was last committed to the shared
//! [`TableSync`], one atomic transaction per family. A partial sync rebuilds only the
//! service ports whose inputs changed. Generic over the [`Nftables`] client so unit tests run
//! whole syncs against the fake.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::kernel::conntrack::Conntrack;
use crate::kernel::nft::{render, Family, Nftables, Transaction};
use crate::model::{NodeInfo, ProxyState, ServicePortName};
use crate::proxy::conntrack::{reconcile_conntrack, Destinations};
use crate::proxy::dead_endpoints::reset_dead_endpoint_connections;
use crate::proxy::ruleset::Change;
use crate::proxy::{
    plan_transaction, DetectLocal, LocalDetectorResolver, Proxier, ProxierConfig, SyncError,
    SyncStats, TableSync,
};

use super::plan::{
    build_ruleset, build_ruleset_counted, build_service, nftables_base, release_service_slots,
    BalanceWidths,
};
use super::slots::SlotAllocator;

/// Keeps our table in step with the model.
pub struct NftablesProxier<N: Nftables> {
    nft: N,
    cfg: ProxierConfig,
    local: LocalDetectorResolver,
    families: Vec<Family>,
    table: TableSync,
    need_full: bool,
    last_node_labels: Option<BTreeMap<String, String>>,
    conntrack: Option<Box<dyn Conntrack + Send>>,
    /// The stale-flow cleanup's service destinations, kept between syncs.
    destinations: Destinations,
    /// Delete stale UDP/SCTP entries (not `--no-conntrack-cleanup`; needs `conntrack`).
    stale_cleanup: bool,
    /// `--reset-dead-endpoint-connections`: delete the TCP entries of endpoints that died
    /// (needs `conntrack`).
    reset_dead_endpoints: bool,
    /// The state of the last committed sync: the change detector compares against it. Shared
    /// with the sync loop (an `Arc`), never copied.
    last_state: Option<Arc<ProxyState>>,
    last_cfg: Option<ProxierConfig>,
    last_node: Option<NodeInfo>,
    /// Endpoint-map slots per family, as committed.
    slots: BTreeMap<Family, SlotAllocator>,
    /// Users of each `balance-N` chain per family, as committed.
    widths: BTreeMap<Family, BalanceWidths>,
}

impl<N: Nftables> NftablesProxier<N> {
    pub fn new(nft: N, cfg: ProxierConfig, detect_local: DetectLocal) -> Self {
        NftablesProxier {
            nft,
            table: TableSync::new(cfg.table.clone()),
            cfg,
            local: LocalDetectorResolver::new(detect_local),
            families: Family::all().to_vec(),
            need_full: true,
            last_node_labels: None,
            conntrack: None,
            destinations: Destinations::default(),
            stale_cleanup: true,
            reset_dead_endpoints: false,
            last_state: None,
            last_cfg: None,
            last_node: None,
            slots: BTreeMap::new(),
            widths: BTreeMap::new(),
        }
    }

    /// Programs `families` only (both by default): a host without usable IPv6 runs IPv4
    /// alone.
    pub fn with_families(mut self, families: Vec<Family>) -> Self {
        self.families = families;
        self
    }

    /// Enables the stale UDP/SCTP conntrack cleanup after each successful sync.
    pub fn with_conntrack(mut self, ct: Box<dyn Conntrack + Send>) -> Self {
        self.conntrack = Some(ct);
        self
    }

    /// Whether the stale UDP/SCTP entries are deleted (on with [`Self::with_conntrack`]).
    pub fn with_stale_cleanup(mut self, on: bool) -> Self {
        self.stale_cleanup = on;
        self
    }

    /// Also deletes the TCP conntrack entries of endpoints that died (ready, then gone without
    /// terminating) after each successful sync; needs [`Self::with_conntrack`].
    pub fn with_dead_endpoint_reset(mut self, on: bool) -> Self {
        self.reset_dead_endpoints = on;
        self
    }

    /// The nftables client (tests inspect the fake through it).
    pub fn nft(&mut self) -> &mut N {
        &mut self.nft
    }

    /// The ruleset last committed for `family` (what the kernel holds after a good sync).
    pub fn committed(&self, family: Family) -> Option<&crate::proxy::ruleset::Ruleset> {
        self.table.last(family)
    }

    /// Forces the next sync to be a full one.
    pub fn force_full_sync(&mut self) {
        self.need_full = true;
    }

    /// Whether flushed chains still wait for deletion (the caller syncs again soon).
    pub fn has_pending_deletes(&self) -> bool {
        self.table.has_pending_deletes()
    }

    /// Plans the transactions of a sync without applying them (for `--dry-run` and tests).
    pub fn plan(&mut self, state: &ProxyState) -> Vec<Transaction> {
        let cfg = with_service_cidrs(self.local.resolve(&self.cfg, &state.node), state);
        self.families
            .iter()
            .map(|f| {
                let rs = build_ruleset(state, &cfg, *f);
                plan_transaction(None, &rs, None, &[]).tx
            })
            .collect()
    }

    /// One sync of a state the caller owns (tests); the sync loop uses [`Self::sync_shared`].
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
        let cfg = with_service_cidrs(self.local.resolve(&self.cfg, &state.node), state);
        // The base fragment and every service fragment depend on the config and the Node:
        // when either changes, rebuild everything.
        if self.last_cfg.as_ref() != Some(&cfg) || self.last_node.as_ref() != Some(&state.node) {
            self.need_full = true;
        }
        let full = self.need_full || self.families.iter().any(|f| self.table.last(*f).is_none());
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
                self.table.forget();
                Err(e)
            }
            Ok(()) => {
                self.need_full = false;
                self.last_cfg = Some(cfg);
                self.last_node = Some(state.node.clone());
                let prev = self.last_state.replace(shared.clone());
                self.table.count(&mut stats);
                if let Some(ct) = self.conntrack.as_mut() {
                    if self.stale_cleanup {
                        reconcile_conntrack(
                            ct.as_mut(),
                            state,
                            (&self.families, &mut self.destinations),
                            &mut stats,
                        );
                    }
                    if let Some(prev) = prev.as_deref().filter(|_| self.reset_dead_endpoints) {
                        reset_dead_endpoint_connections(
                            ct.as_mut(),
                            prev,
                            state,
                            &self.families,
                            &mut stats,
                        );
                    }
                }
                if let Some(old) = prev {
                    crate::proxy::reclaim::drop_in_background(old);
                }
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
            let (rs, widths) = build_ruleset_counted(state, cfg, family, &mut slots);
            match self.table.sync(&mut self.nft, rs, true, stats) {
                Ok(()) => {
                    self.slots.insert(family, slots);
                    self.widths.insert(family, widths);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
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
        let changed: Vec<ServicePortName> = match &self.last_state {
            Some(prev) => crate::model::changed_service_ports(prev, state)
                .into_iter()
                .cloned()
                .collect(),
            None => state.services.keys().cloned().collect(),
        };
        let mut first_err = None;
        for family in self.families.clone() {
            let slots = self.slots.entry(family).or_default();
            let maps = slots.maps();
            let build = |spn: &ServicePortName| {
                release_service_slots(spn, slots);
                state.services.get(spn).map(|sp| {
                    let eps = state.endpoints_of(spn);
                    build_service(cfg, &state.node, sp, eps, family, slots)
                })
            };
            // The base follows the `balance-N` chains in use: a service port may be the
            // first to use one or the last to leave it.
            let widths = self.widths.entry(family).or_default();
            let mut next_widths = None;
            let rebase = |changes: &[Change]| {
                let mut w = widths.clone();
                for c in changes {
                    if let Some(old) = &c.old {
                        w.remove(old);
                    }
                    if let Some(new) = &c.new {
                        w.add(new);
                    }
                }
                let base = (!w.same_chains(widths))
                    .then(|| nftables_base(cfg, &state.node, family, maps, &w));
                next_widths = Some(w);
                base
            };
            let res =
                self.table
                    .sync_changes(&mut self.nft, family, &changed, build, rebase, stats);
            match res {
                Ok(()) => {
                    if let Some(w) = next_widths {
                        *widths = w;
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl<N: Nftables> Proxier for NftablesProxier<N> {
    fn sync(&mut self, state: &Arc<ProxyState>) -> Result<SyncStats, SyncError> {
        self.sync_shared(state)
    }
    fn force_full_sync(&mut self) {
        NftablesProxier::force_full_sync(self)
    }
    fn has_pending_work(&self) -> bool {
        self.has_pending_deletes()
    }
    fn dry_run(&mut self, state: &ProxyState) -> Result<String, SyncError> {
        Ok(self.plan(state).iter().map(render::transaction).collect())
    }
    fn cleanup(&mut self) -> Result<Vec<String>, SyncError> {
        crate::proxy::cleanup::delete_tables(&mut self.nft, &[self.cfg.table.as_str()])
    }
}

/// The config a sync of `state` runs with: the local detector resolved for its Node, the
/// ServiceCIDRs added.
pub(crate) fn resolved_config(opts: &crate::proxy::Options, state: &ProxyState) -> ProxierConfig {
    let mut local = LocalDetectorResolver::new(opts.detect_local.clone());
    with_service_cidrs(local.resolve(&opts.proxier, &state.node), state)
}

/// `cfg` with the cluster's service CIDRs: the configured ones and those of its ServiceCIDR
/// objects. They live in the base fragment, so a change makes the next sync a full one.
fn with_service_cidrs(mut cfg: ProxierConfig, state: &ProxyState) -> ProxierConfig {
    if !cfg.drop_unallocated {
        cfg.service_cidrs.clear();
        return cfg;
    }
    cfg.service_cidrs
        .extend(state.service_cidrs.iter().copied());
    cfg.service_cidrs.sort();
    cfg.service_cidrs.dedup();
    cfg
}
