//! Maglev load balancing (`kube-nlproxy.io/load-balancing: maglev`) with real packets, in
//! two independent clusters standing for two nodes behind an ECMP router: the same flow
//! (addresses and ports) reaches the same endpoint on both, the flows of many source ports
//! spread over every endpoint, and removing one endpoint moves its own flows and few others.
//! UDP from fixed source ports, so that one flow can be sent again after a change (TCP would
//! leave the client's port in TIME_WAIT); conntrack is flushed between rounds so that every
//! round is a new connection.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::collections::BTreeMap;

use netlink_tests::backend::{udp_backend, udp_probe_from, Reply};
use netlink_tests::cluster::{sa, yaml, Cluster, EXT_IP, NODE_IP};
use netlink_tests::differential::explain_json;
use netlink_tests::ns::NetNs;

const CLUSTER_IP: &str = "10.96.0.80";
const NODE_PORT: u16 = 30080;
/// Source ports of the flows each round sends.
const FLOWS: std::ops::Range<u16> = 40_000..40_064;
/// The pods' last octets (10.244.1.N), each serving UDP 8080 as `pod-N`.
const PODS: [u8; 4] = [2, 3, 4, 5];

/// The Service web (UDP 80 → 8080, a NodePort) with Maglev load balancing, its endpoints the
/// pods in `pods` in that order, after `others` Services of their own (which take endpoint-map
/// slots before web's when listed first).
fn manifest(pods: &[u8], others: usize) -> String {
    let mut m = String::new();
    for i in 0..others {
        let name = format!("other-{i}");
        let ip = format!("10.96.1.{}", i + 1);
        // NodePorts: chains of their own, each with a block of endpoint-map slots.
        let node_port = 31_000 + i as u16;
        m += &yaml::service(
            "default",
            &name,
            &[&ip],
            &[("p", "UDP", 53, node_port)],
            "type: NodePort",
        );
        m += &yaml::slice(
            "default",
            &name,
            &format!("{name}-1"),
            "IPv4",
            ("p", "UDP", 5353),
            &[
                yaml::ready("10.244.1.2", "node1"),
                yaml::ready("10.244.1.3", "node1"),
            ],
        );
    }
    let web = yaml::service(
        "default",
        "web",
        &[CLUSTER_IP],
        &[("dns", "UDP", 80, NODE_PORT)],
        "type: NodePort",
    )
    .replace(
        "metadata: {name: web, namespace: default}",
        "metadata: {name: web, namespace: default, annotations: {kube-nlproxy.io/load-balancing: maglev}}",
    );
    assert!(
        web.contains("maglev"),
        "the annotation is spliced in: {web}"
    );
    let eps: Vec<_> = pods
        .iter()
        .map(|n| yaml::ready(&format!("10.244.1.{n}"), "node1"))
        .collect();
    m + &web
        + &yaml::slice(
            "default",
            "web",
            "web-1",
            "IPv4",
            ("dns", "UDP", 8080),
            &eps,
        )
}

/// A node with the four pods serving.
fn node() -> Cluster {
    let mut c = Cluster::new();
    for n in PODS {
        let i = c.add_pod(n);
        udp_backend(
            &c.pods[i],
            &format!("pod-{n}"),
            sa(&format!("10.244.1.{n}"), 8080),
        );
    }
    c
}

/// One datagram from `EXT_IP:sport` to the NodePort; the name of the pod that answered.
fn send_from(ext: &NetNs, sport: u16) -> String {
    match udp_probe_from(ext, sa(EXT_IP, sport), sa(NODE_IP, NODE_PORT)) {
        Reply::Answered { name, .. } => name,
        other => panic!("flow from port {sport}: {other:?}"),
    }
}

/// Which pod answered the flow of each source port, as new connections.
fn round(c: &Cluster) -> BTreeMap<u16, String> {
    c.node.sh("conntrack -F 2>/dev/null || true");
    FLOWS.map(|p| (p, send_from(&c.ext, p))).collect()
}

