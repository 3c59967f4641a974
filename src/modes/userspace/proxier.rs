//! [`UserspaceProxier`]: owns the userspace mode's listeners and keeps its redirect table in
//! step with them (through the shared [`TableSync`]). I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::kernel::nft::{Family, Nftables, Table};
use crate::model::{ProxyState, ServicePortName};
use crate::proxy::{
    Fragment, Proxier, ProxierConfig, Ruleset, SyncError, SyncStats, TableSync, TABLE_COMMENT,
};

use super::forward::{listen, Forward, Listener};
use super::listeners::{plan_listeners, ListenerKey};
use super::table::{build_base, build_service};

/// The userspace mode's proxier: listeners plus the redirect table.
pub struct UserspaceProxier<N: Nftables> {
    nft: N,
    cfg: ProxierConfig,
    listeners: BTreeMap<ListenerKey, Listener>,
    failed: BTreeSet<ListenerKey>,
    warned_sctp: BTreeSet<ServicePortName>,
    table: TableSync,
    need_full: bool,
    /// The IP families served, primary first (both unless the host has no usable IPv6).
    families: Vec<Family>,
}

impl<N: Nftables> UserspaceProxier<N> {
    pub fn new(nft: N, cfg: ProxierConfig) -> Self {
        UserspaceProxier {
            nft,
            table: TableSync::new(cfg.table.clone()),
            cfg,
            listeners: BTreeMap::new(),
            failed: BTreeSet::new(),
            warned_sctp: BTreeSet::new(),
            need_full: true,
            families: Family::all().to_vec(),
        }
    }

    /// Serves `families` only: no listener or table of another family.
    pub fn with_families(mut self, families: Vec<Family>) -> Self {
        self.families = families;
        self
    }

    /// The nftables client (tests inspect the fake through it).
    pub fn nft(&mut self) -> &mut N {
        &mut self.nft
    }

    /// The listening port of one listener (tests connect to it directly).
    pub fn listener_port(&self, key: &ListenerKey) -> Option<u16> {
        self.listeners.get(key).map(|l| l.port)
    }

    /// Starts, updates and stops listeners; a listener that cannot be bound is reported
    /// once and retried at the next sync (its service is left out of the table meanwhile).
    fn sync_listeners(&mut self, want: BTreeMap<ListenerKey, Forward>) {
        self.listeners.retain(|k, _| want.contains_key(k));
        for (k, f) in want {
            if let Some(l) = self.listeners.get(&k) {
                l.balancer.set(f);
                continue;
            }
            let any: IpAddr = if k.v4 {
                IpAddr::from([0u8; 4])
            } else {
                IpAddr::from([0u16; 8])
            };
            match listen(k.service.protocol, SocketAddr::new(any, 0), f) {
                Ok(l) => {
                    self.failed.remove(&k);
                    self.listeners.insert(k, l);
                }
                Err(e) => {
                    if self.failed.insert(k.clone()) {
                        tracing::error!(service = %k.service, err = %e, "cannot start a userspace listener");
                    }
                }
            }
        }
    }

    pub fn force_full_sync(&mut self) {
        self.need_full = true;
    }

    pub fn has_pending_work(&self) -> bool {
        self.table.has_pending_deletes()
    }

