//! `kube-nlproxy explain` against real packets: every flow of the differential table
//! (ClusterIP, NodePort, externalIPs, LB IPs with source ranges, both traffic policies,
//! terminating endpoints, topology, affinity, no endpoints, hairpin, IPv6, UDP) through the
//! namespace cluster, then through `explain` reading the live kernel; the endpoints that
//! answer, the source they saw, and refused versus dropped must be what explain said.

use netlink_tests::apiserver::ApiServer;
use netlink_tests::cluster::{proxy_bin, Cluster, Daemon, NODE_IP};
use netlink_tests::differential::{
    backend_at, check_explained, objects, outcome, wait_ours_programmed, Flow, From,
};
use netlink_tests::scenario::{web_cluster, Backends};

/// Served by our localhost NodePort listener (a socket, not a rule): explain says the
/// packet is accepted to this host and cannot name the endpoint behind the socket.
const UNEXPLAINED: &[&str] = &["NodePort via localhost"];

/// The flow table's cluster (dual-stack, UDP backends) with its objects served by a fake API
/// server and ours running from it, every Service programmed.
fn flow_table_programmed() -> (Cluster, ApiServer, Daemon) {
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
    (c, api, d)
}

#[test]
fn explain_says_what_real_packets_do_in_nftables_mode() {
    let (c, _api, d) = flow_table_programmed();
    check_explained(&c, UNEXPLAINED, &|| d.log_text());
}

/// `kube-nlproxy services` against real packets: for each ClusterIP and NodePort frontend it
/// lists, the endpoints it names are the backends that answer probes from where it traced
/// (this host for a ClusterIP, outside for a NodePort), and one it shows rejected is refused.
#[test]
fn services_lists_the_endpoints_real_packets_reach() {
    let (c, _api, _d) = flow_table_programmed();
    let out = c
        .node
        .output(proxy_bin().to_str().unwrap(), &["services", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut checked = Vec::new();
    for svc in v["services"].as_array().unwrap() {
        let udp = svc["protocol"] == "UDP";
        for f in svc["frontends"].as_array().unwrap() {
            let kind = f["kind"].as_str().unwrap();
            let addr: std::net::SocketAddr = f["address"].as_str().unwrap().parse().unwrap();
            // NodePorts answer on every node address: probe the one outside reaches.
            let (to, from) = match kind {
                // (UDP probes start in a pod: the internal traffic policy is the same.)
                "ClusterIP" if udp => (addr.ip().to_string(), From::Pod),
                "ClusterIP" => (addr.ip().to_string(), From::Node),
                "NodePort" if addr.is_ipv4() => (NODE_IP.to_string(), From::Ext),
                _ => continue,
            };
            let outcomes = f["outcomes"].as_array().unwrap();
            let mut listed: Vec<String> = outcomes
                .iter()
                .filter_map(|o| o["endpoint"].as_str())
                .map(|e| backend_at(e).unwrap_or(e).to_string())
                .collect();
            listed.sort();
            listed.dedup();
            if listed.is_empty() {
                listed = outcomes
                    .iter()
                    .map(|o| match o["verdict"].as_str() {
                        Some("reject") => "refused".to_string(),
                        Some("drop") => "dropped".to_string(),
                        other => format!("{other:?}"),
                    })
                    .collect();
            }
            let flow = Flow {
                name: "services",
                from,
                to: (Box::leak(to.into_boxed_str()), addr.port()),
                sticky: false,
                udp,
            };
            let real: std::collections::BTreeSet<String> = outcome(&c, &flow)
                .0
                .into_iter()
                .map(|s| s.split(" saw ").next().unwrap().to_string())
                .collect();
            // Every answer came from a listed endpoint (ClientIP affinity pins one of them).
            assert!(
                !real.is_empty() && real.iter().all(|r| listed.contains(r)),
                "{} {kind} {addr}: listed {listed:?}, real packets {real:?}",
                svc["service"]
            );
            checked.push(format!("{} {kind}", svc["service"]));
        }
    }
    // The flow table's ClusterIPs (both families, TCP and UDP, with and without endpoints)
    // and its IPv4 NodePorts.
    assert!(checked.len() >= 10, "{checked:?}\n{v:#}");
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
