//! Applies [`IpvsPlan`]s: the companion nftables table in one atomic batch per family,
//! VIPs on the dummy link, then virtual and real servers, one acknowledged request per
//! change. Removed real servers drain at weight 0 until their connections are gone or the
//! grace period ends (UDP and SCTP are deleted at once, as upstream). Virtual servers we
//! do not own (address neither on our dummy link nor a node address serving a NodePort) are
//! never touched, nor are any inside `excludeCIDRs`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::kernel::conntrack::Conntrack;
use crate::kernel::ipvs::{Error, Ipvs, IpvsOp, Timeouts, VsKey};
use crate::kernel::nft::{render, Family, Nftables};
use crate::kernel::rtnl::{host_prefix, IfAddr, Links};
use crate::model::ProxyState;
use crate::proxy::conntrack::{reconcile_conntrack, Destinations};
use crate::proxy::{
    plan_transaction, DetectLocal, LocalDetectorResolver, Proxier, ProxierConfig, SyncError,
    SyncStats, TableSync,
};

use super::diff::{real_server_diff, virtual_server_ops, Applied, Then};
use super::drain::{drain_step, DrainManager, DrainStep};
use super::plan::{build_plan, nodeport_addresses, IpvsConfig, IpvsPlan};
use super::table;

/// The NodePort range of a default apiserver: after a restart, virtual servers on node
/// addresses in this range are ours even when their Service is gone.
pub const NODEPORT_RANGE: std::ops::RangeInclusive<u16> = 30000..=32767;

/// Whether `op` set up an `mh` virtual server and the kernel answered that it has no such
/// scheduler (ENOENT: `ip_vs_add_service` found no `ip_vs_mh`).
fn refuses_mh(op: &IpvsOp, r: &Result<(), crate::kernel::ipvs::Error>) -> bool {
    let mh = match op {
        IpvsOp::AddService(vs) | IpvsOp::UpdateService(vs) => vs.scheduler == super::plan::MH,
        _ => false,
    };
    mh && matches!(r, Err(e) if e.errno() == Some(libc::ENOENT))
}

/// Keeps IPVS, the dummy link and the companion table in step with the model.
pub struct IpvsProxier<I: Ipvs, L: Links, N: Nftables> {
    ipvs: I,
    links: L,
    nft: N,
    cfg: IpvsConfig,
    proxier: ProxierConfig,
    local: LocalDetectorResolver,
    applied: BTreeMap<VsKey, Applied>,
    /// Draining real servers and when their grace period ends.
    draining: DrainManager,
    table: TableSync,
    need_full: bool,
    last_full: Option<Instant>,
    /// A full sync re-lists the kernel at least this often, restoring anything removed
    /// behind our back (IPVS has no change notifications).
    full_every: Duration,
    timeouts_done: bool,
    conntrack: Option<Box<dyn Conntrack + Send>>,
    /// The stale-flow cleanup's service destinations, kept between syncs.
    destinations: Destinations,
    /// The IP families programmed, primary first (both unless the host has no usable IPv6).
    families: Vec<Family>,
}

impl<I: Ipvs, L: Links, N: Nftables> IpvsProxier<I, L, N> {
    pub fn new(
        ipvs: I,
        links: L,
        nft: N,
        cfg: IpvsConfig,
        proxier: ProxierConfig,
        detect_local: DetectLocal,
    ) -> Self {
        IpvsProxier {
            ipvs,
            links,
            nft,
            cfg,
            table: TableSync::new(proxier.table.clone()),
            proxier,
            local: LocalDetectorResolver::new(detect_local),
            applied: BTreeMap::new(),
            draining: DrainManager::default(),
            need_full: true,
            last_full: None,
            full_every: Duration::from_secs(30),
            timeouts_done: false,
            conntrack: None,
            destinations: Destinations::default(),
            families: Family::all().to_vec(),
        }
    }

    /// Programs `families` only: no virtual server, address or table of another family.
    pub fn with_families(mut self, families: Vec<Family>) -> Self {
        self.families = families;
        self
    }

    /// Enables the stale UDP/SCTP conntrack cleanup after each successful sync.
    pub fn with_conntrack(mut self, ct: Box<dyn Conntrack + Send>) -> Self {
        self.conntrack = Some(ct);
        self
    }

    /// How often a sync re-lists the kernel (the sync period).
    pub fn with_full_every(mut self, d: Duration) -> Self {
        self.full_every = d;
        self
    }

    pub fn ipvs(&mut self) -> &mut I {
        &mut self.ipvs
    }
    pub fn links(&mut self) -> &mut L {
        &mut self.links
    }
    pub fn nft(&mut self) -> &mut N {
        &mut self.nft
    }

    pub fn force_full_sync(&mut self) {
        self.need_full = true;
    }