    pub fn sync(&mut self, state: &ProxyState) -> Result<SyncStats, SyncError> {
        let (mut want, sctp) = plan_listeners(state);
        let family_of = |k: &ListenerKey| if k.v4 { Family::Ip } else { Family::Ip6 };
        want.retain(|k, _| self.families.contains(&family_of(k)));
        for spn in sctp {
            if self.warned_sctp.insert(spn.clone()) {
                tracing::warn!(service = %spn, "SCTP cannot be proxied in userspace mode; service port skipped");
            }
        }
        let has_eps: BTreeMap<ListenerKey, bool> = want
            .iter()
            .map(|(k, f)| (k.clone(), !f.endpoints.is_empty()))
            .collect();
        self.sync_listeners(want);
        let ports: BTreeMap<ListenerKey, (u16, bool)> = self
            .listeners
            .iter()
            .map(|(k, l)| {
                (
                    k.clone(),
                    (l.port, has_eps.get(k).copied().unwrap_or(false)),
                )
            })
            .collect();
        let full = self.need_full;
        let listeners = self
            .listeners
            .iter()
            .map(|(k, l)| {
                let f = l.balancer.current();
                crate::proxy::ListenerInfo {
                    service: k.service.to_string(),
                    external: k.external,
                    ipv4: k.v4,
                    port: l.port,
                    endpoints: f.as_ref().map(|f| f.endpoints.clone()).unwrap_or_default(),
                    affinity_seconds: f.and_then(|f| f.affinity).map(|d| d.as_secs()),
                }
            })
            .collect();
        let mut stats = SyncStats {
            full,
            listeners: Some(Arc::new(listeners)),
            ..Default::default()
        };
        let mut first_err = None;
        for family in self.families.clone() {
            let table = Table {
                family,
                name: self.cfg.table.clone(),
                comment: Some(TABLE_COMMENT.into()),
            };
            let mut rs = Ruleset::new(table, build_base(&self.cfg, &state.node, family));
            for spn in state.services.keys() {
                if let Some(frag) = build_service(state, spn, &ports, family) {
                    if frag != Fragment::default() {
                        rs.set_service(spn, Some(Arc::new(frag)));
                    }
                }
            }
            if let Err(e) = self.table.sync(&mut self.nft, rs, full, &mut stats) {
                first_err.get_or_insert(e);
            }
        }
        self.table.count(&mut stats);
        match first_err {
            Some(e) => {
                self.need_full = true;
                Err(e)
            }
            None => {
                self.need_full = false;
                Ok(stats)
            }
        }
    }

    /// `--dry-run`: the listeners and where they forward (their ports, and so the redirect
    /// rules, are chosen when the daemon binds them).
    pub fn render_listeners(state: &ProxyState) -> String {
        use std::fmt::Write;
        let (want, sctp) = plan_listeners(state);
        let mut out = String::new();
        for (k, f) in want {
            let scope = if k.external { "external" } else { "internal" };
            let fam = if k.v4 { "IPv4" } else { "IPv6" };
            let eps: Vec<String> = f.endpoints.iter().map(|e| e.to_string()).collect();
            let _ = writeln!(out, "{} {scope} {fam} -> [{}]", k.service, eps.join(", "));
        }
        for s in sctp {
            let _ = writeln!(out, "# {s}: SCTP cannot be proxied in userspace; skipped");
        }
        out
    }
}

