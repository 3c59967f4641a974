//! The binary's command line: exit codes, error lines, and the `--dry-run` golden output.
//! Needs no root.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use netlink_tests::bounded::{OutputWithin, TEST_LIMIT};
use std::process::Command;

fn bin() -> Command {
    Command::new(netlink_tests::cluster::proxy_bin())
}

fn example() -> String {
    format!("{}/../examples/cluster.yaml", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn bad_flag_value_is_one_line_and_exit_code_2() {
    let out = bin()
        .args(["--cluster-cidr", "10.0.0.0/40", "--hostname-override", "n"])
        .output_within(TEST_LIMIT)
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--cluster-cidr"), "{err}");
}

#[test]
fn unknown_flag_exits_2() {
    let out = bin()
        .arg("--no-such-flag")
        .output_within(TEST_LIMIT)
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn missing_source_is_explained() {
    let out = bin()
        .args(["--hostname-override", "n", "--dry-run"])
        .env_remove("KUBECONFIG")
        .env("HOME", "/nonexistent")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output_within(TEST_LIMIT)
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--kubeconfig") && err.contains("--manifests"),
        "{err}"
    );
}

#[test]
fn bad_master_url_exits_2() {
    let out = bin()
        .args(["--hostname-override", "n", "--master", "nope"])
        .output_within(TEST_LIMIT)
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--master"));
}

#[test]
fn dry_run_matches_golden_output() {
    let out = bin()
        .args([
            "--manifests",
            &example(),
            "--hostname-override",
            "node1",
            "--cluster-cidr",
            "10.244.0.0/16",
            "--dry-run",
        ])
        .env("RUST_LOG", "off")
        .output_within(TEST_LIMIT)
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = String::from_utf8(out.stdout).unwrap();
    let golden_path = format!("{}/tests/golden/cluster.nft", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden_path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&golden_path).unwrap();
    assert_eq!(
        got, want,
        "dry-run output changed; rerun with UPDATE_GOLDEN=1 if intended"
    );
}

#[test]
fn write_config_to_round_trips_through_config() {
    let dir = std::env::temp_dir().join(format!("nlp-wc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("a.yaml"), dir.join("b.yaml"));
    let out = bin()
        .args([
            "--hostname-override",
            "node7",
            "--cluster-cidr",
            "10.244.0.0/16",
            "--masquerade-bit",
            "12",
        ])
        .args([
            "--sync-period",
            "45s",
            "--nodeport-addresses",
            "primary",
            "--write-config-to",
            a.to_str().unwrap(),
        ])
        .output_within(TEST_LIMIT)
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = bin()
        .args([
            "--config",
            a.to_str().unwrap(),
            "--write-config-to",
            b.to_str().unwrap(),
        ])
        .output_within(TEST_LIMIT)
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ta, tb) = (
        std::fs::read_to_string(&a).unwrap(),
        std::fs::read_to_string(&b).unwrap(),
    );
    assert_eq!(ta, tb);
    assert!(
        ta.contains("masqueradeBit: 12")
            && ta.contains("syncPeriod: 45s")
            && ta.contains("hostnameOverride: node7"),
        "{ta}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn config_file_edit_makes_the_daemon_exit_and_oom_score_is_set() {
    netlink_tests::ns::require_root();
    let ns = netlink_tests::ns::NetNs::new("cfgchg");
    let dir = std::env::temp_dir().join(format!("nlp-cc-{}", ns.name));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("kp.yaml");
    std::fs::write(&cfg, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\noomScoreAdj: 500\n").unwrap();
    let child = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(netlink_tests::cluster::proxy_bin())
        .args([
            "--config",
            cfg.to_str().unwrap(),
            "--manifests",
            &example(),
            "--hostname-override",
            "node1",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    loop {
        let adj = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", child.id()))
            .unwrap_or_default();
        // (Raising it needs no privilege; lowering it needs CAP_SYS_RESOURCE.)
        if adj.trim() == "500" {
            break;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(5),
            "oom_score_adj never set: {adj}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::fs::write(&cfg, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\noomScoreAdj: 501\n").unwrap();
    let out = netlink_tests::bounded::wait_with_output_within(
        child,
        std::time::Duration::from_secs(30),
        "the daemon after its config file changed",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("configuration file changed"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn json_logs_are_json() {
    let dir = std::env::temp_dir().join(format!("nlp-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    )
    .unwrap();
    let out = bin()
        .args([
            "--manifests",
            bad.to_str().unwrap(),
            "--hostname-override",
            "n",
            "--dry-run",
            "--logging-format",
            "json",
        ])
        .env_remove("RUST_LOG")
        .output_within(TEST_LIMIT)
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("ConfigMap"))
        .unwrap_or_else(|| panic!("no warning: {err}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    // component-base's schema: ts, caller, msg, v (warnings are V(0) info lines in klog)
    // ts in milliseconds since the epoch (component-base's epochMillisTimeEncoder); the
    // caller as zap's short caller, directory and file.
    assert!(v["ts"].as_f64().is_some_and(|t| t > 1.7e12), "{line}");
    assert!(
        v["caller"]
            .as_str()
            .is_some_and(|c| c.contains(".rs:") && c.contains('/')),
        "{line}"
    );
    // A fixed message, the document's problem as a field.
    assert_eq!(v["msg"], "manifest content skipped", "{line}");
    assert!(
        v["problem"]
            .as_str()
            .is_some_and(|m| m.contains("ConfigMap")),
        "{line}"
    );
    assert_eq!(v["v"], 0, "{line}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Durations beyond Go's range (±292 years) are rejected as Go rejects them: exit 2 with one
/// line naming the flag, or the config file field, never a panic.
#[test]
fn overflowing_durations_exit_2_naming_the_flag_or_field() {
    for (flag, value) in [
        ("--sync-period", "99999999999999999999h"),
        ("--min-sync-period", "18446744073709551616s"),
        ("--config-sync-period", "9223372036854775808ns"),
        ("--ipvs-tcp-timeout", "3000000h"),
    ] {
        let out = bin()
            .args([
                "--hostname-override",
                "n",
                "--manifests",
                &example(),
                "--dry-run",
            ])
            .args([flag, value])
            .output_within(TEST_LIMIT)
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(flag) && err.contains("invalid duration"),
            "{err}"
        );
    }
    let dir = std::env::temp_dir().join(format!("knp-dur-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (field, yaml) in [
        (
            "configSyncPeriod",
            "configSyncPeriod: 18446744073709551616s\n",
        ),
        (
            "nftables.syncPeriod",
            "nftables: {syncPeriod: 99999999999999999999h}\n",
        ),
        ("ipvs.udpTimeout", "ipvs: {udpTimeout: 3000000h}\n"),
    ] {
        let path = dir.join("config.yaml");
        std::fs::write(
            &path,
            format!("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{yaml}"),
        )
        .unwrap();
        let out = bin()
            .args([
                "--hostname-override",
                "n",
                "--manifests",
                &example(),
                "--dry-run",
            ])
            .arg("--config")
            .arg(&path)
            .output_within(TEST_LIMIT)
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{field}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(&format!("field {field}")), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `--manifests` path that cannot be used is exit 2 with one line, never an empty ruleset:
/// a typo, a symlink loop, a FIFO (refused without blocking), a device.
#[test]
fn unusable_manifest_paths_exit_2_with_one_line() {
    let dir = std::env::temp_dir().join(format!("knp-mf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(dir.join("loop"), dir.join("loop")).unwrap();
    let fifo = dir.join("fifo.yaml");
    let st = Command::new("mkfifo")
        .arg(&fifo)
        .output_within(TEST_LIMIT)
        .unwrap();
    assert!(st.status.success());
    for (path, says) in [
        (dir.join("typo.yaml"), "No such file"),
        (dir.join("loop"), "symbolic links"),
        (fifo.clone(), "a FIFO"),
        ("/dev/zero".into(), "character device"),
    ] {
        for mode in ["--dry-run", "--once"] {
            let out = bin()
                .args(["--hostname-override", "n", mode, "--manifests"])
                .arg(&path)
                .output_within(std::time::Duration::from_secs(20))
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{path:?} {mode}: {err}");
            let last = err.lines().last().unwrap_or("");
            assert!(
                last.contains(&*path.to_string_lossy()) && last.contains(says),
                "{path:?}: {err}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGTERM while the daemon is still starting (here: parsing 4,000 Services) ends it
/// cleanly with exit 0, not by the signal; a config file edited meanwhile is noticed.
#[test]
fn sigterm_and_config_edits_during_start_up_are_honoured() {
    netlink_tests::ns::require_root();
    let ns = netlink_tests::ns::NetNs::new("sigstart");
    let dir = std::env::temp_dir().join(format!("nlp-ss-{}", ns.name));
    std::fs::create_dir_all(&dir).unwrap();
    let mut y = String::new();
    for i in 0..4000 {
        y += &format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: bulk}}\nspec:\n  clusterIP: 10.96.{}.{}\n  ports: [{{name: p, port: 80, protocol: TCP}}]\n",
            i / 250,
            i % 250 + 1
        );
    }
    let manifests = dir.join("big.yaml");
    std::fs::write(&manifests, y).unwrap();
    // A config edit made while it starts is noticed too: exit 1 asking for a restart.
    let cfg = dir.join("kp.yaml");
    std::fs::write(
        &cfg,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n",
    )
    .unwrap();
    // The daemon on the big manifests, with `extra` arguments, stderr captured.
    let spawn = |extra: &[&std::ffi::OsStr]| {
        Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .arg(netlink_tests::cluster::proxy_bin())
            .args(["--hostname-override", "node1", "--manifests"])
            .arg(&manifests)
            .args([
                "--healthz-bind-address",
                "127.0.0.1:0",
                "--metrics-bind-address",
                "127.0.0.1:0",
            ])
            .args(extra)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let child = spawn(&["--config".as_ref(), cfg.as_os_str()]);
    // After it has read the file: an edit made earlier is simply what it loads (a fixed 60 ms
    // after `ip netns exec` was not enough on a loaded machine).
    wait_started(child.id(), true);
    std::fs::write(
        &cfg,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\noomScoreAdj: 7\n",
    )
    .unwrap();
    let out = netlink_tests::bounded::wait_with_output_within(
        child,
        std::time::Duration::from_secs(20),
        "the daemon after a config edit during start-up",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("configuration file changed"), "{err}");
    for delay_ms in [50u64, 150, 400] {
        let child = spawn(&[]);
        // Counted from the exec: a SIGTERM before it would end `ip netns exec` instead.
        wait_started(child.id(), false);
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        let out = netlink_tests::bounded::terminate_within(
            child,
            std::time::Duration::from_secs(20),
            "the daemon after SIGTERM during start-up",
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(0),
            "SIGTERM {delay_ms} ms after start: {:?}\n{err}",
            out.status
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kube-nlproxy --help | head -0`: output to a pipe nobody reads ends quietly, without the
/// panic `print!` gives (Go's kube-proxy ends by SIGPIPE there, silently).
#[test]
fn output_to_a_closed_pipe_is_not_a_panic() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = bin()
        .arg("--help")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = netlink_tests::bounded::wait_with_output_within(child, TEST_LIMIT, "--help");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.is_empty(), "a broken pipe is no error to report: {err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}

/// A daemon whose stderr breaks (the log pipe's reader gone) still serves and still stops on
/// SIGTERM, with exit 0: its log lines are dropped. It ignored SIGTERM before: the failed
/// write was reported with a panicking `eprintln!` in the task that handles the signal.
#[test]
fn a_broken_stderr_loses_logs_not_sigterm() {
    let ns = netlink_tests::ns::NetNs::new("brokenlog");
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster.yaml");
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(netlink_tests::cluster::proxy_bin())
        .args(["--hostname-override", "node1", "--manifests"])
        .arg(&example)
        .args([
            "--healthz-bind-address",
            "127.0.0.1:0",
            "--metrics-bind-address",
            "127.0.0.1:0",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !ns.sh("nft list tables").contains("kube-nlproxy") {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "no first sync"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(child.stderr.take());
    let out = netlink_tests::bounded::terminate_within(
        child,
        std::time::Duration::from_secs(20),
        "the daemon after SIGTERM with its stderr closed",
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", out.status);
}

/// Waits, 20 s at most, until `pid` is the daemon (`ip netns exec` has exec'd it) and, with
/// `configured`, has opened a socket, which it does only after reading its configuration.
fn wait_started(pid: u32, configured: bool) {
    let t0 = std::time::Instant::now();
    let proxy = netlink_tests::cluster::daemon_exe();
    loop {
        let is_daemon = std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p == proxy);
        let has_socket = || {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
                })
        };
        if is_daemon && (!configured || has_socket()) {
            return;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "pid {pid} did not become the started daemon within 20 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

#[test]
fn logs_have_no_colour_codes_when_stderr_is_not_a_terminal() {
    let out = bin()
        .args([
            "--hostname-override",
            "n",
            "--manifests",
            &example(),
            "--dry-run",
            "--profiling",
        ])
        .env_remove("NO_COLOR")
        .output_within(TEST_LIMIT)
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--profiling has no effect here"), "{err}");
    assert!(!err.contains('\u{1b}'), "escape codes in a pipe: {err:?}");
}

/// IPVS mode on a kernel without IPVS fails before it changes anything: one error line
/// naming the missing kernel feature, exit 1, and the nftables mode's table it would have
/// replaced still in place (it used to be removed first, then a sysctl write failed).
#[test]
fn ipvs_mode_without_ipvs_fails_before_touching_anything() {
    netlink_tests::ns::require_root();
    if kube_nlproxy::modes::ipvs::probe().is_ok() {
        eprintln!("this kernel serves IPVS: nothing to check here");
        return;
    }
    let c = netlink_tests::cluster::Cluster::new();
    let yaml = netlink_tests::scenario::web_yaml("");
    c.sync_once(&yaml, &[]);
    let before = c.ruleset("ip");
    assert!(before.contains("10.96.0.10"), "{before}");
    let p = c.write_manifests(&yaml);
    let (ok, err) = c.run_proxy(&[
        "--manifests",
        p.to_str().unwrap(),
        "--hostname-override",
        "node1",
        "--proxy-mode",
        "ipvs",
        "--once",
    ]);
    assert!(!ok, "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("kube-nlproxy:"))
        .unwrap_or_else(|| panic!("no error line:\n{err}"));
    assert!(
        line.contains("cannot use the IPVS proxier")
            && line.contains("generic netlink family \"IPVS\" does not exist"),
        "{err}"
    );
    assert!(!err.contains("sysctl"), "nothing written:\n{err}");
    assert_eq!(c.ruleset("ip"), before, "the nftables table is untouched");
}

/// `--oom-score-adj` that cannot be applied (lowering it needs CAP_SYS_RESOURCE) is logged
/// at `-v=2` as upstream logs it: the daemon syncs and keeps running. Where the write
/// succeeds, the value is applied instead.
#[test]
fn an_oom_score_adj_that_cannot_be_set_is_logged_as_upstream_logs_it() {
    netlink_tests::ns::require_root();
    let c = netlink_tests::cluster::Cluster::new();
    let mut d = c.start_daemon(
        &netlink_tests::scenario::web_yaml(""),
        &["--oom-score-adj=-999", "--v=2"],
    );
    let adj = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", d.child.id()))
        .unwrap_or_default();
    if adj.trim() != "-999" {
        let log = d.log_text();
        assert!(
            log.contains(r#""Failed to apply OOMScore" value=-999 "#),
            "oom_score_adj is {adj:?} and no line says so:\n{log}"
        );
    }
    assert!(c.ruleset("ip").contains("10.96.0.10"));
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(
        matches!(d.child.try_wait(), Ok(None)),
        "still running:\n{}",
        d.log_text()
    );
    let (st, _) = d.terminate();
    assert!(st.success(), "{}", d.log_text());
}

/// `--version` names the commit the binary was built from (build.rs reads `.git`; git here
/// is the oracle), as `kubernetes_build_info{git_commit}` does.
#[test]
fn version_names_the_checked_out_commit() {
    let root = format!("{}/..", env!("CARGO_MANIFEST_DIR"));
    let head = Command::new("git")
        .args(["-C", &root, "rev-parse", "HEAD"])
        .output_within(TEST_LIMIT)
        .unwrap();
    assert!(head.status.success(), "git rev-parse HEAD in {root}");
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    let out = bin().arg("--version").output_within(TEST_LIMIT).unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text,
        format!(
            "Kubernetes v1.37.2 (kube-nlproxy {}, git commit {head}, kube-proxy v1alpha1 configuration)\n",
            env!("CARGO_PKG_VERSION")
        )
    );
}

/// Issue #53.2, a NET_ADMIN-only container, where `/proc/sys` is read-only: conntrack
/// sysctls the host already set as configured are not written (upstream's setIntSysCtl
/// writes only what reads otherwise), so `--init-only` says nothing about them; those it
/// cannot set are one warning naming each.
#[test]
fn sysctls_set_by_the_host_need_no_write_and_the_rest_are_one_warning() {
    netlink_tests::ns::require_root();
    let ns = netlink_tests::ns::NetNs::new("rosys");
    ns.write_sysctl("net/netfilter/nf_conntrack_tcp_timeout_close_wait", "3600");
    ns.write_sysctl(
        "net/netfilter/nf_conntrack_tcp_timeout_established",
        "86400",
    );
    let proxy = netlink_tests::cluster::proxy_bin();
    // A mount namespace with /proc/sys bound read-only over itself, as a runtime mounts it
    // for an unprivileged container.
    let init_only = |flags: &str| -> String {
        let script = format!(
            "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec {} --init-only {flags}",
            proxy.display()
        );
        let out = ns.output("unshare", &["-m", "sh", "-c", &script]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        err
    };
    let defaults = init_only("");
    assert!(
        !defaults.contains("cannot set"),
        "the host's values are upstream's defaults:\n{defaults}"
    );
    let other = init_only("--conntrack-tcp-timeout-close-wait=2h --conntrack-udp-timeout=40s");
    let warnings: Vec<&str> = other.lines().filter(|l| l.contains("cannot set")).collect();
    assert_eq!(warnings.len(), 1, "{other}");
    assert!(
        warnings[0].contains(r#""cannot set sysctls" count=2 "#)
            && warnings[0]
                .contains("nf_conntrack_tcp_timeout_close_wait=7200: Read-only file system")
            && warnings[0].contains("nf_conntrack_udp_timeout=40: Read-only file system"),
        "{other}"
    );
}
