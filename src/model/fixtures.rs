//! Synthetic clusters for benchmarks and tests: service i has ClusterIP 10.96.0.0 + i, port
//! 80/TCP named `http`, and `eps` ready endpoints 10.244.0.0 + i·eps + j on port 8080 (none
//! local). Pure.
//!
//! For tests only: named builders of endpoints (`endpoints`, unit tests). The builder of
//! EndpointSlice objects is the source layer's (`source::fixtures`).

use std::net::Ipv4Addr;

#[cfg(test)]
pub(crate) mod endpoints;

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

/// The traffic-policy matrix every mode is checked against (issue #35.1): internal policy ×
/// external policy × where the endpoints are (none, some, all on this node) × how many (0;
/// 1; 3, inside the shared `balance-N` layouts' 2..=64; 70, past them) × ClientIP affinity.
/// "Some" needs two endpoints, so one endpoint has none or all local; with no endpoint
/// there is nothing to place.
pub mod policy_matrix {
    use std::net::{IpAddr, Ipv4Addr};

    use crate::model::{Endpoint, Protocol, ServicePort, ServicePortName};

    pub const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 41);
    pub const PORT: u16 = 80;
    pub const NODE_PORT: u16 = 30080;
    pub const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 99, 22);
    pub const LB_IP: Ipv4Addr = Ipv4Addr::new(1, 2, 3, 4);
    pub const ENDPOINT_PORT: u16 = 8080;
    /// Endpoint counts: none, one, a balanced few, more than the 64 a `balance-N` holds.
    pub const COUNTS: [usize; 4] = [0, 1, 3, 70];

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Locality {
        None,
        Some,
        All,
    }

    /// One service port and its endpoints (all ready), with what upstream's
    /// `CategorizeEndpoints` lets each kind of traffic use.
    #[derive(Debug, Clone)]
    pub struct PolicyCase {
        pub name: String,
        pub service: ServicePort,
        pub endpoints: Vec<Endpoint>,
    }

    impl PolicyCase {
        /// This node's endpoints.
        pub fn local(&self) -> Vec<Endpoint> {
            self.endpoints
                .iter()
                .filter(|e| e.is_local)
                .cloned()
                .collect()
        }
        /// What ClusterIP traffic may reach.
        pub fn internal(&self) -> Vec<Endpoint> {
            if self.service.internal_policy_local {
                self.local()
            } else {
                self.endpoints.clone()
            }
        }
        /// What traffic from outside the node to a NodePort, externalIP or LoadBalancer IP
        /// may reach (pods and the node itself are short-circuited to every endpoint).
        pub fn external(&self) -> Vec<Endpoint> {
            if self.service.external_policy_local {
                self.local()
            } else {
                self.endpoints.clone()
            }
        }
    }

    /// Endpoint `j`: 10.180.(j / 250).(j % 250 + 1), inside the tests' 10.0.0.0/8 pod CIDR.
    pub fn endpoint_ip(j: usize) -> IpAddr {
        // j < 70 here: both octets fit.
        Ipv4Addr::new(10, 180, (j / 250) as u8, (j % 250 + 1) as u8).into()
    }

    /// Every case of the matrix.
    pub fn cases() -> Vec<PolicyCase> {
        let mut out = Vec::new();
        for internal_local in [false, true] {
            for external_local in [false, true] {
                for n in COUNTS {
                    for locality in [Locality::None, Locality::Some, Locality::All] {
                        if (n < 2 && locality == Locality::Some)
                            || (n == 0 && locality == Locality::All)
                        {
                            continue;
                        }
                        for affinity in [None, Some(10800)] {
                            out.push(case(internal_local, external_local, n, locality, affinity));
                        }
                    }
                }
            }
        }
        out
    }

    fn case(
        internal_local: bool,
        external_local: bool,
        n: usize,
        locality: Locality,
        affinity: Option<u32>,
    ) -> PolicyCase {
        let name = ServicePortName {
            namespace: "ns1".into(),
            name: "matrix".into(),
            port: "p80".into(),
            protocol: Protocol::Tcp,
        };
        let mut sp = ServicePort::new(name, CLUSTER_IP.into(), PORT);
        sp.node_port = Some(NODE_PORT);
        sp.external_ips = vec![EXTERNAL_IP.into()];
        sp.load_balancer_ips = vec![LB_IP.into()];
        sp.internal_policy_local = internal_local;
        sp.external_policy_local = external_local;
        sp.affinity_timeout = affinity;
        let local_count = match locality {
            Locality::None => 0,
            Locality::Some => n / 2,
            Locality::All => n,
        };
        let endpoints = (0..n)
            .map(|j| Endpoint::ready(endpoint_ip(j), ENDPOINT_PORT, j < local_count))
            .collect();
        let policy = |local: bool| if local { "Local" } else { "Cluster" };
        PolicyCase {
            name: format!(
                "iTP {} eTP {} {n} endpoints {locality:?} local{}",
                policy(internal_local),
                policy(external_local),
                if affinity.is_some() { " affinity" } else { "" }
            ),
            service: sp,
            endpoints,
        }
    }
}

/// The first service port of `st`, to change in place (copied first if another state
/// shares it).
pub fn first_service_mut(st: &mut ProxyState) -> &mut ServicePort {
    let k = st.services.keys().next().expect("a service port").clone();
    std::sync::Arc::make_mut(st.services.get_mut(&k).expect("listed"))
}

/// The endpoints of the first service port with any, to change in place.
pub fn first_endpoints_mut(st: &mut ProxyState) -> &mut Vec<Endpoint> {
    let k = st.endpoints.keys().next().expect("endpoints").clone();
    std::sync::Arc::make_mut(st.endpoints.get_mut(&k).expect("listed"))
}