impl<N: Nftables> Proxier for UserspaceProxier<N> {
    fn sync(&mut self, state: &Arc<ProxyState>) -> Result<SyncStats, SyncError> {
        UserspaceProxier::sync(self, state)
    }
    fn force_full_sync(&mut self) {
        UserspaceProxier::force_full_sync(self)
    }
    fn has_pending_work(&self) -> bool {
        UserspaceProxier::has_pending_work(self)
    }
    fn dry_run(&mut self, state: &ProxyState) -> Result<String, SyncError> {
        Ok(Self::render_listeners(state))
    }
    fn cleanup(&mut self) -> Result<Vec<String>, SyncError> {
        crate::proxy::cleanup::delete_tables(&mut self.nft, &[self.cfg.table.as_str()])
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernel::nft::fake::FakeNftables;
    use crate::model::{Endpoint, Protocol, ServicePort};

    pub(crate) fn spn(name: &str, p: Protocol) -> ServicePortName {
        ServicePortName {
            namespace: "ns".into(),
            name: name.into(),
            port: "p".into(),
            protocol: p,
        }
    }
    pub(crate) fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    pub(crate) fn sample() -> ProxyState {
        let mut st = ProxyState::default();
        st.node.name = "node1".into();
        let mut web = ServicePort::new(spn("web", Protocol::Tcp), ip("10.96.0.10"), 80);
        web.node_port = Some(30080);
        web.external_policy_local = true;
        st.endpoints.insert(
            web.name.clone(),
            vec![
                Endpoint::ready(ip("10.244.1.2"), 8080, true),
                Endpoint::ready(ip("10.244.2.2"), 8080, false),
            ]
            .into(),
        );
        st.services.insert(web.name.clone(), web.into());
        let empty = ServicePort::new(spn("empty", Protocol::Udp), ip("10.96.0.11"), 53);
        st.services.insert(empty.name.clone(), empty.into());
        let sctp = ServicePort::new(spn("sctp", Protocol::Sctp), ip("10.96.0.12"), 9);
        st.services.insert(sctp.name.clone(), sctp.into());
        st
    }

    /// A proxier on the fake kernel with table `t` and the default configuration.
    fn proxier() -> UserspaceProxier<FakeNftables> {
        UserspaceProxier::new(
            FakeNftables::default(),
            ProxierConfig {
                table: "t".into(),
                ..Default::default()
            },
        )
    }

    #[tokio::test]
    async fn node_ports_follow_nodeport_addresses() {
        let mut p = UserspaceProxier::new(
            FakeNftables::default(),
            ProxierConfig {
                table: "t".into(),
                nodeport_addresses: crate::proxy::NodePortAddresses::cidrs(vec!["192.168.50.0/24"
                    .parse()
                    .unwrap()]),
                ..Default::default()
            },
        );
        p.sync(&sample()).unwrap();
        let dump = p.nft().dump(Family::Ip, "t");
        assert!(
            dump.contains("fib daddr type local ip daddr 192.168.50.0/24 meta l4proto . th dport vmap @service-nodeports"),
            "{dump}"
        );
        assert!(!dump.contains("ip daddr != 127.0.0.0/8"), "{dump}");
    }

    #[tokio::test]
    async fn an_sctp_port_gets_no_listener_and_one_warning() {
        let mut p = proxier();
        let st = sample();
        p.sync(&st).unwrap();
        p.sync(&st).unwrap();
        let sctp = spn("sctp", Protocol::Sctp);
        // Remembered once, so the second sync did not warn again.
        assert_eq!(p.warned_sctp.iter().collect::<Vec<_>>(), [&sctp]);
        for (external, v4) in [(false, true), (true, true)] {
            let key = ListenerKey {
                service: sctp.clone(),
                external,
                v4,
            };
            assert_eq!(p.listener_port(&key), None);
        }
        let dump = p.nft().dump(Family::Ip, "t");
        assert!(!dump.contains("10.96.0.12"), "{dump}");
    }

    #[tokio::test]
    async fn sync_binds_listeners_and_redirects_to_them() {
        let mut p = proxier();
        let st = sample();
        p.sync(&st).unwrap();
        let key = ListenerKey {
            service: spn("web", Protocol::Tcp),
            external: false,
            v4: true,
        };
        let port = p.listener_port(&key).expect("listener bound");
        let dump = p.nft().dump(Family::Ip, "t");
        assert!(dump.contains(&format!("redirect to :{port}")), "{dump}");
        assert!(dump.contains("service-nodeports { tcp . 30080"), "{dump}");
        assert!(
            dump.contains("no-endpoint-services { 10.96.0.11 . udp . 53 comment \"ns/empty:p\" : goto reject-chain }"),
            "{dump}"
        );
        // A second sync with nothing changed keeps the same listener and sends nothing.
        let s = p.sync(&st).unwrap();
        assert_eq!(p.listener_port(&key), Some(port));
        assert_eq!(s.ops.values().sum::<usize>(), 0);
        // The Service goes away: its listener closes.
        let mut st2 = st.clone();
        st2.services.remove(&key.service);
        p.sync(&st2).unwrap();
        assert_eq!(p.listener_port(&key), None);
        // The aborted task drops its socket when the runtime next runs it.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    }
}
