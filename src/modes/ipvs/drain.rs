//! Graceful termination of IPVS real servers (upstream's `GracefulTerminationManager`): a
//! removed TCP real server stays at weight 0, taking no new connections, until its
//! connections end or its grace period passes, and is deleted then. Pure bookkeeping and
//! decisions; the proxier reads the connection counters and deletes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use crate::kernel::ipvs::{RealServer, VsKey};

use super::diff::Dest;

/// The draining real servers and when each one's grace period ends.
#[derive(Debug, Default)]
pub struct DrainManager {
    deadlines: BTreeMap<(VsKey, Dest), Instant>,
}

/// What to do with one draining real server now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainStep {
    /// The kernel no longer has it: done.
    Gone,
    /// No connections left, or out of time: delete it.
    Delete,
    /// Connections left within the grace period.
    Wait,
}

impl DrainManager {
    pub fn is_empty(&self) -> bool {
        self.deadlines.is_empty()
    }

    /// `dest` of `vs` drains until `deadline`; one already draining keeps its deadline.
    pub fn start(&mut self, vs: VsKey, dest: Dest, deadline: Instant) {
        self.deadlines.entry((vs, dest)).or_insert(deadline);
    }

    /// `dest` of `vs` is planned again, or was deleted: it drains no longer.
    pub fn stop(&mut self, vs: VsKey, dest: Dest) {
        self.deadlines.remove(&(vs, dest));
    }

    /// `vs` is gone: none of its real servers drains any longer.
    pub fn forget(&mut self, vs: &VsKey) {
        self.deadlines.retain(|(k, _), _| k != vs);
    }

    /// The virtual servers with a draining real server.
    pub fn virtual_servers(&self) -> BTreeSet<VsKey> {
        self.deadlines.keys().map(|(k, _)| *k).collect()
    }

    /// The draining real servers of `vs` and their deadlines.
    pub fn of(&self, vs: &VsKey) -> Vec<(Dest, Instant)> {
        self.deadlines
            .iter()
            .filter(|((k, _), _)| k == vs)
            .map(|((_, d), t)| (*d, *t))
            .collect()
    }
}

/// The step for a draining real server the kernel shows as `found` at `now`.
pub fn drain_step(found: Option<&RealServer>, deadline: Instant, now: Instant) -> DrainStep {
    match found {
        None => DrainStep::Gone,
        Some(d) if d.active_conns + d.inactive_conns == 0 || now >= deadline => DrainStep::Delete,
        Some(_) => DrainStep::Wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;
    use std::time::Duration;

    fn vs(port: u16) -> VsKey {
        VsKey {
            addr: "10.96.0.10".parse().unwrap(),
            port,
            protocol: 6,
        }
    }

    fn dest(last: u8) -> Dest {
        (IpAddr::from([10, 244, 1, last]), 8080)
    }

    #[test]
    fn a_real_server_drains_until_idle_or_out_of_time() {
        let now = Instant::now();
        let deadline = now + Duration::from_secs(15);
        let mut rs = RealServer::masq(dest(1).0, 8080);
        rs.active_conns = 2;
        assert_eq!(drain_step(Some(&rs), deadline, now), DrainStep::Wait);
        assert_eq!(drain_step(Some(&rs), deadline, deadline), DrainStep::Delete);
        rs.active_conns = 0;
        rs.inactive_conns = 1;
        assert_eq!(drain_step(Some(&rs), deadline, now), DrainStep::Wait);
        rs.inactive_conns = 0;
        assert_eq!(drain_step(Some(&rs), deadline, now), DrainStep::Delete);
        assert_eq!(drain_step(None, deadline, now), DrainStep::Gone);
    }

    #[test]
    fn the_first_deadline_holds_and_stopping_or_forgetting_ends_draining() {
        let now = Instant::now();
        let mut m = DrainManager::default();
        m.start(vs(80), dest(1), now + Duration::from_secs(15));
        m.start(vs(80), dest(1), now + Duration::from_secs(99));
        m.start(vs(80), dest(2), now);
        m.start(vs(81), dest(1), now);
        assert_eq!(
            m.of(&vs(80)),
            [(dest(1), now + Duration::from_secs(15)), (dest(2), now)]
        );
        assert_eq!(m.virtual_servers(), [vs(80), vs(81)].into());
        m.stop(vs(80), dest(2));
        m.forget(&vs(81));
        assert_eq!(m.virtual_servers(), [vs(80)].into());
        m.stop(vs(80), dest(1));
        assert!(m.is_empty());
    }
}
