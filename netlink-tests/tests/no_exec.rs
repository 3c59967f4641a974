//! The daemon execs nothing: run it under strace (a test-time tool) through a full sync, a
//! daemon start-up with a manifest edit, and a cleanup, and count execve calls.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools
#![allow(unsafe_code)] // kill(2), setns(2), geteuid(2) and socket calls on test processes

use netlink_tests::bounded::{OutputWithin, TEST_LIMIT};
use std::process::Command;
use std::time::Duration;

use netlink_tests::cluster::proxy_bin_bare as proxy_bin;
use netlink_tests::ns::{require_root, NetNs};
use netlink_tests::seccomp::SeccompState;

fn execs(trace: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(trace)
        .unwrap()
        .lines()
        .filter(|l| l.contains("execve("))
        .map(str::to_owned)
        .collect()
}

/// `ip netns exec NS strace -f -qq -e trace=execve -o TRACE` (program and arguments follow).
fn traced(ns: &NetNs, trace: &std::path::Path) -> Command {
    let mut c = Command::new("ip");
    c.args([
        "netns",
        "exec",
        &ns.name,
        "strace",
        "-f",
        "-qq",
        "-e",
        "trace=execve",
        "-o",
    ])
    .arg(trace);
    c
}

#[test]
fn binary_execs_nothing() {
    require_root();
    let ns = NetNs::new("noexec");
    let dir = std::env::temp_dir().join(format!("nlp-noexec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let manifests = dir.join("cluster.yaml");
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster.yaml");
    std::fs::copy(&example, &manifests).unwrap();
    let bin = proxy_bin();
    let runs: [&[&str]; 2] = [
        &[
            "--manifests",
            manifests.to_str().unwrap(),
            "--hostname-override",
            "node1",
            "--once",
        ],
        &["--cleanup"],
    ];
    for (i, args) in runs.iter().enumerate() {
        let trace = dir.join(format!("trace{i}"));
        let st = traced(&ns, &trace)
            .arg(&bin)
            .args(*args)
            .output_within(TEST_LIMIT)
            .unwrap()
            .status;
        assert!(st.success(), "{args:?}");
        let e = execs(&trace);
        assert_eq!(e.len(), 1, "only strace's own exec of the binary: {e:?}");
        assert!(e[0].contains("kube-nlproxy"), "{e:?}");
    }
    // The daemon, including a manifest reload and SIGTERM.
    let trace = dir.join("trace-daemon");
    let mut child = traced(&ns, &trace)
        .arg(&bin)
        .args([
            "--manifests",
            manifests.to_str().unwrap(),
            "--hostname-override",
            "node1",
        ])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let text = std::fs::read_to_string(&example)
        .unwrap()
        .replace("10.96.0.99", "10.96.0.98");
    std::fs::write(&manifests, text).unwrap();
    let t0 = std::time::Instant::now();
    while !ns
        .sh("nft list table ip kube-nlproxy")
        .contains("10.96.0.98")
    {
        assert!(t0.elapsed() < Duration::from_secs(5), "edit not picked up");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Signal the traced daemon itself (strace would only detach on SIGTERM).
    let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id())).unwrap();
    let daemon: i32 = kids
        .split_whitespace()
        .next()
        .expect("daemon pid")
        .parse()
        .unwrap();
    // SAFETY: signalling a process this test started.
    unsafe { libc::kill(daemon, libc::SIGTERM) };
    child.wait().unwrap();
    let e = execs(&trace);
    assert_eq!(e.len(), 1, "{e:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn runs_with_only_cap_net_admin() {
    require_root();
    let ns = NetNs::new("caps");
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster.yaml");
    // Ask for a larger nf_conntrack_max than the host has: outside the host namespace that
    // knob is read-only, so the daemon must warn and carry on.
    let cfg = std::env::temp_dir().join(format!("nlp-caps-{}.yaml", std::process::id()));
    std::fs::write(
        &cfg,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nconntrack:\n  maxPerCore: 4000000\n",
    )
    .unwrap();
    // Root, but every capability except CAP_NET_ADMIN dropped from the bounding set before
    // exec, so the daemon's permitted and effective sets hold CAP_NET_ADMIN alone.
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.name,
            "setpriv",
            "--bounding-set=-all,+net_admin",
            "--inh-caps=-all",
        ])
        .arg(proxy_bin())
        .args([
            "--manifests",
            example.to_str().unwrap(),
            "--hostname-override",
            "node1",
            "--once",
        ])
        .args(["--config", cfg.to_str().unwrap()])
        .env("RUST_LOG", netlink_tests::cluster::DAEMON_LOG)
        .output_within(TEST_LIMIT)
        .unwrap();
    let _ = std::fs::remove_file(&cfg);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("synced once"), "{err}");
    // nf_conntrack_max is global and read-only here: a warning, not a failure.
    assert!(err.contains("nf_conntrack_max"), "{err}");
    let listed = ns.sh("nft list table ip kube-nlproxy");
    assert!(listed.contains("10.96.0.10"), "{listed}");
    let status = ns.sh("cat /proc/self/status");
    assert!(status.contains("CapBnd"), "sanity: {status}");
}

/// `Seccomp:` and `Seccomp_filters:` of /proc/PID/status, once the daemon is up.
fn seccomp_status(ns: &NetNs, extra: &[&str]) -> SeccompState {
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster.yaml");
    let child = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(proxy_bin())
        .args([
            "--manifests",
            example.to_str().unwrap(),
            "--hostname-override",
            "node1",
        ])
        .args(extra)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !ns.sh("nft list tables").contains("kube-nlproxy") {
        assert!(t0.elapsed() < Duration::from_secs(10), "no first sync");
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    netlink_tests::bounded::terminate_within(child, TEST_LIMIT, "the daemon after SIGTERM");
    SeccompState::of(&status)
}

/// Issue #55.4: the daemon runs in seccomp's filter mode (2) with its one filter, installed
/// before its threads start (`Seccomp:` is per thread; /proc/PID/status is the main one's,
/// and the filter is put on all with TSYNC), and `--no-exec-filter` leaves it out.
#[test]
fn the_daemon_runs_under_its_exec_filter() {
    require_root();
    let ns = NetNs::new("execflt");
    assert_eq!(seccomp_status(&ns, &[]).mode_and_filters(), ("2", "1"));
    ns.sh("nft flush ruleset");
    let off = seccomp_status(&ns, &["--no-exec-filter"]);
    assert_eq!(off.mode_and_filters(), ("0", "0"));
}

/// The daemon's exec filter refuses exec with EPERM: a child that installs the same program
/// just before its exec fails to start, the same child without it runs.
#[test]
fn the_exec_filter_refuses_exec() {
    use std::os::unix::process::CommandExt;
    let program = kube_nlproxy::app::exec_filter::native_exec_filter().unwrap();
    let mut plain = Command::new("/bin/true");
    assert!(plain.status().unwrap().success(), "control");
    let mut filtered = Command::new("/bin/true");
    // SAFETY: between fork and exec the closure only makes the prctl and seccomp calls of
    // apply_filter on a program built before the fork (no allocation, no lock).
    unsafe {
        filtered.pre_exec(move || {
            seccompiler::apply_filter(&program).map_err(|e| std::io::Error::other(e.to_string()))
        });
    }
    let e = filtered.status().expect_err("exec refused");
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
}