/// `explain` of a flow through the live tables: one outcome, certain, through the jhash
/// step, to the endpoint that answered that very flow.
fn explain_names_the_endpoint_that_answered(c: &Cluster, answered: &BTreeMap<u16, String>) {
    let to = format!("{NODE_IP}:{NODE_PORT}/udp");
    for (port, pod) in answered.iter().take(8) {
        let sport = port.to_string();
        let r = explain_json(&c.node, &["--from", EXT_IP, "--sport", &sport, "--to", &to])
            .unwrap_or_else(|e| panic!("explain of the flow from port {port}: {e}"));
        let outcomes = r["tables"][0]["outcomes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(outcomes.len(), 1, "a hash is no branch: {r:#}");
        let o = &outcomes[0];
        assert_eq!(o["probability"].as_f64(), Some(1.0), "{r:#}");
        let n = pod.trim_start_matches("pod-");
        assert_eq!(
            o["destination"].as_str(),
            Some(format!("10.244.1.{n}:8080").as_str()),
            "explain of port {port} names the endpoint that answered it: {r:#}"
        );
        let steps = o["path"].as_array().cloned().unwrap_or_default();
        assert!(
            steps
                .iter()
                .any(|s| s["action"].as_str().is_some_and(|a| a.contains("jhash"))),
            "the hash step is shown: {r:#}"
        );
    }
}

#[test]
fn every_node_picks_the_same_endpoint_for_a_flow_and_a_removal_moves_few_others() {
    let a = node();
    let b = node();
    a.sync_once(&manifest(&PODS, 0), &[]);
    // The other node lists the endpoints in another order, and other Services first: its
    // endpoint-map slots differ, its Maglev table must not.
    let mut reversed = PODS;
    reversed.reverse();
    b.sync_once(&manifest(&reversed, 3), &[]);
    assert!(
        a.ruleset("ip")
            .contains("jhash ip saddr . udp sport . ip daddr . udp dport mod 509"),
        "{}",
        a.ruleset("ip")
    );
    let slots_of_web = |c: &Cluster| {
        let text = c.ruleset("ip");
        text.lines()
            .find(|l| l.contains("jhash") && l.contains("mod 509"))
            .map(|l| l.trim().to_string())
            .unwrap_or_else(|| panic!("no Maglev rule: {text}"))
    };
    assert_ne!(
        slots_of_web(&a),
        slots_of_web(&b),
        "the two nodes keep web's table in different slots"
    );
    let on_a = round(&a);
    let on_b = round(&b);
    assert_eq!(on_a, on_b, "the same flow, the same endpoint on both nodes");
    explain_names_the_endpoint_that_answered(&a, &on_a);
    let mut per_pod: BTreeMap<&str, usize> = BTreeMap::new();
    for name in on_a.values() {
        *per_pod.entry(name).or_default() += 1;
    }
    assert_eq!(
        per_pod.len(),
        PODS.len(),
        "every endpoint gets flows: {per_pod:?}"
    );

    // pod-5 goes: its flows move, and (Maglev's promise) few of the others do.
    a.sync_once(&manifest(&PODS[..3], 0), &[]);
    let after = round(&a);
    let mut moved_own = 0;
    let mut moved_others = 0;
    for (port, before) in &on_a {
        let now = &after[port];
        assert_ne!(
            now, "pod-5",
            "flow {port} still reaches the removed endpoint"
        );
        if before == "pod-5" {
            moved_own += 1;
        } else if now != before {
            moved_others += 1;
        }
    }
    assert_eq!(moved_own, per_pod["pod-5"]);
    eprintln!(
        "flows per endpoint {per_pod:?}; moved: {moved_own} of pod-5's, {moved_others} others"
    );
    // A random pick would move 3/4 of the others; Maglev's table moves a few entries beyond
    // the removed endpoint's (1.0-1.9x the ideal in the unit tests).
    assert!(
        moved_others * 2 <= moved_own,
        "{moved_others} flows of the remaining endpoints moved, {moved_own} of the removed one"
    );
    // The other node, unchanged, still agrees with what it said before.
    assert_eq!(round(&b), on_b);
}
