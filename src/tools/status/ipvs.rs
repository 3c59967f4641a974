//! The IPVS part of `status` and `diff`: what differs between the plan and the kernel's
//! virtual servers, in `ipvsadm` notation. Pure.

use super::*;

pub(super) fn ipvsadm_service(k: &VsKey) -> String {
    let flag = match k.protocol {
        crate::model::net::proto::UDP => "-u",
        crate::model::net::proto::SCTP => "--sctp-service",
        _ => "-t",
    };
    format!("{flag} {}", std::net::SocketAddr::new(k.addr, k.port))
}

/// ipvsadm's names (`-b`) of a virtual server's scheduler flags: `mh` and `sh` name the
/// first two (fallback, port), any other scheduler numbers them.
pub(super) fn sched_flag_names(scheduler: &str, flags: u32) -> Vec<&'static str> {
    use crate::kernel::ipvs::uapi::{IP_VS_SVC_F_SCHED1, IP_VS_SVC_F_SCHED2, IP_VS_SVC_F_SCHED3};
    let (first, second) = match scheduler {
        "mh" => ("mh-fallback", "mh-port"),
        "sh" => ("sh-fallback", "sh-port"),
        _ => ("flag-1", "flag-2"),
    };
    [
        (IP_VS_SVC_F_SCHED1, first),
        (IP_VS_SVC_F_SCHED2, second),
        (IP_VS_SVC_F_SCHED3, "flag-3"),
    ]
    .into_iter()
    .filter(|(bit, _)| flags & bit != 0)
    .map(|(_, name)| name)
    .collect()
}

/// The IPVS part of the drift: virtual servers (scheduler, persistence) and real servers
/// (weights) of `plan` against the kernel's, and the VIPs of the dummy link.
pub fn ipvs_drift(
    plan: &IpvsPlan,
    live: &[(VirtualServer, Vec<RealServer>)],
    live_vips: &BTreeSet<IpAddr>,
    dummy: &str,
) -> (Vec<String>, Vec<String>) {
    let mut diffs = Vec::new();
    let mut ops = Vec::new();
    let live_by: BTreeMap<VsKey, &(VirtualServer, Vec<RealServer>)> =
        live.iter().map(|e| (e.0.key(), e)).collect();
    for (k, want) in &plan.services {
        let svc = ipvsadm_service(k);
        // ipvsadm's options for the scheduler, its flags and persistence.
        let sched = |vs: &VirtualServer| {
            let mut s = format!("-s {}", vs.scheduler);
            let flags = sched_flag_names(&vs.scheduler, vs.sched_flags);
            if !flags.is_empty() {
                s += &format!(" -b {}", flags.join(","));
            }
            if vs.persistence > 0 {
                s += &format!(" -p {}", vs.persistence);
            }
            s
        };
        match live_by.get(k) {
            None => {
                diffs.push(format!("virtual server {k} ({}): missing", want.service));
                ops.push(format!("-A {svc} {}", sched(&want.vs)));
                for d in want.dests.values() {
                    ops.push(format!(
                        "-a {svc} -r {} -m -w {}",
                        std::net::SocketAddr::new(d.addr, d.port),
                        d.weight
                    ));
                }
            }
            Some((vs, dests)) => {
                if !vs.same_settings(&want.vs) {
                    diffs.push(format!(
                        "virtual server {k}: {}, planned {}",
                        sched(vs),
                        sched(&want.vs)
                    ));
                    ops.push(format!("-E {svc} {}", sched(&want.vs)));
                }
                let have: BTreeMap<(IpAddr, u16), &RealServer> =
                    dests.iter().map(|d| ((d.addr, d.port), d)).collect();
                for (a, d) in &want.dests {
                    let rs = std::net::SocketAddr::new(a.0, a.1);
                    match have.get(a) {
                        None => {
                            diffs.push(format!("virtual server {k}: real server {rs} missing"));
                            ops.push(format!("-a {svc} -r {rs} -m -w {}", d.weight));
                        }
                        Some(h) if h.weight != d.weight => {
                            diffs.push(format!(
                                "virtual server {k}: real server {rs} weight {}, planned {}",
                                h.weight, d.weight
                            ));
                            ops.push(format!("-e {svc} -r {rs} -m -w {}", d.weight));
                        }
                        Some(_) => {}
                    }
                }
                for a in have.keys().filter(|a| !want.dests.contains_key(a)) {
                    let rs = std::net::SocketAddr::new(a.0, a.1);
                    diffs.push(format!(
                        "virtual server {k}: real server {rs} not in the plan"
                    ));
                    ops.push(format!("-d {svc} -r {rs}"));
                }
            }
        }
    }
    for k in live_by.keys().filter(|k| !plan.services.contains_key(k)) {
        diffs.push(format!("virtual server {k}: not in the plan"));
        ops.push(format!("-D {}", ipvsadm_service(k)));
    }
    for a in plan.vips.difference(live_vips) {
        diffs.push(format!("address {a} on {dummy}: missing"));
        ops.push(format!("address add {a} dev {dummy}"));
    }
    for a in live_vips.difference(&plan.vips) {
        diffs.push(format!("address {a} on {dummy}: not in the plan"));
        ops.push(format!("address delete {a} dev {dummy}"));
    }
    (diffs, ops)
}
