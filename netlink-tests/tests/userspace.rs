//! `--proxy-mode userspace`: the daemon carries every connection; nftables redirects
//! ClusterIP and NodePort traffic to its listeners. Real connections in namespaces.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use netlink_tests::backend::{
    tally, tcp_backend, tcp_probe, tcp_probes, udp_backend, udp_probe, OpenConn, Reply,
};
use netlink_tests::cluster::{sa, yaml, Cluster, NODE_IP};

const USERSPACE: &[&str] = &["--proxy-mode", "userspace"];

fn web_cluster() -> Cluster {
    let mut c = Cluster::new();
    c.add_pod(2);
    c.add_pod(3);
    c.add_remote_pod_ip("10.244.2.2");
    tcp_backend(&c.pods[0], "local", sa("10.244.1.2", 8080));
    tcp_backend(&c.node2, "remote", sa("10.244.2.2", 8080));
    udp_backend(&c.pods[0], "dns-local", sa("10.244.1.2", 53));
    udp_backend(&c.node2, "dns-remote", sa("10.244.2.2", 53));
    c
}

fn web_yaml(extra_spec: &str, eps: &[&str]) -> String {
    let node = |ip: &str| {
        if ip.starts_with("10.244.1.") {
            "node1"
        } else {
            "node2"
        }
    };
    let list: Vec<_> = eps.iter().map(|ip| yaml::ready(ip, node(ip))).collect();
    let mut s = yaml::service(
        "default",
        "web",
        &["10.96.0.10"],
        &[("http", "TCP", 80, 30080)],
        &format!("type: NodePort\n{extra_spec}"),
    );
    s += &yaml::slice(
        "default",
        "web",
        "web-v4",
        "IPv4",
        ("http", "TCP", 8080),
        &list,
    );
    s += &yaml::service(
        "default",
        "dns",
        &["10.96.0.53"],
        &[("dns", "UDP", 53, 30053)],
        "type: NodePort",
    );
    s += &yaml::slice(
        "default",
        "dns",
        "dns-v4",
        "IPv4",
        ("dns", "UDP", 53),
        &list,
    );
    s += &yaml::service(
        "default",
        "empty",
        &["10.96.0.99"],
        &[("p", "TCP", 80, 30099)],
        "type: NodePort",
    );
    s
}

#[test]
fn serves_cluster_ip_and_node_port_round_robin_tcp_and_udp() {
    let c = web_cluster();
    let _d = c.start_daemon(&web_yaml("", &["10.244.1.2", "10.244.2.2"]), USERSPACE);
    let n = tally(&tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 10));
    assert_eq!(
        (n.get("local"), n.get("remote")),
        (Some(&5), Some(&5)),
        "round-robin: {n:?}"
    );
    let n = tally(&tcp_probes(&c.ext, sa(NODE_IP, 30080), 10));
    assert_eq!(
        (n.get("local"), n.get("remote")),
        (Some(&5), Some(&5)),
        "{n:?}"
    );
    // From the node itself (output hook).
    assert!(tcp_probe(&c.node, sa("10.96.0.10", 80)).name().is_some());
    // UDP: each probe uses a fresh source port, so a fresh session.
    let mut udp = BTreeMap::<String, usize>::new();
    for _ in 0..4 {
        let r = udp_probe(&c.pods[1], sa("10.96.0.53", 53));
        *udp.entry(r.name().unwrap_or("none").to_string())
            .or_default() += 1;
    }
    assert_eq!(
        (udp.get("dns-local"), udp.get("dns-remote")),
        (Some(&2), Some(&2)),
        "{udp:?}"
    );
    let r = udp_probe(&c.ext, sa(NODE_IP, 30053));
    assert!(r.name().is_some(), "UDP NodePort: {r:?}");
    // No endpoints: refused by the table, never reaching a listener.
    assert_eq!(tcp_probe(&c.pods[1], sa("10.96.0.99", 80)), Reply::Refused);
    assert_eq!(tcp_probe(&c.ext, sa(NODE_IP, 30099)), Reply::Refused);
}

#[test]
fn affinity_and_external_policy_local() {
    let c = web_cluster();
    let _d = c.start_daemon(
        &web_yaml(
            "externalTrafficPolicy: Local\nsessionAffinity: ClientIP\nsessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}",
            &["10.244.1.2", "10.244.2.2"],
        ),
        USERSPACE,
    );
    let n = tally(&tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 8));
    assert_eq!(n.len(), 1, "ClientIP affinity sticks: {n:?}");
    let n = tally(&tcp_probes(&c.ext, sa(NODE_IP, 30080), 6));
    assert_eq!(
        n.keys().collect::<Vec<_>>(),
        ["local"],
        "Local policy: {n:?}"
    );
}

#[test]
fn established_connection_survives_endpoint_change_and_listeners_follow_services() {
    let c = web_cluster();
    let _d = c.start_daemon(&web_yaml("", &["10.244.1.2", "10.244.2.2"]), USERSPACE);
    let mut conn = loop {
        let oc = OpenConn::open(&c.pods[1], sa("10.96.0.10", 80));
        if oc.greeting.name() == Some("local") {
            break oc;
        }
    };
    assert_eq!(conn.echo("one").unwrap(), "one");
    c.write_manifests(&web_yaml("", &["10.244.2.2"]));
    let t0 = Instant::now();
    loop {
        let n = tally(&tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 4));
        if n.keys().collect::<Vec<_>>() == ["remote"] {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "endpoint never removed: {n:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        conn.echo("two").unwrap(),
        "two",
        "established connection kept"
    );
    // The Service goes away: its ClusterIP no longer answers.
    let mut y = web_yaml("", &["10.244.2.2"]);
    let cut = y
        .find("---\napiVersion: v1\nkind: Service\nmetadata: {name: dns")
        .unwrap();
    y.truncate(cut);
    y = y.replace("10.96.0.10", "10.96.0.11");
    c.write_manifests(&y);
    let t0 = Instant::now();
    while tcp_probe(&c.pods[1], sa("10.96.0.10", 80)).name().is_some() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "old ClusterIP still served"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(tcp_probe(&c.pods[1], sa("10.96.0.11", 80)).name().is_some());
}
