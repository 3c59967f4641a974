//! Helpers for kube-nlproxy's real-kernel tests: throwaway namespaces (`ns`), a small
//! two-node cluster with pods and an external host (`cluster`), and TCP/UDP backends that
//! say who answered and whom they saw (`backend`; their SCTP twins in `sctp`).
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

pub mod apiserver;
pub mod backend;
pub mod baseline;
pub mod bounded;
pub mod cluster;
pub mod controlplane;
pub mod ct_differential;
pub mod deadline;
pub mod differential;
pub mod listing;
pub mod ns;
pub mod realnode;
pub mod scenario;
pub mod sctp;
pub mod seccomp;
pub mod xtables_gen;
