//! Synthetic clusters for benchmarks and tests: service i has ClusterIP 10.96.0.0 + i, port
//! 80/TCP named `http`, and `eps` ready endpoints 10.244.0.0 + i·eps + j on port 8080 (none
//! local). Pure.

use std::net::Ipv4Addr;

use super::{Endpoint, NodeInfo, Protocol, ProxyState, ServicePort, ServicePortName};

/// The ClusterIP of synthetic service `i`.
pub fn cluster_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(0x0a60_0000u32 + i as u32)
}

/// Endpoint `j` of synthetic service `i`.
pub fn endpoint_ip(i: usize, j: usize, eps: usize) -> Ipv4Addr {
    Ipv4Addr::from(0x0af4_0000u32 + (i * eps + j) as u32)
}

/// A node `node1` with `services` service ports of `eps` endpoints each.
pub fn synthetic_state(services: usize, eps: usize) -> ProxyState {
    let mut st = ProxyState {
        node: NodeInfo {
            name: "node1".into(),
            ..Default::default()
        },
        ..Default::default()
    };
    for i in 0..services {
        let name = ServicePortName {
            namespace: "ns".into(),
            name: format!("svc-{i}").into(),
            port: "http".into(),
            protocol: Protocol::Tcp,
        };
        st.services.insert(
            name.clone(),
            ServicePort::new(name.clone(), cluster_ip(i).into(), 80).into(),
        );
        let e: Vec<Endpoint> = (0..eps)
            .map(|j| Endpoint::ready(endpoint_ip(i, j, eps).into(), 8080, false))
            .collect();
        st.endpoints.insert(name, e.into());
    }
    st
}

/// Node `node1` (192.168.0.2) with `default/web:http` on ClusterIP 10.96.0.10:80 (and
/// NodePort `node_port`, if any): endpoints 10.244.1.2:8080 (local) and 10.244.2.2:8080.
pub fn web_state(node_port: Option<u16>) -> ProxyState {
    let name = ServicePortName {
        namespace: "default".into(),
        name: "web".into(),
        port: "http".into(),
        protocol: Protocol::Tcp,
    };
    let mut sp = ServicePort::new(name.clone(), Ipv4Addr::new(10, 96, 0, 10).into(), 80);
    sp.node_port = node_port;
    let mut st = ProxyState {
        node: NodeInfo {
            name: "node1".into(),
            addresses: vec![Ipv4Addr::new(192, 168, 0, 2).into()],
            ..Default::default()
        },
        ..Default::default()
    };
    st.endpoints.insert(
        name.clone(),
        vec![
            Endpoint::ready(Ipv4Addr::new(10, 244, 1, 2).into(), 8080, true),
            Endpoint::ready(Ipv4Addr::new(10, 244, 2, 2).into(), 8080, false),
        ]
        .into(),
    );
    st.services.insert(name, sp.into());
    st
}
