//! Where Kubernetes objects come from: YAML manifests (`--manifests`) or the API server
//! (`kube/`). Every source produces [`Snapshot`]s, and `convert/` turns API objects into the
//! model's service ports and endpoints: the model knows no API type.

pub mod convert;
#[cfg(any(test, feature = "testing"))]
pub mod fixtures;
pub mod kube;
pub mod manifest;
#[cfg(test)]
mod proptests;
pub mod rest_client;
pub mod yaml;

use crate::model::warning::ObjectWarning;
pub use convert::Snapshot;

/// Logs a problem with one object as one line: a fixed message, the object in upstream's
/// field for its kind (`service="ns/name"`, `endpointSlice=…`, `node=…`, `serviceCIDR=…`),
/// and the problem with what was done about it.
pub fn log_object_warning(w: &ObjectWarning) {
    // tracing's field names are static: one arm per kind, one message for all.
    let (o, p) = (w.object.as_str(), w.problem.as_str());
    match w.field() {
        "service" => tracing::warn!(service = o, problem = p, "object not fully usable"),
        "endpointSlice" => {
            tracing::warn!(endpointSlice = o, problem = p, "object not fully usable")
        }
        "node" => tracing::warn!(node = o, problem = p, "object not fully usable"),
        "serviceCIDR" => tracing::warn!(serviceCIDR = o, problem = p, "object not fully usable"),
        _ => tracing::warn!(
            kind = w.kind,
            object = o,
            problem = p,
            "object not fully usable"
        ),
    }
}

/// Why a source stopped delivering states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceEnd {
    /// Its receiver went away (the daemon is stopping) or its stream ended.
    Closed,
    /// This node's Node object was deleted: upstream's NodeManager exits then (code 1,
    /// rules left in place) so that the DaemonSet restarts it; the binary does the same.
    NodeDeleted(String),
}
