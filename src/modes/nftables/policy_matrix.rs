//! The traffic-policy matrix (issue #35.1) through the planned ruleset: for every case of
//! [`crate::model::fixtures::policy_matrix`], a pod, an off-cluster client and the node itself
//! reach the ClusterIP, the NodePort, the externalIP and the LoadBalancer IP, traced by both
//! packet tracers (the fake's and `explain`'s evaluator), and the endpoints a new connection
//! may land on, the masquerading and the drop or reject are upstream's. Pure (fake kernel).

use std::net::{IpAddr, SocketAddr};

use crate::model::fixtures::policy_matrix::{
    cases, PolicyCase, CLUSTER_IP, EXTERNAL_IP, LB_IP, NODE_PORT, PORT,
};
use crate::model::Endpoint;

use super::tests::upstream_flows::flow_output_traced;
use super::tests::{state, syncer, NODE_IP};

/// A pod on another node's range of the cluster CIDR (10.0.0.0/8), not an endpoint.
const POD: &str = "10.180.9.9";
/// Off-cluster, routed to the node.
const OUTSIDE: &str = "203.0.113.9";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Pod,
    Outside,
    Node,
}

impl Source {
    fn addr(self) -> &'static str {
        match self {
            Source::Pod => POD,
            Source::Outside => OUTSIDE,
            Source::Node => NODE_IP,
        }
    }
}

/// The tracer's output for a set of endpoints: `ip:port, …` sorted, or `DROP` when the
/// policy leaves none here.
fn targets(eps: &[Endpoint]) -> String {
    if eps.is_empty() {
        return "DROP".into();
    }
    let mut t: Vec<String> = eps
        .iter()
        .map(|e| SocketAddr::new(e.ip, e.port).to_string())
        .collect();
    t.sort();
    t.join(", ")
}

/// Upstream's answer for one flow: (targets, masqueraded).
fn expected(c: &PolicyCase, src: Source, external: bool) -> (String, bool) {
    if c.endpoints.is_empty() {
        // No endpoint anywhere: refused, whatever the policies.
        return ("REJECT".into(), false);
    }
    if !external {
        // ClusterIP: the internal policy picks; only pods keep their address.
        let eps = c.internal();
        let masq = src != Source::Pod && !eps.is_empty();
        return (targets(&eps), masq);
    }
    if !c.service.external_policy_local {
        return (targets(&c.endpoints), true);
    }
    match src {
        // Short-circuited to every endpoint, as if out to a load balancer and back.
        Source::Pod => (targets(&c.endpoints), false),
        Source::Node => (targets(&c.endpoints), true),
        // This node's endpoints only, the client's address kept.
        Source::Outside => (targets(&c.external()), false),
    }
}

#[test]
fn every_policy_endpoint_count_and_affinity_reaches_what_upstream_allows() {
    let node: IpAddr = NODE_IP.parse().expect("constant");
    let dests: [(IpAddr, u16, bool); 4] = [
        (CLUSTER_IP.into(), PORT, false),
        (node, NODE_PORT, true),
        (EXTERNAL_IP.into(), PORT, true),
        (LB_IP.into(), PORT, true),
    ];
    let mut failures = Vec::new();
    let all = cases();
    assert_eq!(all.len(), 2 * 2 * (1 + 2 + 3 + 3) * 2, "matrix size");
    for c in &all {
        let mut s = syncer();
        s.sync(&state(vec![(c.service.clone(), c.endpoints.clone())]))
            .expect("sync against the fake");
        for src in [Source::Pod, Source::Outside, Source::Node] {
            for (dst, port, external) in dests {
                // Both tracers, every case (the evaluator joins a numgen's failed branches,
                // so the affinity cascade of 70 endpoints is 70 paths, not 70!).
                let got = flow_output_traced(&mut s, 6, src.addr(), &dst.to_string(), port, true);
                let want = expected(c, src, external);
                if got != want {
                    failures.push(format!(
                        "{}: {src:?} → {dst}:{port}: want {want:?}, got {got:?}",
                        c.name
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} flows differ:\n{}",
        failures.len(),
        all.len() * 12,
        failures.join("\n")
    );
}
