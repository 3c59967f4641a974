//! Every kernel, API server, VM and real-node test of kube-nlproxy, in one test binary.
//!
//! `cargo test` runs test binaries one after another and the tests of one binary two at a
//! time (this machine's cores). These tests mostly wait (on a kernel, an API server, a
//! guest, a kubelet): as some thirty binaries in a row they kept the machine 60% idle and
//! took about 1,300 s, the IPVS guest's ~280 s and the real nodes' ~520 s end to end. In
//! one binary the real nodes and the guest runs share one test
//! (`all_real_node_scenarios_beside_the_vm_runs`, first in name order, a thread each) while
//! the other test thread takes everything else.
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

/// The two longest runs side by side, each on a thread of its own: the three real-node
/// scenarios in turn (`real_nodes::SCENARIOS`, ~570 s with the rest of the suite beside
/// them) and the three guest runs in turn (`ipvs::VM_RUNS`, ~370 s). Named to sort first, so
/// that both start at once while the suite's other thread takes everything else; apart,
/// they held both of its threads for most of the run (871 s, 2026-12-07).
#[test]
fn all_real_node_scenarios_beside_the_vm_runs() {
    let vm = std::thread::Builder::new()
        .name("all_real_node_scenarios_beside_the_vm_runs: vm".into())
        .spawn(|| in_turn("vm", &ipvs::VM_RUNS))
        .expect("the VM runs' thread");
    let mut failed = in_turn("real nodes", &real_nodes::SCENARIOS);
    failed.extend(vm.join().unwrap_or_else(|_| vec!["the VM runs' thread"]));
    assert!(
        failed.is_empty(),
        "failed: {failed:?} (their panics are above)"
    );
}

/// Runs each of `runs` even when one before it failed, timing each; the names of those
/// that failed.
fn in_turn(what: &str, runs: &[(&'static str, fn())]) -> Vec<&'static str> {
    let mut failed = Vec::new();
    for &(name, run) in runs {
        let t0 = std::time::Instant::now();
        let ok = std::panic::catch_unwind(run).is_ok();
        let verdict = if ok { "passed" } else { "FAILED" };
        eprintln!("{what}: {name}: {verdict} in {:?}", t0.elapsed());
        if !ok {
            failed.push(name);
        }
    }
    failed
}
