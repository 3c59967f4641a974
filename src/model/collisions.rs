//! Service ports that claim the same address and port, or the same NodePort, and which one
//! gets the traffic: the API server does not prevent it for externalIPs and LoadBalancer IPs,
//! and manifests can say anything. Pure.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::model::warning::ObjectWarning;
use crate::model::{OrdMap, ProxyState, ServicePort, ServicePortName};

/// Two service ports claiming one key: the owner (older Service, then namespace/name, the
/// order the rulesets use) gets the traffic.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Collision {
    /// `1.2.3.4:80/tcp` or `NodePort 30080/tcp`.
    pub key: String,
    pub owner: ServicePortName,
    pub other: ServicePortName,
}

impl std::fmt::Display for Collision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Services {} and {} both claim {}; {} gets that traffic (the older Service, then by namespace/name)",
            self.owner, self.other, self.key, self.owner
        )
    }
}

/// Service ports that claim the same address and port, or the same NodePort: the API server
/// does not prevent it for externalIPs and LoadBalancer IPs, and manifests can say anything.
/// One per clash, naming both. Pure.
pub fn collisions_of(state: &ProxyState) -> Vec<Collision> {
    let mut out = Vec::new();
    // The rulesets' order: older first (ports without a creation time last), then name.
    let mut ports: Vec<(&ServicePortName, &ServicePort)> =
        state.services.iter().map(|(n, sp)| (n, &**sp)).collect();
    ports.sort_by_key(|&(n, sp)| (sp.created.is_none(), sp.created, n));
    let mut addrs: BTreeMap<(IpAddr, u8, u16), &ServicePortName> = BTreeMap::new();
    let mut node_ports: BTreeMap<(u8, u16), &ServicePortName> = BTreeMap::new();
    for (spn, sp) in ports {
        let proto = spn.protocol.number();
        let mut mine = std::collections::BTreeSet::new();
        for ip in sp
            .cluster_ips
            .iter()
            .chain(&sp.external_ips)
            .chain(&sp.load_balancer_ips)
        {
            if !mine.insert(*ip) {
                continue; // the same Service naming an address twice is no clash
            }
            match addrs.get(&(*ip, proto, sp.port)) {
                Some(owner) => out.push(Collision {
                    key: format!(
                        "{}/{}",
                        std::net::SocketAddr::new(*ip, sp.port),
                        spn.protocol.lower()
                    ),
                    owner: (*owner).clone(),
                    other: spn.clone(),
                }),
                None => {
                    addrs.insert((*ip, proto, sp.port), spn);
                }
            }
        }
        if let Some(np) = sp.node_port {
            match node_ports.get(&(proto, np)) {
                Some(owner) => out.push(Collision {
                    key: format!("NodePort {np}/{}", spn.protocol.lower()),
                    owner: (*owner).clone(),
                    other: spn.clone(),
                }),
                None => {
                    node_ports.insert((proto, np), spn);
                }
            }
        }
    }
    out
}

/// [`collisions_of`] as warnings on the Service that loses the traffic.
pub fn collisions(state: &ProxyState) -> Vec<ObjectWarning> {
    collisions_of(state)
        .iter()
        .map(Collision::warning)
        .collect()
}

impl Collision {
    /// The warning on the Service that loses the traffic.
    pub fn warning(&self) -> ObjectWarning {
        let object = format!("{}/{}", self.other.namespace, self.other.name);
        ObjectWarning::new("Service", object, self.to_string())
    }
}

/// The collisions of the states seen one after another, worked out again only when a state's
/// service ports are not the very map of the state before (an endpoint change leaves them
/// shared): [`collisions_of`] sorts every service port.
#[derive(Debug, Default)]
pub struct CollisionTracker {
    services: Option<OrdMap<ServicePortName, std::sync::Arc<ServicePort>>>,
    current: std::collections::BTreeSet<Collision>,
}

impl CollisionTracker {
    /// The collisions of `state` that the state before did not have.
    pub fn new_in(&mut self, state: &ProxyState) -> Vec<Collision> {
        if self
            .services
            .as_ref()
            .is_some_and(|s| s.ptr_eq(&state.services))
        {
            return Vec::new();
        }
        let now: std::collections::BTreeSet<Collision> = collisions_of(state).into_iter().collect();
        let new = now.difference(&self.current).cloned().collect();
        self.current = now;
        self.services = Some(state.services.clone());
        new
    }
}