    /// Whether real servers are draining or chains await deletion (sync again soon).
    pub fn has_pending_work(&self) -> bool {
        !self.draining.is_empty() || self.table.has_pending_deletes()
    }

    /// The addresses on our dummy link (`index`) and those on every other link.
    fn split_addresses(
        &mut self,
        index: u32,
    ) -> Result<(BTreeSet<IpAddr>, BTreeSet<IpAddr>), SyncError> {
        let (mut bound, mut other) = (BTreeSet::new(), BTreeSet::new());
        for a in self.links.addresses()? {
            if a.index == index {
                bound.insert(a.addr);
            } else {
                other.insert(a.addr);
            }
        }
        Ok((bound, other))
    }

    fn excluded(&self, a: &IpAddr) -> bool {
        self.cfg.exclude_cidrs.iter().any(|c| c.contains(a))
    }

    /// One sync. Every step runs even when an earlier one failed (a bad object never stops
    /// the rest); the first error is returned and the next sync is a full one.
    pub fn sync(&mut self, state: &ProxyState) -> Result<SyncStats, SyncError> {
        let full = self.need_full
            || self
                .last_full
                .is_none_or(|t| t.elapsed() >= self.full_every);
        let mut stats = SyncStats {
            full,
            ..Default::default()
        };
        let res = self.sync_inner(state, full, &mut stats);
        match &res {
            Ok(()) => {
                if let Some(ct) = self.conntrack.as_mut() {
                    reconcile_conntrack(
                        ct.as_mut(),
                        state,
                        (&self.families, &mut self.destinations),
                        &mut stats,
                    );
                }
                self.need_full = false;
                if full {
                    self.last_full = Some(Instant::now());
                }
            }
            Err(_) => {
                self.need_full = true;
                self.table.forget();
            }
        }
        res.map(|()| stats)
    }

    fn sync_inner(
        &mut self,
        state: &ProxyState,
        full: bool,
        stats: &mut SyncStats,
    ) -> Result<(), SyncError> {
        if !self.timeouts_done {
            let t = Timeouts {
                tcp: self.cfg.tcp_timeout,
                tcp_fin: self.cfg.tcp_fin_timeout,
                udp: self.cfg.udp_timeout,
            };
            if t != Timeouts::default() {
                self.ipvs.set_timeouts(t)?;
            }
            self.timeouts_done = true;
        }
        // The dummy link and the addresses around it.
        let name = self.cfg.dummy_link.clone();
        let link = match self.links.link(&name)? {
            Some(l) => l,
            None => {
                tracing::info!(link = %name, "creating the dummy link for service addresses");
                self.links.add_dummy(&name)?;
                self.links
                    .link(&name)?
                    .ok_or_else(|| SyncError::LinkVanished(name.clone()))?
            }
        };
        let (bound, local) = self.split_addresses(link.index)?;
        let local: Vec<IpAddr> = local.into_iter().collect();
        let node_addrs = nodeport_addresses(
            &local,
            &self.proxier.nodeport_addresses,
            &state.node.addresses,
        );
        let mut plan = build_plan(state, &self.cfg, &node_addrs);
        plan.retain_families(&self.families);
        let mut first_err: Option<SyncError> = None;

        // 1. The companion table first, so no-endpoint rejects and source-range firewalls
        //    are in force before a virtual server can take traffic.
        let pcfg = self.local.resolve(&self.proxier, &state.node);
        for family in self.families.clone() {
            if let Err(e) = self.sync_table(state, &plan, &pcfg, family, full, stats) {
                first_err.get_or_insert(e);
            }
        }
        self.table.count(stats);
        // 2. New VIPs, so virtual servers are reachable the moment they exist.
        let on_link = |vips: &mut dyn Iterator<Item = &IpAddr>| -> Vec<IfAddr> {
            vips.map(|vip| IfAddr {
                index: link.index,
                addr: *vip,
                prefix_len: host_prefix(vip),
            })
            .collect()
        };
        let new_vips = on_link(&mut plan.vips.difference(&bound));
        for r in self.links.change_addresses(true, &new_vips) {
            match r {
                Ok(()) => stats.ipvs_changes += 1,
                Err(e) if e.source.errno() == Some(libc::EEXIST) => {}
                Err(e) => {
                    first_err.get_or_insert(e.into());
                }
            }
        }
        // 3. Virtual and real servers.
        if let Err(e) = self.sync_ipvs(&plan, &bound, &node_addrs, full, stats) {
            first_err.get_or_insert(e);
        }
        // 4. VIPs of services that are gone.
        let gone_vips = on_link(&mut bound.difference(&plan.vips));
        for r in self.links.change_addresses(false, &gone_vips) {
            match r {
                Ok(()) => stats.ipvs_changes += 1,
                Err(e) => {
                    first_err.get_or_insert(e.into());
                }
            }
        }
        stats.virtual_servers = self.applied.len();
        first_err.map_or(Ok(()), Err)
    }

