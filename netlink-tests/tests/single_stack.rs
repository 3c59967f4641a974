//! A host without usable IPv6 (upstream kube-proxy since 1.34, kubernetes#131265/#133711):
//! with `net.ipv6.conf.all.disable_ipv6=1` in the node namespace, ours says so in one info
//! line and runs IPv4 alone: no `ip6` table, `/healthz` reports IPv4 only, no IPv6 metrics
//! series; IPv4 Services still answer. The control is the same cluster with IPv6 enabled.
//! An IPv6 primary family on such a host stops the start-up, as upstream's.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use netlink_tests::backend::{tcp_probes, Reply};
use netlink_tests::cluster::{sa, Cluster};
use netlink_tests::differential::metrics;
use netlink_tests::scenario::{self, Backends, LOCAL_EP, REMOTE_EP, WEB_IP};

/// The shared dual-stack `default/web` Service (IPv4 endpoints answering).
fn manifests() -> String {
    scenario::web_yaml_with("", &[LOCAL_EP, REMOTE_EP], true)
}

fn cluster(ipv6_disabled: bool) -> Cluster {
    let c = scenario::web_cluster(Backends::default());
    if ipv6_disabled {
        c.node.write_sysctl("net/ipv6/conf/all/disable_ipv6", "1");
    }
    c
}

/// (whether an `ip6` table exists, `/healthz`'s body, `/metrics`' body, the daemon's log)
fn run(ipv6_disabled: bool) -> (bool, String, String, String) {
    let c = cluster(ipv6_disabled);
    let d = c.start_daemon(
        &manifests(),
        &[
            "--healthz-bind-address",
            "127.0.0.1:10256",
            "--metrics-bind-address",
            "127.0.0.1:10249",
        ],
    );
    let replies = tcp_probes(&c.pods[1], sa(WEB_IP, 80), 6);
    assert!(
        replies.iter().all(|r| matches!(r, Reply::Answered { .. })),
        "the IPv4 ClusterIP answers: {replies:?}"
    );
    let ip6 = c
        .node
        .output("nft", &["list", "table", "ip6", "kube-nlproxy"])
        .status
        .success();
    let health = c
        .node
        .sh("curl -s --max-time 5 http://127.0.0.1:10256/healthz");
    let metrics = metrics(&c.node, "127.0.0.1:10249");
    (ip6, health, metrics, d.log_text())
}

#[test]
fn with_ipv6_disabled_only_ipv4_is_programmed_reported_and_measured() {
    let (ip6, health, metrics, log) = run(true);
    assert!(!ip6, "no ip6 table on a host without IPv6");
    assert!(
        log.contains("Kernel support disabled for family") && log.contains("IPv6"),
        "one info line says why:\n{log}"
    );
    assert!(
        log.contains("kube-proxy running in single-stack mode"),
        "{log}"
    );
    assert!(health.contains("\"IPv4\""), "{health}");
    assert!(!health.contains("\"IPv6\""), "no IPv6 status: {health}");
    assert!(
        metrics.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("ip_family=\"IPv6\""),
        "no IPv6 series: {}",
        metrics
            .lines()
            .filter(|l| l.contains("IPv6"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Control: the same cluster with IPv6 programs, reports and measures both families.
#[test]
fn with_ipv6_both_families_are_programmed_reported_and_measured() {
    let (ip6, health, metrics, log) = run(false);
    assert!(ip6, "an ip6 table");
    assert!(
        log.contains("kube-proxy running in dual-stack mode"),
        "{log}"
    );
    assert!(
        health.contains("\"IPv4\"") && health.contains("\"IPv6\""),
        "{health}"
    );
    assert!(
        metrics.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"}"),
        "{metrics}"
    );
}

/// An IPv6 primary family (here from `--bind-address`) on a host without IPv6: upstream's
/// start-up error, and nothing programmed.
#[test]
fn an_ipv6_primary_family_without_ipv6_stops_the_start_up() {
    let c = cluster(true);
    let (ok, err) = c.try_once(&manifests(), &["--bind-address", "fd00:50::1"]);
    assert!(!ok, "start-up fails");
    assert!(
        err.contains("no support for primary IP family \\\"IPv6\\\"")
            || err.contains("no support for primary IP family \"IPv6\""),
        "{err}"
    );
    assert!(
        !c.node
            .output("nft", &["list", "table", "ip", "kube-nlproxy"])
            .status
            .success(),
        "nothing programmed"
    );
}
