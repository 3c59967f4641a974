//! Upstream's `TestCategorizeEndpoints` table (`pkg/proxy/topology_test.go`), every case, with
//! its expected cluster, local and all-reachable sets and `onlyRemoteEndpoints`. Upstream's
//! feature gates are on here as they are by default (ProxyTerminatingEndpoints is GA). Node
//! "node1"; `None` for a set means upstream's `nil`: the service never uses that kind of
//! endpoint (we keep an empty list, and `uses_*_endpoints` says no). Pure.

use std::collections::BTreeSet;

use super::*;
use crate::model::fixtures::endpoints::{endpoint as ep, EndpointFixture};
use crate::model::{Protocol, ServicePortName};

/// Upstream's `BaseServicePortInfo{internalPolicyLocal, externalPolicyLocal, nodePort}`.
fn svc(internal_local: bool, external_local: bool, node_port: Option<u16>) -> ServicePort {
    ServicePort {
        node_port,
        internal_policy_local: internal_local,
        external_policy_local: external_local,
        ..ServicePort::new(
            ServicePortName {
                namespace: "ns1".into(),
                name: "svc1".into(),
                port: "p80".into(),
                protocol: Protocol::Tcp,
            },
            "172.30.0.1".parse().expect("test address"),
            80,
        )
    }
}

struct Case {
    name: &'static str,
    zone: Option<&'static str>,
    svc: ServicePort,
    endpoints: Vec<Endpoint>,
    cluster: Option<&'static [&'static str]>,
    local: Option<&'static [&'static str]>,
    /// Needed when both `cluster` and `local` are set (else it is the one that is).
    all: Option<&'static [&'static str]>,
    only_remote: bool,
}

fn case(name: &'static str, svc: ServicePort, endpoints: Vec<Endpoint>) -> Case {
    Case {
        name,
        zone: None,
        svc,
        endpoints,
        cluster: None,
        local: None,
        all: None,
        only_remote: false,
    }
}

impl Case {
    fn zone(mut self, z: &'static str) -> Self {
        self.zone = Some(z);
        self
    }
    fn cluster(mut self, c: &'static [&'static str]) -> Self {
        self.cluster = Some(c);
        self
    }
    fn local(mut self, l: &'static [&'static str]) -> Self {
        self.local = Some(l);
        self
    }
    fn all(mut self, a: &'static [&'static str]) -> Self {
        self.all = Some(a);
        self
    }
    fn only_remote(mut self) -> Self {
        self.only_remote = true;
        self
    }
}

