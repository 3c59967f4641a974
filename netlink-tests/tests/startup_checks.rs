//! Upstream's start-up checks of the configuration (`checkBadConfig`, `checkBadIPConfig` in
//! `cmd/kube-proxy/app/server.go`), as the binary runs them once the Node is known: a
//! warning-level finding is one error line and the proxy runs on; a fatal one stops the
//! start-up before anything is programmed, with upstream's message.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use netlink_tests::cluster::{yaml, Cluster, NODE_IP};

/// A Service and this node, with `pod_cidrs`.
fn manifests(pod_cidrs: &str) -> String {
    let mut y = yaml::service(
        "default",
        "web",
        &["10.96.0.10"],
        &[("http", "TCP", 80, 0)],
        "",
    );
    y += &format!(
        "---\napiVersion: v1\nkind: Node\nmetadata: {{name: node1}}\nspec: {{podCIDRs: [{pod_cidrs}]}}\nstatus: {{addresses: [{{type: InternalIP, address: {NODE_IP}}}]}}\n"
    );
    y
}

/// `--once` with `extra`: (success, stderr).
fn once(c: &Cluster, pod_cidrs: &str, extra: &[&str]) -> (bool, String) {
    c.try_once(&manifests(pod_cidrs), extra)
}

fn programmed(c: &Cluster) -> bool {
    c.node
        .output("nft", &["list", "table", "ip", "kube-nlproxy"])
        .status
        .success()
}

#[test]
fn unset_node_port_addresses_is_one_error_line_and_the_proxy_runs() {
    let c = Cluster::new();
    let (ok, err) = once(&c, "\"10.244.1.0/24\"", &["--proxy-mode", "iptables"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("Kube-proxy configuration may be incomplete or incorrect"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("nodePortAddresses is unset; NodePort connections will be accepted on all local IPs. Consider using `--nodeport-addresses primary`"),
        "{}",
        lines[0]
    );
    assert!(programmed(&c));
    // nftables mode defaults nodePortAddresses to `primary`: nothing to say.
    let c = Cluster::new();
    let (ok, err) = once(&c, "\"10.244.1.0/24\"", &["--proxy-mode", "nftables"]);
    assert!(ok, "{err}");
    assert!(
        !err.contains("Kube-proxy configuration may be incomplete or incorrect"),
        "{err}"
    );
}

/// `detectLocalMode: NodeCIDR` with pod CIDRs only of the other family: fatal, as upstream
/// has always made it.
#[test]
fn node_cidr_detection_with_pod_cidrs_of_the_wrong_family_stops_the_start_up() {
    let c = Cluster::new();
    let (ok, err) = once(
        &c,
        "\"fd00:10:244:1::/64\"",
        &[
            "--proxy-mode",
            "nftables",
            "--detect-local-mode",
            "NodeCIDR",
        ],
    );
    assert!(!ok, "start-up fails:\n{err}");
    assert!(
        err.contains("kube-proxy configuration is incorrect: cluster is IPv4-primary but node.spec.podCIDRs contains only IPv6 addresses"),
        "{err}"
    );
    assert!(!programmed(&c), "nothing programmed");
    // The same pod CIDRs with ClusterCIDR detection: one error line, and it runs.
    let c = Cluster::new();
    let (ok, err) = once(
        &c,
        "\"fd00:10:244:1::/64\"",
        &[
            "--proxy-mode",
            "nftables",
            "--cluster-cidr",
            "10.244.0.0/16",
        ],
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("cluster is IPv4-primary but node.spec.podCIDRs contains only IPv6 addresses"),
        "{err}"
    );
    assert!(programmed(&c));
}