    fn sync_table(
        &mut self,
        state: &ProxyState,
        plan: &IpvsPlan,
        pcfg: &ProxierConfig,
        family: Family,
        full: bool,
        stats: &mut SyncStats,
    ) -> Result<(), SyncError> {
        let rs = table::build_ruleset(state, plan, pcfg, family);
        self.table.sync(&mut self.nft, rs, full, stats)
    }

    /// What the kernel has that is ours, listed (full sync).
    fn list_owned(
        &mut self,
        plan: &IpvsPlan,
        bound: &BTreeSet<IpAddr>,
        node_addrs: &[IpAddr],
    ) -> Result<BTreeMap<VsKey, Applied>, Error> {
        let mut out = BTreeMap::new();
        for vs in self.ipvs.services()? {
            let k = vs.key();
            let ours = bound.contains(&k.addr)
                || plan.vips.contains(&k.addr)
                || plan.services.contains_key(&k)
                || (node_addrs.contains(&k.addr) && NODEPORT_RANGE.contains(&k.port));
            if !ours {
                continue;
            }
            let dests = self
                .ipvs
                .dests(&vs)?
                .into_iter()
                .map(|d| ((d.addr, d.port), d.weight))
                .collect();
            out.insert(k, Applied { vs, dests });
        }
        Ok(out)
    }