fn cases() -> Vec<Case> {
    let four_zones = || {
        vec![
            ep("10.1.2.3:80").zones(&["zone-a"]),
            ep("10.1.2.4:80").zones(&["zone-b"]),
            ep("10.1.2.5:80").zones(&["zone-c"]),
            ep("10.1.2.6:80").zones(&["zone-a"]),
        ]
    };
    let two_local_two_remote = || {
        vec![
            ep("10.1.2.3:80").zones(&["zone-a"]).local(),
            ep("10.1.2.4:80").zones(&["zone-b"]).local(),
            ep("10.1.2.5:80").zones(&["zone-c"]),
            ep("10.1.2.6:80").zones(&["zone-a"]),
        ]
    };
    let one_local_one_remote = || vec![ep("10.0.0.0:80").local(), ep("10.0.0.1:80")];
    let np = Some(8080);
    vec![
        case("should use topology since all endpoints have hints, node has a zone label and there are endpoints for the node's zone",
            svc(false, false, None), four_zones())
            .zone("zone-a").cluster(&["10.1.2.3:80", "10.1.2.6:80"]),
        case("externalTrafficPolicy: Local, topology ignored for Local endpoints",
            svc(false, true, np), two_local_two_remote())
            .zone("zone-a")
            .cluster(&["10.1.2.3:80", "10.1.2.6:80"])
            .local(&["10.1.2.3:80", "10.1.2.4:80"])
            .all(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
        case("internalTrafficPolicy: Local, topology ignored for Local endpoints",
            svc(true, false, np), two_local_two_remote())
            .zone("zone-a")
            .cluster(&["10.1.2.3:80", "10.1.2.6:80"])
            .local(&["10.1.2.3:80", "10.1.2.4:80"])
            .all(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
        case("empty node labels", svc(false, false, None), vec![ep("10.1.2.3:80").zones(&["zone-a"])])
            .cluster(&["10.1.2.3:80"]),
        case("empty zone label", svc(false, false, None), vec![ep("10.1.2.3:80").zones(&["zone-a"])])
            .zone("").cluster(&["10.1.2.3:80"]),
        case("node in different zone, no endpoint filtering",
            svc(false, false, None), vec![ep("10.1.2.3:80").zones(&["zone-a"])])
            .zone("zone-b").cluster(&["10.1.2.3:80"]),
        case("unready endpoint", svc(false, false, None), {
            let mut e = four_zones();
            e[3] = e[3].clone().not_ready().not_serving();
            e
        })
            .zone("zone-a").cluster(&["10.1.2.3:80"]),
        case("only unready endpoints in same zone (should not filter)", svc(false, false, None), {
            let mut e = four_zones();
            e[0] = e[0].clone().not_ready().not_serving();
            e[3] = e[3].clone().not_ready().not_serving();
            e
        })
            .zone("zone-a").cluster(&["10.1.2.4:80", "10.1.2.5:80"]),
        case("missing hints, no filtering applied", svc(false, false, None), {
            let mut e = four_zones();
            e[2].hints = None;
            e
        })
            .zone("zone-a")
            .cluster(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"]),
        case("multiple hints per endpoint, filtering includes any endpoint with zone included",
            svc(false, false, None),
            vec![
                ep("10.1.2.3:80").zones(&["zone-a", "zone-b", "zone-c"]),
                ep("10.1.2.4:80").zones(&["zone-b", "zone-c"]),
                ep("10.1.2.5:80").zones(&["zone-b", "zone-d"]),
                ep("10.1.2.6:80").zones(&["zone-c"]),
            ])
            .zone("zone-c").cluster(&["10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"]),
        case("conflicting topology and localness require merging allEndpoints",
            svc(false, true, np),
            vec![
                ep("10.0.0.0:80").zones(&["zone-a"]).local(),
                ep("10.0.0.1:80").zones(&["zone-b"]).local(),
                ep("10.0.0.2:80").zones(&["zone-a"]),
                ep("10.0.0.3:80").zones(&["zone-b"]),
            ])
            .zone("zone-a")
            .cluster(&["10.0.0.0:80", "10.0.0.2:80"])
            .local(&["10.0.0.0:80", "10.0.0.1:80"])
            .all(&["10.0.0.0:80", "10.0.0.1:80", "10.0.0.2:80"]),
        case("internalTrafficPolicy: Local, with empty endpoints", svc(true, false, None), vec![])
            .local(&[]),
        case("internalTrafficPolicy: Local, but all endpoints are remote",
            svc(true, false, None), vec![ep("10.0.0.0:80"), ep("10.0.0.1:80")])
            .local(&[]).only_remote(),
        case("internalTrafficPolicy: Local, all endpoints are local",
            svc(true, false, None), vec![ep("10.0.0.0:80").local(), ep("10.0.0.1:80").local()])
            .local(&["10.0.0.0:80", "10.0.0.1:80"]),
        case("internalTrafficPolicy: Local, some endpoints are local",
            svc(true, false, None), one_local_one_remote())
            .local(&["10.0.0.0:80"]),
        case("Cluster traffic policy, endpoints not Ready",
            svc(false, false, None), vec![ep("10.0.0.0:80").not_ready().not_serving(), ep("10.0.0.1:80").not_ready().not_serving()])
            .cluster(&[]),
        case("Cluster traffic policy, some endpoints are Ready",
            svc(false, false, None), vec![ep("10.0.0.0:80").not_ready().not_serving(), ep("10.0.0.1:80")])
            .cluster(&["10.0.0.1:80"]),
        case("Cluster traffic policy, all endpoints are terminating",
            svc(false, false, None),
            vec![ep("10.0.0.0:80").not_ready().terminating().local(), ep("10.0.0.1:80").not_ready().terminating()])
            .cluster(&["10.0.0.0:80", "10.0.0.1:80"]),
        case("iTP: Local, eTP: Cluster, some endpoints local", svc(true, false, np), one_local_one_remote())
            .cluster(&["10.0.0.0:80", "10.0.0.1:80"])
            .local(&["10.0.0.0:80"])
            .all(&["10.0.0.0:80", "10.0.0.1:80"]),
        case("iTP: Cluster, eTP: Local, some endpoints local", svc(false, true, np), one_local_one_remote())
            .cluster(&["10.0.0.0:80", "10.0.0.1:80"])
            .local(&["10.0.0.0:80"])
            .all(&["10.0.0.0:80", "10.0.0.1:80"]),
        case("iTP: Local, eTP: Local, some endpoints local", svc(true, true, np), one_local_one_remote())
            .cluster(&["10.0.0.0:80", "10.0.0.1:80"])
            .local(&["10.0.0.0:80"])
            .all(&["10.0.0.0:80", "10.0.0.1:80"]),
        case("iTP: Local, eTP: Local, all endpoints remote",
            svc(true, true, np), vec![ep("10.0.0.0:80"), ep("10.0.0.1:80")])
            .cluster(&["10.0.0.0:80", "10.0.0.1:80"])
            .local(&[])
            .all(&["10.0.0.0:80", "10.0.0.1:80"]),
        case("iTP: Local, eTP: Local, all endpoints remote and terminating",
            svc(true, true, np),
            vec![ep("10.0.0.0:80").not_ready().terminating(), ep("10.0.0.1:80").not_ready().terminating()])
            .cluster(&["10.0.0.0:80", "10.0.0.1:80"])
            .local(&[])
            .all(&["10.0.0.0:80", "10.0.0.1:80"])
            .only_remote(),
        case("iTP: Cluster, eTP: Local, with terminating endpoints",
            svc(false, true, np),
            vec![
                ep("10.0.0.0:80"),
                ep("10.0.0.1:80").not_ready().not_serving().local(),
                ep("10.0.0.2:80").not_ready().terminating().local(),
                ep("10.0.0.3:80").not_ready().terminating(),
            ])
            .cluster(&["10.0.0.0:80"])
            .local(&["10.0.0.2:80"])
            .all(&["10.0.0.0:80", "10.0.0.2:80"]),
        case("externalTrafficPolicy ignored if not externally accessible",
            svc(false, true, None), vec![ep("10.0.0.0:80"), ep("10.0.0.1:80").local()])
            .cluster(&["10.0.0.0:80", "10.0.0.1:80"])
            .all(&["10.0.0.0:80", "10.0.0.1:80"]),
        case("no cluster endpoints for iTP:Local internal-only service",
            svc(true, false, None), vec![ep("10.0.0.0:80"), ep("10.0.0.1:80").local()])
            .local(&["10.0.0.1:80"])
            .all(&["10.0.0.1:80"]),
        // topologyModeFromHints with PreferSameTrafficDistribution on (its default): node
        // hints win when every ready endpoint has one and one names this node; otherwise
        // zone hints decide.
        case("node hints for this node: PreferSameNode",
            svc(false, false, None),
            vec![
                ep("10.1.2.3:80").nodes(&["node1"]).zones(&["zone-a"]),
                ep("10.1.2.4:80").nodes(&["node2"]).zones(&["zone-a"]),
            ])
            .zone("zone-a").cluster(&["10.1.2.3:80"]),
        case("node hints for other nodes only: zone hints decide",
            svc(false, false, None),
            vec![
                ep("10.1.2.3:80").nodes(&["node2"]).zones(&["zone-a"]),
                ep("10.1.2.4:80").nodes(&["node3"]).zones(&["zone-b"]),
            ])
            .zone("zone-a").cluster(&["10.1.2.3:80"]),
    ]
}

fn names(eps: &[Endpoint]) -> BTreeSet<String> {
    eps.iter().map(|e| e.to_string()).collect()
}

fn set(s: &[&str]) -> BTreeSet<String> {
    s.iter().map(|s| s.to_string()).collect()
}

#[test]
fn upstream_categorize_endpoints_table() {
    let mut failures = Vec::new();
    for c in cases() {
        let got = categorize_endpoints(&c.endpoints, &c.svc, "node1", c.zone);
        let mut check = |what: &str, want: Option<&[&str]>, got: &[Endpoint], used: bool| {
            let want_set = want.map(set).unwrap_or_default();
            if names(got) != want_set || used != want.is_some() {
                failures.push(format!(
                    "{}: {what}: want {want:?}, got {:?} (uses: {used})",
                    c.name,
                    names(got)
                ));
            }
        };
        check(
            "cluster",
            c.cluster,
            &got.cluster,
            c.svc.uses_cluster_endpoints(),
        );
        check("local", c.local, &got.local, c.svc.uses_local_endpoints());
        let want_all = match (c.cluster, c.local) {
            (Some(cl), None) => cl,
            (None, Some(l)) => l,
            _ => c.all.unwrap_or(&[]),
        };
        if names(&got.all_reachable) != set(want_all) {
            failures.push(format!(
                "{}: all: want {want_all:?}, got {:?}",
                c.name,
                names(&got.all_reachable)
            ));
        }
        let want_any = !want_all.is_empty() || c.only_remote;
        if got.has_any != want_any {
            failures.push(format!(
                "{}: has_any: want {want_any}, got {}",
                c.name, got.has_any
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
