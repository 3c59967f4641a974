//! What every proxy mode shares (upstream's `pkg/proxy` root): the [`Proxier`] trait the sync
//! loop drives, the bounded-frequency [`runner`], the one nftables table lifecycle
//! ([`table_sync::TableSync`]), the table-diff engine ([`ruleset`]), rule helpers and base
//! chains every mode's table uses ([`rules`]), the conntrack cleanup decision
//! ([`conntrack`]), and [`SyncStats`]/[`SyncError`]. Imports the model and the kernel
//! clients, never a mode.

pub(crate) mod cleanup;
pub mod config;
pub mod conntrack;
pub mod dead_endpoints;
pub mod families;
pub(crate) mod fxhash;
pub mod maglev;
pub mod names;
pub mod reclaim;
pub(crate) mod rules;
pub mod ruleset;
pub mod runner;
pub(crate) mod table_sync;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::kernel::{ipvs, nft, rtnl};
use crate::model::net::Family;
use crate::model::ProxyState;

pub use config::{
    DetectLocal, FamilyNodePorts, LocalDetector, LocalDetectorResolver, LoopbackListeners,
    LoopbackNodePorts, LoopbackPolicy, NodePortAddresses, ProxierConfig, DEFAULT_TABLE,
    TABLE_COMMENT,
};
pub use ruleset::{
    plan_changes, plan_full, plan_transaction, Change, Existing, Fragment, Plan, Ruleset,
};
pub use table_sync::TableSync;

/// A failed sync or cleanup, typed to the layer that failed.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Nothing of that family's transaction was applied.
    #[error("sync of the {family} table failed: {error}")]
    Nft { family: Family, error: nft::Error },
    /// Listing or removing tables at cleanup.
    #[error("nftables: {0}")]
    NftCleanup(nft::Error),
    /// An IPVS request failed; the other changes of the sync were made.
    #[error("IPVS: {0}")]
    Ipvs(#[from] ipvs::Error),
    /// A link or address request failed; the other changes of the sync were made.
    #[error("{0}")]
    Link(#[from] rtnl::Error),
    /// A sysctl the mode cannot work without could not be written.
    #[error("{0}")]
    Sysctl(String),
    /// The dummy link was created but cannot be found.
    #[error("link {0} vanished after creation")]
    LinkVanished(String),
}

/// What the sync loop drives: one per mode (upstream's `Provider`). Implementations are
/// generic over the kernel client traits, so every mode's unit tests run whole syncs against
/// fakes.
pub trait Proxier {
    /// One sync of `state`: full after start, a failure or a config change; partial
    /// otherwise.
    fn sync(&mut self, state: &Arc<ProxyState>) -> Result<SyncStats, SyncError>;
    /// The next sync re-reads the kernel and re-asserts everything.
    fn force_full_sync(&mut self);
    /// Work remains that needs a sync soon (chains to delete, real servers draining).
    fn has_pending_work(&self) -> bool;
    /// What a full sync of `state` would program, as text (`nft` syntax, virtual servers,
    /// listeners); touches nothing.
    fn dry_run(&mut self, state: &ProxyState) -> Result<String, SyncError>;
    /// Removes everything this mode created; returns what was removed, one line each.
    fn cleanup(&mut self) -> Result<Vec<String>, SyncError>;
}

impl<P: Proxier + ?Sized> Proxier for Box<P> {
    fn sync(&mut self, state: &Arc<ProxyState>) -> Result<SyncStats, SyncError> {
        (**self).sync(state)
    }
    fn force_full_sync(&mut self) {
        (**self).force_full_sync()
    }
    fn has_pending_work(&self) -> bool {
        (**self).has_pending_work()
    }
    fn dry_run(&mut self, state: &ProxyState) -> Result<String, SyncError> {
        (**self).dry_run(state)
    }
    fn cleanup(&mut self) -> Result<Vec<String>, SyncError> {
        (**self).cleanup()
    }
}

impl SyncStats {
    /// The operations sent to `family`'s table (0 when none), for log fields of their own
    /// (`ipv4_ops=… ipv6_ops=…`) rather than a Rust map's debug form.
    pub fn ops_of(&self, family: Family) -> usize {
        self.ops.get(&family).copied().unwrap_or(0)
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
    /// The same per family.
    pub conntrack_deleted_by_family: BTreeMap<Family, usize>,
    /// Time spent reconciling conntrack.
    pub conntrack_duration: Option<std::time::Duration>,
    /// IPVS mode: virtual server, real server and address changes made.
    pub ipvs_changes: usize,
    /// IPVS mode: virtual servers in place after the sync.
    pub virtual_servers: usize,
    /// IPVS mode: virtual or real servers we had applied that a full sync found missing
    /// (removed by someone else; IPVS sends no notifications) and restored.
    pub restored: usize,
    /// Userspace mode: its listeners after the sync (served at `/userspace/listeners` for
    /// `explain`, which sees only the redirect to a port in the kernel).
    pub listeners: Option<Arc<Vec<ListenerInfo>>>,
}

impl SyncStats {
    /// Counts `n` conntrack entries of `family` deleted.
    pub fn count_conntrack_deleted(&mut self, family: Family, n: usize) {
        self.conntrack_deleted += n;
        *self.conntrack_deleted_by_family.entry(family).or_default() += n;
    }
}

/// One userspace-mode listener: where the redirect table sends a service port, and the
/// endpoints the listener forwards to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ListenerInfo {
    /// `ns/name:port/protocol`.
    pub service: String,
    /// Serves external traffic (NodePorts, externalIPs, LoadBalancer IPs) rather than
    /// ClusterIPs.
    pub external: bool,
    pub ipv4: bool,
    pub port: u16,
    pub endpoints: Vec<std::net::SocketAddr>,
    /// ClientIP affinity timeout, seconds.
    pub affinity_seconds: Option<u64>,
}

/// What every mode is opened with.
#[derive(Debug, Clone)]
pub struct Options {
    pub proxier: ProxierConfig,
    pub detect_local: DetectLocal,
    /// How often a sync re-lists the kernel and re-asserts everything.
    pub sync_period: std::time::Duration,
    /// Delete stale UDP/SCTP conntrack entries after syncs (not `--no-conntrack-cleanup`).
    pub conntrack_cleanup: bool,
    /// `--reset-dead-endpoint-connections`: delete the TCP entries of endpoints that died.
    pub reset_dead_endpoint_connections: bool,
    /// The IP families to program, primary first ([`families`]): both, unless the host has
    /// no usable IPv6.
    pub families: Vec<Family>,
}
