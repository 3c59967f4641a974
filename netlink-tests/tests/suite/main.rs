//! Every kernel, API server, VM and real-node test of kube-nlproxy, in one test binary.
//!
//! `cargo test` runs test binaries one after another and the tests of one binary two at a
//! time (this machine's cores). These tests mostly wait (on a kernel, an API server, a
//! guest, a kubelet): as some thirty binaries in a row they kept the machine 60% idle and
//! took about 1,300 s, the IPVS guest's ~280 s and the real nodes' ~520 s end to end. In
//! one binary the real nodes run on one test thread (`all_real_node_scenarios_in_turn`,
//! first in name order) while the other thread takes everything else, the guest included.
//! A module is one former test file: `cargo test --test suite packets::` runs its tests.
//! Tests here never assume they run alone: each makes its own namespaces, and anything
//! process-wide (a cluster of real nodes) is taken under a lock.

mod apisource;
mod churn;
mod cli;
mod conntrack;
mod conntrack_differential;
mod dead_endpoints;
mod deploy;
mod explain;
mod genl;
mod health;
mod installers;
mod invalid;
mod ipvs;
mod maglev;
mod migration;
mod nft_kernel;
mod no_exec;
mod packets;
mod pipelined;
mod proxier_kernel;
mod real_apiserver;
mod real_nodes;
mod single_stack;
mod startup_checks;
mod status_diff;
mod upstream_differential;
mod upstream_kube_proxy;
mod userspace;

/// The three real-node scenarios (`real_nodes`), one after another: named to sort first, so
/// that the longest run (~520 s) starts at once beside the rest of the suite.
#[test]
fn all_real_node_scenarios_in_turn() {
    real_nodes::in_turn();
}
