//! Where Kubernetes objects come from. Today: YAML manifests (`--manifests`), the standalone
//! mode used by the quick start and tests. Every source produces [`Snapshot`]s.

pub mod kube;
pub mod manifest;
#[cfg(test)]
mod proptests;
pub mod rest_client;
pub mod yaml;

pub use crate::model::convert::Snapshot;
