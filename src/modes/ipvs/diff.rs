//! The IPVS sync's diffs: which virtual-server and real-server operations take the kernel
//! from what it has to the plan (upstream's `syncService` and `syncEndpoint` in
//! pkg/proxy/ipvs/proxier.go). Two rounds, because a real server of a virtual server that
//! could not be added is not attempted. Pure: the proxier sends the operations and keeps
//! the draining bookkeeping ([`super::drain`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::kernel::ipvs::{IpvsOp, RealServer, VirtualServer, VsKey};
use crate::model::net::proto;

use super::plan::IpvsPlan;

/// A real server's address and port.
pub type Dest = (IpAddr, u16);

/// What we last left in the kernel for one virtual server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub vs: VirtualServer,
    /// Weight per real server (0: draining).
    pub dests: BTreeMap<Dest, u32>,
}

/// The first round: each planned virtual server the kernel lacks is added, one whose
/// scheduler, its flags or persistence differs is updated; each with its key.
pub fn virtual_server_ops(
    plan: &IpvsPlan,
    current: &BTreeMap<VsKey, Applied>,
) -> Vec<(VsKey, IpvsOp)> {
    let mut out = Vec::new();
    for (key, d) in &plan.services {
        let op = match current.get(key) {
            None => IpvsOp::AddService(d.vs.clone()),
            Some(c) if !c.vs.same_settings(&d.vs) => IpvsOp::UpdateService(d.vs.clone()),
            Some(_) => continue,
        };
        out.push((*key, op));
    }
    out
}

/// What one real-server operation records once it succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Then {
    /// The real server has this weight now.
    Weight(VsKey, Dest, u32),
    /// The real server is at weight 0: it drains from now.
    Drain(VsKey, Dest),
    Nothing,
}

/// The second round and what it leaves applied.
#[derive(Debug, Default)]
pub struct RealServerDiff {
    pub ops: Vec<(IpvsOp, Then)>,
    /// Per planned virtual server that exists, what stays as it is whatever the operations
    /// do: unchanged real servers, and removed ones already at weight 0 (draining).
    pub next: BTreeMap<VsKey, Applied>,
    /// Every planned real server: it drains no longer, if it did (an endpoint came back).
    pub planned: Vec<(VsKey, Dest)>,
    /// Removed real servers already at weight 0: draining, since before or from now.
    pub idle: Vec<(VsKey, Dest)>,
    /// Virtual servers deleted: their real servers drain no longer.
    pub deleted: Vec<VsKey>,
}

