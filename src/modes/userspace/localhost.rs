//! Localhost NodePorts in userspace (upstream KEP-6032): nftables DNAT cannot serve
//! `127.0.0.1:<nodePort>` without `route_localnet`, so with `--localhost-nodeports` the daemon
//! listens on 127.0.0.1 for each NodePort and forwards TCP connections and UDP sessions to the
//! Service's usable endpoints, round-robin, honouring ClientIP affinity. Connections in flight
//! keep their endpoint across endpoint changes; listeners come and go with Services. The plan
//! is pure; [`LocalhostNodePorts`] does the I/O.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::model::topology::categorize_family;
use crate::model::{Protocol, ProxyState};
pub use crate::modes::userspace::forward::Forward;
use crate::modes::userspace::forward::{listen_counted, Listener};

/// The localhost NodePorts wanted by `state` (IPv4 endpoints; 127.0.0.1 is IPv4), keyed by
/// protocol and port. A port whose Service has no usable endpoint is still listened on and
/// refuses connections, as the kernel path rejects them.
pub fn plan_localhost(state: &ProxyState) -> BTreeMap<(Protocol, u16), Forward> {
    let mut out = BTreeMap::new();
    for (spn, sp) in &state.services {
        let Some(np) = sp.node_port else { continue };
        if spn.protocol == Protocol::Sctp {
            continue;
        }
        let eps = state.endpoints_of(spn);
        let cat = categorize_family(eps, sp, &state.node, true);
        // Traffic to a NodePort is external traffic: the external policy decides.
        let chosen = if sp.external_policy_local {
            &cat.local
        } else {
            &cat.cluster
        };
        out.insert(
            (spn.protocol, np),
            Forward {
                endpoints: chosen
                    .iter()
                    .map(|e| SocketAddr::new(e.ip, e.port))
                    .collect(),
                affinity: sp.affinity_timeout.map(|t| Duration::from_secs(t as u64)),
            },
        );
    }
    out
}

/// Running localhost listeners.
#[derive(Default)]
pub struct LocalhostNodePorts {
    listeners: BTreeMap<(Protocol, u16), Listener>,
    failed: std::collections::BTreeSet<(Protocol, u16)>,
    /// Connections and UDP sessions forwarded, for
    /// `kubeproxy_iptables_localhost_nodeports_accepted_packets_total`.
    accepted: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl LocalhostNodePorts {
    /// Listeners that add each connection or UDP session they forward to `accepted`.
    pub fn new(accepted: std::sync::Arc<std::sync::atomic::AtomicU64>) -> Self {
        Self {
            accepted,
            ..Self::default()
        }
    }

    /// Starts, updates and stops listeners to match `want`. Must run inside the runtime. A
    /// port that cannot be bound is reported once and retried at the next sync.
    pub fn sync(&mut self, want: BTreeMap<(Protocol, u16), Forward>) {
        self.listeners.retain(|k, _| want.contains_key(k));
        for (k, f) in want {
            if let Some(l) = self.listeners.get(&k) {
                l.balancer.set(f);
                continue;
            }
            let at = SocketAddr::from(([127, 0, 0, 1], k.1));
            match listen_counted(k.0, at, f, Some(self.accepted.clone())) {
                Ok(l) => {
                    self.failed.remove(&k);
                    self.listeners.insert(k, l);
                }
                Err(e) => {
                    if self.failed.insert(k) {
                        tracing::error!(
                            port = k.1,
                            proto = k.0.lower(),
                            "cannot listen for localhost NodePort: {e}"
                        );
                    }
                }
            }
        }
    }
}
