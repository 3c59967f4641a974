//! The one test scenario the packet tests of every mode share (nftables, IPVS, userspace,
//! the API source): a node with two pods and a second node, the `default/web` NodePort
//! Service with a local and a remote endpoint, the `dns` UDP Service, and helpers reading
//! who answered a probe. Each test file adds only what its case needs.

use std::collections::BTreeSet;

use crate::backend::{tally, tcp_backend, udp_backend, Reply};
use crate::cluster::{sa, yaml, Cluster};

/// The web Service's ClusterIPs and NodePort.
pub const WEB_IP: &str = "10.96.0.10";
pub const WEB_IP6: &str = "fd00:96::10";
pub const WEB_NODE_PORT: u16 = 30080;
/// The local endpoint (pod A on this node) and the remote one (on node2).
pub const LOCAL_EP: &str = "10.244.1.2";
pub const REMOTE_EP: &str = "10.244.2.2";
pub const LOCAL_EP6: &str = "fd00:10:244:1::2";
pub const REMOTE_EP6: &str = "fd00:10:244:2::2";
/// The dns Service's ClusterIP.
pub const DNS_IP: &str = "10.96.0.53";

/// What [`web_cluster`] starts besides the two pods.
#[derive(Debug, Clone, Copy, Default)]
pub struct Backends {
    /// IPv6 backends `local6` and `remote6` next to the IPv4 ones.
    pub ipv6: bool,
    /// UDP backends `dns-local` and `dns-remote` on port 53.
    pub udp: bool,
}

/// Ours beside upstream kube-proxy (issue #55.1): a node with two TCP backends, `theirs`
/// at 10.244.1.2:8080 and `ours` at 10.244.1.3:8080, and a client pod. Returns the cluster
/// and the client's index in its pods.
pub fn beside_cluster() -> (Cluster, usize) {
    let mut c = Cluster::new();
    let (theirs, ours, client) = (c.add_pod(2), c.add_pod(3), c.add_pod(4));
    tcp_backend(&c.pods[theirs], "theirs", sa("10.244.1.2", 8080));
    tcp_backend(&c.pods[ours], "ours", sa("10.244.1.3", 8080));
    (c, client)
}

/// Pod A (10.244.1.2, the local endpoint, TCP backend `local`), pod B (10.244.1.3, the
/// usual client), the remote endpoint 10.244.2.2 on node2 (TCP backend `remote`), all on
/// port 8080; more per [`Backends`].
pub fn web_cluster(b: Backends) -> Cluster {
    let mut c = Cluster::new();
    c.add_pod(2);
    c.add_pod(3);
    c.add_remote_pod_ip(REMOTE_EP);
    tcp_backend(&c.pods[0], "local", sa(LOCAL_EP, 8080));
    tcp_backend(&c.node2, "remote", sa(REMOTE_EP, 8080));
    if b.ipv6 {
        c.add_remote_pod_ip(REMOTE_EP6);
        tcp_backend(&c.pods[0], "local6", sa(LOCAL_EP6, 8080));
        tcp_backend(&c.node2, "remote6", sa(REMOTE_EP6, 8080));
    }
    if b.udp {
        udp_backend(&c.pods[0], "dns-local", sa(LOCAL_EP, 53));
        udp_backend(&c.node2, "dns-remote", sa(REMOTE_EP, 53));
    }
    c
}

/// The node an endpoint address lives on: 10.244.1.0/24 (and its IPv6 twin) is node1.
pub fn node_of(ip: &str) -> &'static str {
    if ip.starts_with("10.244.1.") || ip.starts_with("fd00:10:244:1::") {
        "node1"
    } else {
        "node2"
    }
}

fn ready_all(eps: &[&str]) -> Vec<yaml::SliceEndpoint> {
    eps.iter().map(|ip| yaml::ready(ip, node_of(ip))).collect()
}

/// `default/web`: NodePort 30080 (`extra_spec` adds spec lines), port 80 → 8080, with
/// `eps` as its IPv4 endpoints (their nodes from [`node_of`]); with `ipv6`, dual-stack
/// with the two IPv6 endpoints.
pub fn web_yaml_with(extra_spec: &str, eps: &[&str], ipv6: bool) -> String {
    let ips: &[&str] = if ipv6 { &[WEB_IP, WEB_IP6] } else { &[WEB_IP] };
    let mut s = yaml::service(
        "default",
        "web",
        ips,
        &[("http", "TCP", 80, WEB_NODE_PORT)],
        &format!("type: NodePort\n{extra_spec}"),
    );
    s += &yaml::slice(
        "default",
        "web",
        "web-v4",
        "IPv4",
        ("http", "TCP", 8080),
        &ready_all(eps),
    );
    if ipv6 {
        s += &yaml::slice(
            "default",
            "web",
            "web-v6",
            "IPv6",
            ("http", "TCP", 8080),
            &ready_all(&[LOCAL_EP6, REMOTE_EP6]),
        );
    }
    s
}

/// [`web_yaml_with`] both endpoints, IPv4 only.
pub fn web_yaml(extra_spec: &str) -> String {
    web_yaml_with(extra_spec, &[LOCAL_EP, REMOTE_EP], false)
}

/// `NS/dns`: UDP port 53 on 10.96.0.53 (a NodePort when `node_port` is not 0), endpoints
/// `eps` on port 53.
pub fn dns_yaml(ns: &str, node_port: u16, eps: &[&str]) -> String {
    let spec = if node_port == 0 { "" } else { "type: NodePort" };
    let mut s = yaml::service(ns, "dns", &[DNS_IP], &[("dns", "UDP", 53, node_port)], spec);
    let slice = if ns == "default" { "dns-v4" } else { "dns-1" };
    s += &yaml::slice(
        ns,
        "dns",
        slice,
        "IPv4",
        ("dns", "UDP", 53),
        &ready_all(eps),
    );
    s
}

/// The backends that answered, by name (failures by their debug form).
pub fn names(replies: &[Reply]) -> BTreeSet<String> {
    tally(replies).into_keys().collect()
}

/// The client address the backend saw.
pub fn peer(r: &Reply) -> String {
    match r {
        Reply::Answered { peer, .. } => peer.to_string(),
        other => panic!("expected an answer, got {other:?}"),
    }
}