/// The second round: per planned virtual server not in `not_added`, its real servers added
/// or re-weighted; removed TCP real servers set to weight 0 to drain (UDP and SCTP deleted
/// at once, as upstream's `IsRsGracefulTerminationNeeded`: expire_nodest_conn drops their
/// flows on the next packet); our virtual servers no longer planned deleted, except those
/// whose address `excluded` says to leave alone.
pub fn real_server_diff(
    plan: &IpvsPlan,
    current: &BTreeMap<VsKey, Applied>,
    not_added: &BTreeSet<VsKey>,
    excluded: impl Fn(&IpAddr) -> bool,
) -> RealServerDiff {
    let mut out = RealServerDiff::default();
    let empty = BTreeMap::new();
    for (key, d) in &plan.services {
        if not_added.contains(key) {
            continue;
        }
        let mut applied = Applied {
            vs: d.vs.clone(),
            dests: BTreeMap::new(),
        };
        let cur_dests = current.get(key).map_or(&empty, |c| &c.dests);
        for (k, rs) in &d.dests {
            out.planned.push((*key, *k));
            let op = match cur_dests.get(k) {
                None => IpvsOp::AddDest(d.vs.clone(), rs.clone()),
                Some(&w) if w != rs.weight => IpvsOp::UpdateDest(d.vs.clone(), rs.clone()),
                Some(_) => {
                    applied.dests.insert(*k, rs.weight);
                    continue;
                }
            };
            out.ops.push((op, Then::Weight(*key, *k, rs.weight)));
        }
        for (k, &w) in cur_dests.iter().filter(|(k, _)| !d.dests.contains_key(k)) {
            let rs = RealServer {
                weight: 0,
                ..RealServer::masq(k.0, k.1)
            };
            if matches!(key.protocol, proto::UDP | proto::SCTP) {
                out.ops
                    .push((IpvsOp::DeleteDest(d.vs.clone(), rs), Then::Nothing));
            } else if w != 0 {
                out.ops
                    .push((IpvsOp::UpdateDest(d.vs.clone(), rs), Then::Drain(*key, *k)));
            } else {
                out.idle.push((*key, *k));
                applied.dests.insert(*k, 0);
            }
        }
        out.next.insert(*key, applied);
    }
    for (key, c) in current {
        if plan.services.contains_key(key) || excluded(&key.addr) {
            continue;
        }
        out.ops
            .push((IpvsOp::DeleteService(c.vs.clone()), Then::Nothing));
        out.deleted.push(*key);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Protocol, ServicePortName};
    use crate::modes::ipvs::plan::DesiredVs;

    fn vs(port: u16, protocol: u8, scheduler: &str) -> VirtualServer {
        VirtualServer {
            addr: "10.96.0.10".parse().unwrap(),
            port,
            protocol,
            scheduler: scheduler.into(),
            persistence: 0,
            sched_flags: 0,
        }
    }

    fn dest(last: u8) -> Dest {
        (IpAddr::from([10, 244, 1, last]), 8080)
    }

    fn planned(v: &VirtualServer, dests: &[u8]) -> (VsKey, DesiredVs) {
        let desired = DesiredVs {
            vs: v.clone(),
            kind: crate::modes::ipvs::plan::VsKind::ClusterIp,
            service: ServicePortName {
                namespace: "ns".into(),
                name: "web".into(),
                port: "http".into(),
                protocol: Protocol::Tcp,
            },
            dests: dests
                .iter()
                .map(|l| (dest(*l), RealServer::masq(dest(*l).0, 8080)))
                .collect(),
        };
        (v.key(), desired)
    }

    fn applied(v: &VirtualServer, dests: &[(u8, u32)]) -> (VsKey, Applied) {
        let a = Applied {
            vs: v.clone(),
            dests: dests.iter().map(|(l, w)| (dest(*l), *w)).collect(),
        };
        (v.key(), a)
    }

    #[test]
    fn virtual_servers_missing_are_added_changed_updated_same_left() {
        let (a, b, c) = (vs(80, 6, "rr"), vs(81, 6, "rr"), vs(82, 6, "rr"));
        let plan = IpvsPlan {
            services: [planned(&a, &[]), planned(&b, &[]), planned(&c, &[])].into(),
            vips: BTreeSet::new(),
        };
        let current = [applied(&b, &[]), applied(&vs(82, 6, "lc"), &[])].into();
        let ops = virtual_server_ops(&plan, &current);
        assert_eq!(
            ops,
            [
                (a.key(), IpvsOp::AddService(a.clone())),
                (c.key(), IpvsOp::UpdateService(c.clone())),
            ]
        );
    }

    #[test]
    fn real_servers_added_reweighted_drained_and_deleted_by_protocol() {
        let tcp = vs(80, proto::TCP, "rr");
        let udp = vs(53, proto::UDP, "rr");
        let gone = vs(99, proto::TCP, "rr");
        let plan = IpvsPlan {
            services: [planned(&tcp, &[1, 2]), planned(&udp, &[1])].into(),
            vips: BTreeSet::new(),
        };
        // .2 has another weight, .3 was removed (drains), .4 is already draining; on UDP
        // .5 was removed (deleted at once).
        let current = [
            applied(&tcp, &[(1, 1), (2, 5), (3, 1), (4, 0)]),
            applied(&udp, &[(1, 1), (5, 1)]),
            applied(&gone, &[(1, 1)]),
        ]
        .into();
        let d = real_server_diff(&plan, &current, &BTreeSet::new(), |_| false);
        let rs = |l: u8, w: u32| RealServer {
            weight: w,
            ..RealServer::masq(dest(l).0, 8080)
        };
        // In key order: port 53 before 80.
        assert_eq!(
            d.ops,
            [
                (IpvsOp::DeleteDest(udp.clone(), rs(5, 0)), Then::Nothing),
                (
                    IpvsOp::UpdateDest(tcp.clone(), rs(2, 1)),
                    Then::Weight(tcp.key(), dest(2), 1)
                ),
                (
                    IpvsOp::UpdateDest(tcp.clone(), rs(3, 0)),
                    Then::Drain(tcp.key(), dest(3))
                ),
                (IpvsOp::DeleteService(gone.clone()), Then::Nothing),
            ]
        );
        assert_eq!(
            d.next[&tcp.key()].dests,
            [(dest(1), 1), (dest(4), 0)].into()
        );
        assert_eq!(d.idle, [(tcp.key(), dest(4))]);
        assert_eq!(d.deleted, [gone.key()]);
        assert_eq!(d.planned.len(), 3);
    }

    #[test]
    fn nothing_is_sent_for_a_virtual_server_not_added_nor_deleted_when_excluded() {
        let a = vs(80, proto::TCP, "rr");
        let plan = IpvsPlan {
            services: [planned(&a, &[1])].into(),
            vips: BTreeSet::new(),
        };
        let foreign = vs(443, proto::TCP, "rr");
        let current = [applied(&foreign, &[(1, 1)])].into();
        let d = real_server_diff(&plan, &current, &[a.key()].into(), |_| true);
        assert!(d.ops.is_empty(), "{:?}", d.ops);
        assert!(d.next.is_empty());
    }
}
