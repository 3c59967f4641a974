//! The traffic-policy matrix (issue #35.1) through IPVS mode's plan: for every case of
//! [`crate::model::fixtures::policy_matrix`] (iTP × eTP × endpoint count × locality ×
//! affinity), the real servers of the ClusterIP's virtual server are what upstream's
//! `CategorizeEndpoints` lets internal traffic use, those of the NodePort, externalIP and
//! LoadBalancer IP virtual servers what it lets external traffic use, and ClientIP affinity
//! is persistence. (Masquerading and the drops for Local policies without local endpoints
//! are the companion table's, checked by the VM's flow tables.) Pure.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::kernel::ipvs::VsKey;
use crate::model::fixtures::policy_matrix::{
    cases, PolicyCase, CLUSTER_IP, EXTERNAL_IP, LB_IP, NODE_PORT, PORT,
};
use crate::model::{Endpoint, NodeInfo, ProxyState};

use super::plan::{build_plan, IpvsConfig};

const NODE_IP: [u8; 4] = [192, 168, 0, 2];

fn state_of(c: &PolicyCase) -> ProxyState {
    let mut st = ProxyState {
        node: NodeInfo {
            name: "node1".into(),
            ..Default::default()
        },
        ..Default::default()
    };
    st.endpoints
        .insert(c.service.name.clone(), c.endpoints.clone().into());
    st.services
        .insert(c.service.name.clone(), c.service.clone().into());
    st
}

fn addrs(eps: &[Endpoint]) -> BTreeSet<(IpAddr, u16)> {
    eps.iter().map(|e| (e.ip, e.port)).collect()
}

#[test]
fn every_policy_endpoint_count_and_affinity_gets_upstreams_real_servers() {
    let node = IpAddr::from(NODE_IP);
    let frontends: [(IpAddr, u16, bool); 4] = [
        (CLUSTER_IP.into(), PORT, false),
        (node, NODE_PORT, true),
        (EXTERNAL_IP.into(), PORT, true),
        (LB_IP.into(), PORT, true),
    ];
    let all = cases();
    assert_eq!(all.len(), 72, "matrix size");
    let mut failures = Vec::new();
    for c in &all {
        let plan = build_plan(&state_of(c), &IpvsConfig::default(), &[node]);
        for (addr, port, external) in frontends {
            let key = VsKey {
                addr,
                port,
                protocol: 6,
            };
            let Some(vs) = plan.services.get(&key) else {
                failures.push(format!("{}: no virtual server {key}", c.name));
                continue;
            };
            let want = addrs(&if external { c.external() } else { c.internal() });
            let got: BTreeSet<(IpAddr, u16)> = vs.dests.keys().copied().collect();
            if got != want {
                failures.push(format!("{}: {key}: want {want:?}, got {got:?}", c.name));
            }
            let persistence = c.service.affinity_timeout.unwrap_or(0);
            if vs.vs.persistence != persistence {
                failures.push(format!(
                    "{}: {key}: persistence {} instead of {persistence}",
                    c.name, vs.vs.persistence
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
