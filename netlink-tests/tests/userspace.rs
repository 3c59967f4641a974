//! `--proxy-mode userspace`: the daemon carries every connection; nftables redirects
//! ClusterIP and NodePort traffic to its listeners. Real connections in namespaces.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use netlink_tests::backend::{tally, tcp_probe, tcp_probes, udp_probe, OpenConn, Reply};
use netlink_tests::cluster::{sa, yaml, Cluster, NODE_IP};
use netlink_tests::scenario::{self, Backends};

const USERSPACE: &[&str] = &["--proxy-mode", "userspace"];

/// The shared scenario with UDP backends; `web` and `dns` (NodePorts 30080, 30053) both
/// served by `eps`, and `empty` without endpoints.
fn web_cluster() -> Cluster {
    scenario::web_cluster(Backends {
        ipv6: false,
        udp: true,
    })
}

fn web_yaml(extra_spec: &str, eps: &[&str]) -> String {
    let mut s = scenario::web_yaml_with(extra_spec, eps, false);
    s += &scenario::dns_yaml("default", 30053, eps);
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

/// `explain` in userspace mode: the kernel shows only the redirect to a listener's port;
/// the daemon's metrics server lists that listener's endpoints, and the packets reach
/// exactly those.
#[test]
fn explain_names_the_listener_and_the_endpoints_behind_it() {
    let c = web_cluster();
    let d = c.start_daemon(&web_yaml("", &["10.244.1.2", "10.244.2.2"]), USERSPACE);
    let r = netlink_tests::differential::explain_json(
        &c.node,
        &["--from", "10.244.1.3", "--to", "10.96.0.10:80"],
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_text()));
    let outcomes = r["tables"][0]["outcomes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(outcomes.len(), 1, "{r:#}");
    let o = &outcomes[0];
    assert_eq!(o["verdict"], "redirect", "{r:#}");
    let l = &o["listener"];
    assert_eq!(l["service"], "default/web:http", "{r:#}");
    let mut eps: Vec<String> = l["endpoints"]
        .as_array()
        .unwrap_or(&vec![])
        .iter()
        .filter_map(|e| e.as_str().map(str::to_owned))
        .collect();
    eps.sort();
    assert_eq!(eps, ["10.244.1.2:8080", "10.244.2.2:8080"], "{r:#}");
    let port = o["destination"].as_str().unwrap().trim_start_matches(':');
    assert_eq!(
        port,
        l["port"].to_string(),
        "the redirect's port is the listener's"
    );
    // Real packets reach exactly those endpoints.
    let n = tally(&tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 6));
    assert_eq!(
        (n.get("local"), n.get("remote")),
        (Some(&3), Some(&3)),
        "{n:?}"
    );
    // The text form names them too.
    let out = c.node.output(
        netlink_tests::cluster::proxy_bin().to_str().unwrap(),
        &["explain", "--from", "10.244.1.3", "--to", "10.96.0.10:80"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("listener of default/web:http: forwards to 10.244.1.2:8080, 10.244.2.2:8080")
            || text.contains(
                "listener of default/web:http: forwards to 10.244.2.2:8080, 10.244.1.2:8080"
            ),
        "{text}"
    );
}