    fn sync_ipvs(
        &mut self,
        plan: &IpvsPlan,
        bound: &BTreeSet<IpAddr>,
        node_addrs: &[IpAddr],
        full: bool,
        stats: &mut SyncStats,
    ) -> Result<(), SyncError> {
        let current = if full {
            self.list_owned(plan, bound, node_addrs)?
        } else {
            // Rebuilt below as `next`; no need to copy every virtual server each sync.
            std::mem::take(&mut self.applied)
        };
        if full {
            // What we had applied and the kernel no longer has was removed behind our back.
            for (key, a) in &self.applied {
                stats.restored += match current.get(key) {
                    None => 1 + a.dests.len(),
                    Some(c) => a.dests.keys().filter(|d| !c.dests.contains_key(d)).count(),
                };
            }
            if stats.restored > 0 {
                tracing::warn!(
                    restored = stats.restored,
                    "IPVS virtual or real servers were removed by someone else; restoring them"
                );
            }
        }
        let mut first_err: Option<Error> = None;
        let mut note = |r: Result<(), Error>, stats: &mut SyncStats| match r {
            Ok(()) => {
                stats.ipvs_changes += 1;
                true
            }
            Err(e) => {
                tracing::warn!(err = %e, "IPVS change failed; the next sync retries it");
                first_err.get_or_insert(e);
                false
            }
        };
        let now = Instant::now();
        let until = now + self.cfg.graceful_termination;
        // Two pipelined rounds: virtual servers first, then their real servers (a real
        // server of a virtual server that could not be added is not attempted).
        let (keys, round): (Vec<VsKey>, Vec<IpvsOp>) =
            virtual_server_ops(plan, &current).into_iter().unzip();
        let mut not_added: BTreeSet<VsKey> = BTreeSet::new();
        let mut mh_refused = false;
        for ((op, key), r) in round.iter().zip(&keys).zip(self.ipvs.apply(&round)) {
            mh_refused |= refuses_mh(op, &r);
            if !note(r, stats) && matches!(op, IpvsOp::AddService(_)) {
                not_added.insert(*key);
            }
        }
        if mh_refused && self.cfg.mh_scheduler {
            // Planned again at the next sync, which the failure of this one brings soon.
            self.cfg.mh_scheduler = false;
            tracing::warn!(
                scheduler = %self.cfg.scheduler,
                "The kernel has no IPVS mh scheduler (module ip_vs_mh); Maglev Services use the configured scheduler"
            );
        }
        let diff = real_server_diff(plan, &current, &not_added, |a| self.excluded(a));
        for (vs, d) in &diff.planned {
            self.draining.stop(*vs, *d);
        }
        for (vs, d) in &diff.idle {
            self.draining.start(*vs, *d, until);
        }
        for vs in &diff.deleted {
            self.draining.forget(vs);
        }
        let (round, then): (Vec<IpvsOp>, Vec<Then>) = diff.ops.into_iter().unzip();
        let mut next = diff.next;
        for (t, r) in then.into_iter().zip(self.ipvs.apply(&round)) {
            if !note(r, stats) {
                continue;
            }
            let (key, k, w) = match t {
                Then::Weight(key, k, w) => (key, k, w),
                Then::Drain(key, k) => {
                    self.draining.start(key, k, until);
                    (key, k, 0)
                }
                Then::Nothing => continue,
            };
            if let Some(a) = next.get_mut(&key) {
                a.dests.insert(k, w);
            }
        }
        self.applied = next;
        self.end_draining(now, &mut |r| note(r, stats));
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Deletes the draining real servers with no connections left or out of time; `note`
    /// counts each deletion and says whether it succeeded.
    fn end_draining(&mut self, now: Instant, note: &mut dyn FnMut(Result<(), Error>) -> bool) {
        for key in self.draining.virtual_servers() {
            let Some(a) = self.applied.get(&key).cloned() else {
                self.draining.forget(&key);
                continue;
            };
            let dests = match self.ipvs.dests(&a.vs) {
                Ok(d) => d,
                Err(e) => {
                    note(Err(e));
                    continue;
                }
            };
            for (dest, deadline) in self.draining.of(&key) {
                let found = dests.iter().find(|d| (d.addr, d.port) == dest);
                let done = match (drain_step(found, deadline, now), found) {
                    (DrainStep::Delete, Some(d)) => note(self.ipvs.delete_dest(&a.vs, d)),
                    (DrainStep::Wait, _) => false,
                    (DrainStep::Gone | DrainStep::Delete, _) => true,
                };
                if done {
                    self.draining.stop(key, dest);
                    if let Some(ap) = self.applied.get_mut(&key) {
                        ap.dests.remove(&dest);
                    }
                }
            }
        }
    }

    /// Removes everything we created: our virtual servers, the dummy link and the
    /// companion table. Returns what was removed.
    pub fn cleanup(&mut self) -> Result<Vec<String>, SyncError> {
        Ok(self.remove_virtual_servers(false)?.removed)
    }

    /// What another mode does at start with an IPVS mode's state (ours or upstream's):
    /// removes the virtual servers without connections and the companion table, keeps
    /// those whose real servers still count connections (IPVS forwards an established
    /// flow only through its virtual server's connection entry, so removing it cuts the
    /// flow) with their addresses, and the link while any is kept. Called again until
    /// [`Leftovers::kept`] is empty.
    pub fn drain(&mut self) -> Result<Leftovers, SyncError> {
        self.remove_virtual_servers(true)
    }

    fn remove_virtual_servers(&mut self, keep_busy: bool) -> Result<Leftovers, SyncError> {
        let mut out = Leftovers::default();
        let name = self.cfg.dummy_link.clone();
        if let Some(link) = self.links.link(&name)? {
            let (bound, node) = self.split_addresses(link.index)?;
            let mut n = 0;
            let mut busy_addrs = BTreeSet::new();
            for vs in self.ipvs.services()? {
                let ours = bound.contains(&vs.addr)
                    || (node.contains(&vs.addr) && NODEPORT_RANGE.contains(&vs.port));
                if !ours || self.excluded(&vs.addr) {
                    continue;
                }
                if keep_busy {
                    let conns: u64 = self
                        .ipvs
                        .dests(&vs)?
                        .iter()
                        .map(|d| u64::from(d.active_conns) + u64::from(d.inactive_conns))
                        .sum();
                    if conns > 0 {
                        busy_addrs.insert(vs.addr);
                        out.kept.push((vs.key(), conns));
                        continue;
                    }
                }
                self.ipvs.delete_service(&vs)?;
                n += 1;
            }
            if n > 0 || out.kept.is_empty() {
                out.removed
                    .push(format!("{n} IPVS virtual servers on {name} addresses"));
            }
            if out.kept.is_empty() {
                self.links.delete_link(link.index)?;
                out.removed.push(format!("link {name}"));
            } else {
                // An address no kept virtual server uses would only answer new connections
                // with a reset from the node's own stack.
                for a in self.links.addresses()? {
                    if a.index == link.index && !busy_addrs.contains(&a.addr) {
                        self.links.delete_address(&a)?;
                    }
                }
            }
        }
        let t = self.proxier.table.clone();
        out.removed
            .extend(crate::proxy::cleanup::delete_tables(&mut self.nft, &[&t])?);
        Ok(out)
    }
}

/// What [`IpvsProxier::drain`] removed and what it kept.
#[derive(Debug, Default)]
pub struct Leftovers {
    pub removed: Vec<String>,
    /// The virtual servers kept for their connections, with the connection count.
    pub kept: Vec<(VsKey, u64)>,
}

/// `--dry-run`: the virtual servers and the companion table a full sync would program,
/// reading the node's addresses through `links` but changing nothing.
pub fn render_plan<L: Links>(
    links: &mut L,
    cfg: &IpvsConfig,
    proxier: &ProxierConfig,
    local: &mut LocalDetectorResolver,
    state: &ProxyState,
) -> Result<String, SyncError> {
    let index = links.link(&cfg.dummy_link)?.map(|l| l.index);
    let addrs: Vec<IpAddr> = links
        .addresses()?
        .into_iter()
        .filter(|a| Some(a.index) != index)
        .map(|a| a.addr)
        .collect();
    let node_addrs = nodeport_addresses(&addrs, &proxier.nodeport_addresses, &state.node.addresses);
    let plan = build_plan(state, cfg, &node_addrs);
    let mut out = super::plan::render(&plan);
    let pcfg = local.resolve(proxier, &state.node);
    for family in Family::all() {
        let rs = table::build_ruleset(state, &plan, &pcfg, family);
        out.push_str(&render::transaction(
            &plan_transaction(None, &rs, None, &[]).tx,
        ));
    }
    Ok(out)
}

impl<I: Ipvs, L: Links, N: Nftables> Proxier for IpvsProxier<I, L, N> {
    fn sync(&mut self, state: &Arc<ProxyState>) -> Result<SyncStats, SyncError> {
        IpvsProxier::sync(self, state)
    }
    fn force_full_sync(&mut self) {
        IpvsProxier::force_full_sync(self)
    }
    fn has_pending_work(&self) -> bool {
        IpvsProxier::has_pending_work(self)
    }
    fn dry_run(&mut self, state: &ProxyState) -> Result<String, SyncError> {
        render_plan(
            &mut self.links,
            &self.cfg,
            &self.proxier,
            &mut self.local,
            state,
        )
    }
    fn cleanup(&mut self) -> Result<Vec<String>, SyncError> {
        IpvsProxier::cleanup(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::ipvs::fake::FakeIpvs;
    use crate::kernel::ipvs::VirtualServer;
    use crate::kernel::nft::fake::FakeNftables;
    use crate::kernel::rtnl::{FakeLinks, Link};
    use crate::model::{Endpoint, Protocol, ServicePort, ServicePortName};

    type R = IpvsProxier<FakeIpvs, FakeLinks, FakeNftables>;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }
    fn spn(name: &str, proto: Protocol) -> ServicePortName {
        ServicePortName {
            namespace: "ns".into(),
            name: name.into(),
            port: "p".into(),
            protocol: proto,
        }
    }
    fn key(a: &str, port: u16, protocol: u8) -> VsKey {
        VsKey {
            addr: ip(a),
            port,
            protocol,
        }
    }

    fn reconciler() -> R {
        let links = FakeLinks {
            links: vec![Link {
                index: 2,
                name: "eth0".into(),
                kind: String::new(),
            }],
            addrs: vec![IfAddr {
                index: 2,
                addr: ip("192.168.50.1"),
                prefix_len: 24,
            }],
        };
        IpvsProxier::new(
            FakeIpvs::default(),
            links,
            FakeNftables::default(),
            IpvsConfig::default(),
            ProxierConfig {
                table: table::DEFAULT_TABLE.into(),
                ..Default::default()
            },
            DetectLocal::ClusterCidr(vec![]),
        )
    }

    fn state(eps: &[&str], proto: Protocol) -> ProxyState {
        let mut st = ProxyState::default();
        st.node.name = "node1".into();
        let mut sp = ServicePort::new(spn("web", proto), ip("10.96.0.10"), 80);
        sp.node_port = Some(30080);
        st.endpoints.insert(
            sp.name.clone(),
            eps.iter()
                .map(|e| Endpoint::ready(ip(e), 8080, true))
                .collect::<Vec<_>>()
                .into(),
        );
        st.services.insert(sp.name.clone(), sp.into());
        st
    }

    fn dest_weights(r: &mut R, k: &VsKey) -> Vec<(String, u32)> {
        r.ipvs()
            .dests_of(k)
            .into_iter()
            .map(|d| (d.addr.to_string(), d.weight))
            .collect()
    }

    #[test]
    fn creates_link_vips_and_servers_then_idles() {
        let mut r = reconciler();
        let st = state(&["10.244.1.2", "10.244.1.3"], Protocol::Tcp);
        let s = r.sync(&st).unwrap();
        assert!(s.full);
        let link = r.links().link("kube-ipvs0").unwrap().expect("dummy link");
        assert_eq!(link.kind, "dummy");
        let bound: Vec<IpAddr> = r
            .links()
            .addrs
            .iter()
            .filter(|a| a.index == link.index)
            .map(|a| a.addr)
            .collect();
        assert_eq!(bound, [ip("10.96.0.10")]);
        let keys: Vec<VsKey> = r.ipvs().services.keys().copied().collect();
        assert_eq!(
            keys,
            [key("10.96.0.10", 80, 6), key("192.168.50.1", 30080, 6)]
        );
        assert_eq!(
            dest_weights(&mut r, &key("10.96.0.10", 80, 6)),
            [("10.244.1.2".into(), 1), ("10.244.1.3".into(), 1)]
        );
        // Nothing changed: nothing is written.
        let before = r.ipvs().writes;
        let s = r.sync(&st).unwrap();
        assert!(!s.full);
        assert_eq!(s.ipvs_changes, 0);
        assert_eq!(r.ipvs().writes, before);
    }

    #[test]
    fn real_servers_of_a_virtual_server_that_could_not_be_added_are_not_sent() {
        let mut r = reconciler();
        r.sync(&ProxyState {
            node: state(&[], Protocol::Tcp).node,
            ..Default::default()
        })
        .unwrap();
        // Someone else adds the ClusterIP's virtual server between syncs: our partial sync's
        // add fails with EEXIST, and its real servers are not sent (they would fail too).
        let st = state(&["10.244.1.2", "10.244.1.3"], Protocol::Tcp);
        let vs = build_plan(&st, &IpvsConfig::default(), &[ip("192.168.50.1")]).services
            [&key("10.96.0.10", 80, 6)]
            .vs
            .clone();
        r.ipvs().add_service(&vs).unwrap();
        assert!(r.sync(&st).is_err(), "the failed add is reported");
        assert!(dest_weights(&mut r, &key("10.96.0.10", 80, 6)).is_empty());
        assert_eq!(
            dest_weights(&mut r, &key("192.168.50.1", 30080, 6)).len(),
            2,
            "the other virtual server got its real servers"
        );
        // The failure makes the next sync a full one, which takes the server over.
        r.sync(&st).unwrap();
        assert_eq!(
            dest_weights(&mut r, &key("10.96.0.10", 80, 6)),
            [("10.244.1.2".into(), 1), ("10.244.1.3".into(), 1)]
        );
    }

    #[test]
    fn removed_tcp_endpoint_drains_then_goes() {
        let mut r = reconciler();
        r.sync(&state(&["10.244.1.2", "10.244.1.3"], Protocol::Tcp))
            .unwrap();
        let k = key("10.96.0.10", 80, 6);
        r.ipvs().set_conns(&k, (ip("10.244.1.3"), 8080), 1, 0);
        let st = state(&["10.244.1.2"], Protocol::Tcp);
        r.sync(&st).unwrap();
        assert_eq!(
            dest_weights(&mut r, &k),
            [("10.244.1.2".into(), 1), ("10.244.1.3".into(), 0)],
            "a draining real server stays at weight 0 while it has connections"
        );
        assert!(r.has_pending_work());
        r.sync(&st).unwrap();
        assert_eq!(dest_weights(&mut r, &k).len(), 2);
        r.ipvs().set_conns(&k, (ip("10.244.1.3"), 8080), 0, 0);
        r.sync(&st).unwrap();
        assert_eq!(dest_weights(&mut r, &k), [("10.244.1.2".into(), 1)]);
        // The NodePort virtual server drained with no connections: gone at once.
        assert_eq!(
            dest_weights(&mut r, &key("192.168.50.1", 30080, 6)),
            [("10.244.1.2".into(), 1)]
        );
        assert!(!r.has_pending_work());
    }

    #[test]
    fn a_draining_endpoint_that_comes_back_gets_weight_again() {
        let mut r = reconciler();
        let k = key("10.96.0.10", 80, 6);
        r.sync(&state(&["10.244.1.2", "10.244.1.3"], Protocol::Tcp))
            .unwrap();
        r.ipvs().set_conns(&k, (ip("10.244.1.3"), 8080), 3, 0);
        r.sync(&state(&["10.244.1.2"], Protocol::Tcp)).unwrap();
        r.sync(&state(&["10.244.1.2", "10.244.1.3"], Protocol::Tcp))
            .unwrap();
        assert_eq!(
            dest_weights(&mut r, &k),
            [("10.244.1.2".into(), 1), ("10.244.1.3".into(), 1)]
        );
    }

    #[test]
    fn grace_period_ends_draining() {
        let mut r = reconciler();
        r.cfg.graceful_termination = Duration::ZERO;
        let k = key("10.96.0.10", 80, 6);
        r.sync(&state(&["10.244.1.2", "10.244.1.3"], Protocol::Tcp))
            .unwrap();
        r.ipvs().set_conns(&k, (ip("10.244.1.3"), 8080), 5, 5);
        r.sync(&state(&["10.244.1.2"], Protocol::Tcp)).unwrap();
        assert_eq!(dest_weights(&mut r, &k), [("10.244.1.2".into(), 1)]);
    }

    #[test]
    fn udp_real_servers_are_deleted_at_once() {
        let mut r = reconciler();
        let k = key("10.96.0.10", 80, 17);
        r.sync(&state(&["10.244.1.2", "10.244.1.3"], Protocol::Udp))
            .unwrap();
        r.ipvs().set_conns(&k, (ip("10.244.1.3"), 8080), 0, 4);
        r.sync(&state(&["10.244.1.2"], Protocol::Udp)).unwrap();
        assert_eq!(dest_weights(&mut r, &k), [("10.244.1.2".into(), 1)]);
    }

    #[test]
    fn sctp_real_servers_are_deleted_at_once_as_upstream() {
        let mut r = reconciler();
        let k = key("10.96.0.10", 80, 132);
        r.sync(&state(&["10.244.1.2", "10.244.1.3"], Protocol::Sctp))
            .unwrap();
        r.ipvs().set_conns(&k, (ip("10.244.1.3"), 8080), 3, 0);
        r.sync(&state(&["10.244.1.2"], Protocol::Sctp)).unwrap();
        assert_eq!(dest_weights(&mut r, &k), [("10.244.1.2".into(), 1)]);
    }

    #[test]
    fn foreign_and_excluded_virtual_servers_survive() {
        let mut r = reconciler();
        r.cfg.exclude_cidrs = vec!["10.200.0.0/16".parse().unwrap()];
        let foreign = VirtualServer {
            addr: ip("172.16.0.1"),
            port: 80,
            protocol: 6,
            scheduler: "wlc".into(),
            persistence: 0,
            sched_flags: 0,
        };
        r.ipvs().add_service(&foreign).unwrap();
        // On a node address but outside the NodePort range: not ours either.
        let on_node = VirtualServer {
            addr: ip("192.168.50.1"),
            port: 8443,
            ..foreign.clone()
        };
        r.ipvs().add_service(&on_node).unwrap();
        r.sync(&state(&["10.244.1.2"], Protocol::Tcp)).unwrap();
        // An excluded VIP we bound earlier is ours, yet never deleted.
        let mut st = state(&["10.244.1.2"], Protocol::Tcp);
        let sp = crate::model::fixtures::first_service_mut(&mut st);
        sp.external_ips = vec![ip("10.200.0.5")];
        r.sync(&st).unwrap();
        assert!(r.ipvs().services.contains_key(&key("10.200.0.5", 80, 6)));
        r.force_full_sync();
        r.sync(&state(&["10.244.1.2"], Protocol::Tcp)).unwrap();
        let keys: Vec<VsKey> = r.ipvs().services.keys().copied().collect();
        assert!(keys.contains(&foreign.key()));
        assert!(keys.contains(&on_node.key()));
        assert!(keys.contains(&key("10.200.0.5", 80, 6)), "{keys:?}");
        assert_eq!(r.ipvs().services[&foreign.key()].0.scheduler, "wlc");
    }

    #[test]
    fn a_full_sync_restores_what_others_removed_and_drops_stale_services() {
        let mut r = reconciler();
        r.sync(&state(&["10.244.1.2"], Protocol::Tcp)).unwrap();
        // Someone deletes our virtual server and leaves a stale one of ours on a VIP.
        r.ipvs().services.remove(&key("10.96.0.10", 80, 6));
        let stale = VirtualServer {
            addr: ip("192.168.50.1"),
            port: 31000,
            protocol: 6,
            scheduler: "rr".into(),
            persistence: 0,
            sched_flags: 0,
        };
        r.ipvs().add_service(&stale).unwrap();
        r.force_full_sync();
        let st = r.sync(&state(&["10.244.1.2"], Protocol::Tcp)).unwrap();
        assert_eq!(st.restored, 2, "the virtual server and its real server");
        let keys: Vec<VsKey> = r.ipvs().services.keys().copied().collect();
        assert_eq!(
            keys,
            [key("10.96.0.10", 80, 6), key("192.168.50.1", 30080, 6)]
        );
    }

    #[test]
    fn scheduler_and_affinity_changes_update_in_place() {
        let mut r = reconciler();
        r.sync(&state(&["10.244.1.2"], Protocol::Tcp)).unwrap();
        let mut st = state(&["10.244.1.2"], Protocol::Tcp);
        crate::model::fixtures::first_service_mut(&mut st).affinity_timeout = Some(10800);
        r.sync(&st).unwrap();
        let (vs, dests) = &r.ipvs().services[&key("10.96.0.10", 80, 6)];
        assert_eq!(vs.persistence, 10800);
        assert_eq!(dests.len(), 1, "real servers kept across the update");
    }

    /// A kernel without `ip_vs_mh`: the first sync's Maglev virtual server is refused and
    /// the sync fails; the next one programs it with the configured scheduler, and stays.
    #[test]
    fn maglev_on_a_kernel_without_mh_falls_back_to_the_configured_scheduler() {
        let mut r = reconciler();
        r.ipvs().missing_schedulers = vec!["mh".into()];
        let mut st = state(&["10.244.1.2"], Protocol::Tcp);
        crate::model::fixtures::first_service_mut(&mut st).load_balancing =
            Some(crate::model::LoadBalancing::Maglev);
        assert!(
            r.sync(&st).is_err(),
            "the refused virtual server fails the sync"
        );
        assert!(r.ipvs().services.is_empty());
        r.sync(&st).unwrap();
        let (vs, dests) = &r.ipvs().services[&key("10.96.0.10", 80, 6)];
        assert_eq!((vs.scheduler.as_str(), vs.sched_flags), ("rr", 0));
        assert_eq!(dests.len(), 1);
        r.sync(&st).unwrap();
        assert_eq!(
            r.ipvs().services[&key("10.96.0.10", 80, 6)].0.scheduler,
            "rr"
        );
    }

    #[test]
    fn service_removal_unbinds_its_vip() {
        let mut r = reconciler();
        r.sync(&state(&["10.244.1.2"], Protocol::Tcp)).unwrap();
        let mut st = state(&[], Protocol::Tcp);
        st.services.clear();
        st.endpoints.clear();
        r.sync(&st).unwrap();
        assert!(r.ipvs().services.is_empty());
        let idx = r.links().link("kube-ipvs0").unwrap().unwrap().index;
        assert!(r.links().addrs.iter().all(|a| a.index != idx));
    }

    #[test]
    fn cleanup_removes_ours_only() {
        let mut r = reconciler();
        let foreign = VirtualServer {
            addr: ip("172.16.0.1"),
            port: 80,
            protocol: 6,
            scheduler: "wlc".into(),
            persistence: 0,
            sched_flags: 0,
        };
        r.ipvs().add_service(&foreign).unwrap();
        r.sync(&state(&["10.244.1.2"], Protocol::Tcp)).unwrap();
        let removed = r.cleanup().unwrap();
        assert!(
            removed.iter().any(|s| s == "link kube-ipvs0"),
            "{removed:?}"
        );
        let keys: Vec<VsKey> = r.ipvs().services.keys().copied().collect();
        assert_eq!(keys, [foreign.key()]);
        assert!(r.links().link("kube-ipvs0").unwrap().is_none());
        assert!(r
            .nft()
            .list_tables(Family::Ip)
            .unwrap()
            .iter()
            .all(|t| t.name != table::DEFAULT_TABLE));
    }

    #[test]
    fn drain_keeps_connected_virtual_servers_until_their_connections_end() {
        let mut r = reconciler();
        let mut st = state(&["10.244.1.2"], Protocol::Tcp);
        r.sync(&st).unwrap();
        // A second Service whose VIP has no connection: it goes at once, address too.
        let other = ServicePort::new(spn("other", Protocol::Tcp), ip("10.96.0.20"), 80);
        st.endpoints.insert(
            other.name.clone(),
            vec![Endpoint::ready(ip("10.244.1.3"), 8080, true)].into(),
        );
        st.services.insert(other.name.clone(), other.into());
        r.sync(&st).unwrap();
        let k = key("10.96.0.10", 80, 6);
        assert!(r.ipvs().services.contains_key(&key("10.96.0.20", 80, 6)));
        r.ipvs().set_conns(&k, (ip("10.244.1.2"), 8080), 1, 2);
        let l = r.drain().unwrap();
        assert_eq!(l.kept, [(k, 3)]);
        let keys: Vec<VsKey> = r.ipvs().services.keys().copied().collect();
        assert_eq!(keys, [k], "only the connected virtual server is kept");
        let idx = r.links().link("kube-ipvs0").unwrap().unwrap().index;
        let bound: Vec<IpAddr> = r
            .links()
            .addrs
            .iter()
            .filter(|a| a.index == idx)
            .map(|a| a.addr)
            .collect();
        assert_eq!(bound, [ip("10.96.0.10")], "the unused VIP is unbound");
        assert!(
            r.nft()
                .list_tables(Family::Ip)
                .unwrap()
                .iter()
                .all(|t| t.name != table::DEFAULT_TABLE),
            "the companion table goes at once"
        );
        r.ipvs().set_conns(&k, (ip("10.244.1.2"), 8080), 0, 0);
        let l = r.drain().unwrap();
        assert!(l.kept.is_empty(), "{l:?}");
        assert!(r.ipvs().services.is_empty());
        assert!(r.links().link("kube-ipvs0").unwrap().is_none());
        assert!(l.removed.iter().any(|s| s == "link kube-ipvs0"), "{l:?}");
    }
}
