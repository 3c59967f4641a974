//! Issue #50's soak in the short form CI runs: `kernel-bench --soak 3 1000x10`, ours through
//! the real API server for three minutes of endpoint and Service churn, six API server
//! restarts (one into 410 Gone), tampering every 15 s, held TCP and UDP flows and a
//! conntrack table near its limit. The goals three minutes can judge must hold; the memory
//! and latency rows are measured and shown (the hour's run judges them).
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::process::Command;
use std::time::Duration;

use netlink_tests::bounded::OutputWithin;
use netlink_tests::ns::require_root;

#[test]
fn three_minutes_of_churn_restarts_and_tampering_meet_every_goal() {
    require_root();
    // The shipped binary, as the hour's run soaks a release build: the debug build takes
    // ~10× the CPU per sync and falls behind 100 changes a second (2-6 s latencies).
    let image = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/x86_64-unknown-linux-gnu/image/kube-nlproxy"
    );
    assert!(
        std::path::Path::new(image).exists(),
        "{image}: build it first with `cargo xtask image` (README's test command does)"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kernel-bench"))
        .args(["--soak", "3", "1000x10"])
        .env("KUBE_NLPROXY_BIN", image)
        // Bring-up (~30 s), the three minutes, the final comparison; 10 minutes at most.
        .output_within(Duration::from_secs(600))
        .expect("run kernel-bench --soak");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    // 0: every goal met; 1: one missed (the rows say which); anything else is a failure of
    // the run itself (a panic, a setup that did not come up).
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{}\n{stdout}\n{stderr}",
        out.status
    );
    let row = |name: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {name}")))
            .unwrap_or_else(|| panic!("no row {name:?}:\n{stdout}\n{stderr}"))
            .to_string()
    };
    // What three minutes can judge: no held echo failed, every tampering undone, nothing
    // missed against a fresh --once, no descriptor or thread more at the end.
    for name in [
        "held flows through a Service",
        "tamperings undone by ours",
        "missed changes",
        "fds:",
        "threads:",
    ] {
        let r = row(name);
        assert!(r.ends_with("| yes |"), "{r}\n{stdout}\n{stderr}");
        eprintln!("{r}");
    }
    // Memory growth and latency drift are judged by the hour's run (BENCHMARKS.md): over
    // three minutes the RSS floor moved 15% and the p99 of 30-s windows 1.8 s to 3.2 s
    // between two runs of the same commit, so here they are measured and shown, not held.
    for name in [
        "RSS floor after the first",
        "heap after the first",
        "network programming latency p99",
    ] {
        eprintln!("{}", row(name));
    }
}
