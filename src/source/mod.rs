//! Where Kubernetes objects come from. Today: YAML manifests (`--manifests`), the standalone
//! mode used by the quick start and tests. Every source produces [`Snapshot`]s.

pub mod kube;
pub mod manifest;
#[cfg(test)]
mod proptests;
pub mod rest_client;
pub mod yaml;

pub use crate::model::convert::Snapshot;

/// Why a source stopped delivering states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceEnd {
    /// Its receiver went away (the daemon is stopping) or its stream ended.
    Closed,
    /// This node's Node object was deleted: upstream's NodeManager exits then (code 1,
    /// rules left in place) so that the DaemonSet restarts it; the binary does the same.
    NodeDeleted(String),
}
