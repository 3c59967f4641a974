//! An in-memory [`Ipvs`] that behaves like the kernel's (EEXIST, ENOENT, connection
//! counters settable by tests), so the reconciler is tested without root.

use std::collections::BTreeMap;

use super::{Error, Ipvs, RealServer, Timeouts, VirtualServer, VsKey};

#[derive(Debug, Default)]
pub struct FakeIpvs {
    pub services: BTreeMap<VsKey, (VirtualServer, Vec<RealServer>)>,
    pub timeouts: Option<Timeouts>,
    /// Count of mutating calls, to check that a no-op sync sends nothing.
    pub writes: usize,
    /// Schedulers this kernel lacks: a virtual server using one is refused with ENOENT, as
    /// `ip_vs_add_service` refuses one whose `ip_vs_<name>` module cannot be loaded.
    pub missing_schedulers: Vec<String>,
}

fn kernel(errno: i32, op: &str) -> Error {
    Error::Netlink {
        op: op.into(),
        source: crate::kernel::netlink::Error::Kernel {
            errno,
            what: op.into(),
            ext_msg: None,
        },
    }
}

impl FakeIpvs {
    /// The real servers of the virtual server at `key`.
    pub fn dests_of(&self, key: &VsKey) -> Vec<RealServer> {
        self.services
            .get(key)
            .map(|(_, d)| d.clone())
            .unwrap_or_default()
    }
    /// Sets the connection counters of one real server (what traffic would do).
    pub fn set_conns(
        &mut self,
        key: &VsKey,
        rs: (std::net::IpAddr, u16),
        active: u32,
        inactive: u32,
    ) {
        if let Some((_, ds)) = self.services.get_mut(key) {
            for d in ds.iter_mut().filter(|d| (d.addr, d.port) == rs) {
                d.active_conns = active;
                d.inactive_conns = inactive;
            }
        }
    }
}

impl Ipvs for FakeIpvs {
    fn services(&mut self) -> Result<Vec<VirtualServer>, Error> {
        Ok(self.services.values().map(|(v, _)| v.clone()).collect())
    }
    fn dests(&mut self, vs: &VirtualServer) -> Result<Vec<RealServer>, Error> {
        self.services
            .get(&vs.key())
            .map(|(_, d)| d.clone())
            .ok_or_else(|| kernel(libc::ESRCH, "list real servers"))
    }
    fn add_service(&mut self, vs: &VirtualServer) -> Result<(), Error> {
        self.writes += 1;
        if self.missing_schedulers.contains(&vs.scheduler) {
            return Err(kernel(libc::ENOENT, "add virtual server"));
        }
        if self.services.contains_key(&vs.key()) {
            return Err(kernel(libc::EEXIST, "add virtual server"));
        }
        self.services.insert(vs.key(), (vs.clone(), Vec::new()));
        Ok(())
    }
    fn update_service(&mut self, vs: &VirtualServer) -> Result<(), Error> {
        self.writes += 1;
        if self.missing_schedulers.contains(&vs.scheduler) {
            return Err(kernel(libc::ENOENT, "update virtual server"));
        }
        match self.services.get_mut(&vs.key()) {
            Some((v, _)) => {
                *v = vs.clone();
                Ok(())
            }
            None => Err(kernel(libc::ESRCH, "update virtual server")),
        }
    }
    fn delete_service(&mut self, vs: &VirtualServer) -> Result<(), Error> {
        self.writes += 1;
        self.services
            .remove(&vs.key())
            .map(|_| ())
            .ok_or_else(|| kernel(libc::ESRCH, "delete virtual server"))
    }
    fn add_dest(&mut self, vs: &VirtualServer, rs: &RealServer) -> Result<(), Error> {
        self.writes += 1;
        let (_, ds) = self
            .services
            .get_mut(&vs.key())
            .ok_or_else(|| kernel(libc::ESRCH, "add real server"))?;
        if ds.iter().any(|d| (d.addr, d.port) == (rs.addr, rs.port)) {
            return Err(kernel(libc::EEXIST, "add real server"));
        }
        ds.push(rs.clone());
        Ok(())
    }
    fn update_dest(&mut self, vs: &VirtualServer, rs: &RealServer) -> Result<(), Error> {
        self.writes += 1;
        let (_, ds) = self
            .services
            .get_mut(&vs.key())
            .ok_or_else(|| kernel(libc::ESRCH, "update real server"))?;
        let d = ds
            .iter_mut()
            .find(|d| (d.addr, d.port) == (rs.addr, rs.port))
            .ok_or_else(|| kernel(libc::ENOENT, "update real server"))?;
        d.weight = rs.weight;
        d.forward = rs.forward;
        Ok(())
    }
    fn delete_dest(&mut self, vs: &VirtualServer, rs: &RealServer) -> Result<(), Error> {
        self.writes += 1;
        let (_, ds) = self
            .services
            .get_mut(&vs.key())
            .ok_or_else(|| kernel(libc::ESRCH, "delete real server"))?;
        let n = ds.len();
        ds.retain(|d| (d.addr, d.port) != (rs.addr, rs.port));
        if ds.len() == n {
            return Err(kernel(libc::ENOENT, "delete real server"));
        }
        Ok(())
    }
    fn set_timeouts(&mut self, t: Timeouts) -> Result<(), Error> {
        self.writes += 1;
        self.timeouts = Some(t);
        Ok(())
    }
}
