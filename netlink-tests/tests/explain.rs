//! `kube-nlproxy explain` against real packets: every flow of the differential table
//! (ClusterIP, NodePort, externalIPs, LB IPs with source ranges, both traffic policies,
//! terminating endpoints, topology, affinity, no endpoints, hairpin, IPv6, UDP) through the
//! namespace cluster, then through `explain` reading the live kernel; the endpoints that
//! answer, the source they saw, and refused versus dropped must be what explain said.

use netlink_tests::apiserver::ApiServer;
use netlink_tests::differential::{check_explained, objects, wait_ours_programmed};
use netlink_tests::scenario::{web_cluster, Backends};

/// Served by our localhost NodePort listener (a socket, not a rule): explain says the
/// packet is accepted to this host and cannot name the endpoint behind the socket.
const UNEXPLAINED: &[&str] = &["NodePort via localhost"];

#[test]
fn explain_says_what_real_packets_do_in_nftables_mode() {
    let c = web_cluster(Backends {
        ipv6: true,
        udp: true,
    });
    let api = c.node.run(ApiServer::start);
    for o in objects() {
        api.apply(o);
    }
    let d = c.start_daemon_with(&["--master", &api.url()]);
    wait_ours_programmed(&c, "ours", &|| d.log_text());
    check_explained(&c, UNEXPLAINED, &|| d.log_text());
}

/// Someone else's rule in our table, with an expression the evaluator does not model, is
/// reported with its chain and handle, never guessed past; `status` against the API
/// source (the fake server) sees the same rule as drift.
#[test]
fn a_foreign_rule_is_reported_not_guessed() {
    let c = web_cluster(Backends::default());
    let api = c.node.run(ApiServer::start);
    for o in objects() {
        api.apply(o);
    }
    let url = api.url();
    let mut d = c.start_daemon_with(&["--master", &url]);
    wait_ours_programmed(&c, "ours", &|| d.log_text());
    let master = format!("--master={url}");
    assert!(
        c.proxy_stdout(&["status", &master]).contains("drift: none"),
        "in sync through the API source"
    );
    d.terminate();
    // `limit` is not an expression we write: the decoder keeps the rule unreadable.
    c.node
        .sh("nft insert rule ip kube-nlproxy nat-prerouting limit rate 10/second accept");
    let r = netlink_tests::differential::explain_json(
        &c.node,
        &["--from", "10.244.1.3", "--to", "10.96.0.10:80"],
    )
    .unwrap();
    let o = &r["tables"][0]["outcomes"];
    assert_eq!(o.as_array().map(Vec::len), Some(1), "{r:#}");
    assert_eq!(o[0]["verdict"], "unknown", "{r:#}");
    let detail = o[0]["detail"].as_str().unwrap_or("");
    assert!(
        detail.starts_with("chain nat-prerouting, rule ") && detail.contains("limit"),
        "{detail}"
    );
    let s = c.proxy_report(&["status", &master], 1);
    assert!(
        s.contains("chain nat-prerouting: 2 rules, planned 1; from rule 1: rule handle"),
        "{s}"
    );
    assert!(s.contains("is not one of ours"), "{s}");
}
