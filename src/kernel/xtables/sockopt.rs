//! [`SockoptXtables`]: x_tables over its socket options on a raw socket, under
//! `/run/xtables.lock` as iptables takes it. The only I/O of the x_tables module.
#![allow(unsafe_code)] // socket(2), getsockopt(2), setsockopt(2) have no safe wrapper

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::model::net::Family;

use super::blob::{self, Rewrite, TableBlob};
use super::uapi::*;
use super::{Error, Xtables};

/// iptables' lock file; held while a table is read and replaced.
pub const XTABLES_LOCK: &str = "/run/xtables.lock";
/// How long to wait for another iptables user to release the lock.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Default)]
pub struct SockoptXtables {
    lock: Option<std::fs::File>,
}

fn level(f: Family) -> i32 {
    match f {
        Family::Ip => SOL_IP,
        Family::Ip6 => SOL_IPV6,
    }
}

fn raw_socket(f: Family) -> std::io::Result<OwnedFd> {
    let af = match f {
        Family::Ip => libc::AF_INET,
        Family::Ip6 => libc::AF_INET6,
    };
    // SAFETY: plain socket(2); the fd is owned at once.
    let fd = unsafe { libc::socket(af, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::IPPROTO_RAW) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn getsockopt(fd: &OwnedFd, level: i32, opt: i32, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: buf is valid for len bytes and outlives the call.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(len as usize)
}

fn setsockopt(fd: &OwnedFd, level: i32, opt: i32, buf: &[u8]) -> std::io::Result<()> {
    // SAFETY: buf is valid for its length; any pointer inside it (the counters buffer)
    // points to memory the caller keeps alive across the call.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            buf.as_ptr().cast(),
            buf.len() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl SockoptXtables {
    fn locked(&mut self) -> Result<(), Error> {
        if self.lock.is_some() {
            return Ok(());
        }
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(XTABLES_LOCK)
            .map_err(|e| Error::Lock(e.to_string()))?;
        let t0 = std::time::Instant::now();
        loop {
            match f.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if t0.elapsed() < LOCK_WAIT => {
                    std::thread::sleep(std::time::Duration::from_millis(50))
                }
                Err(e) => return Err(Error::Lock(e.to_string())),
            }
        }
        self.lock = Some(f);
        Ok(())
    }
}

impl Xtables for SockoptXtables {
    fn tables(&mut self, family: Family) -> Result<Vec<String>, Error> {
        let path = match family {
            Family::Ip => "/proc/net/ip_tables_names",
            Family::Ip6 => "/proc/net/ip6_tables_names",
        };
        // Absent: no x_tables in this kernel, so nothing legacy to clean.
        Ok(std::fs::read_to_string(path)
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default())
    }

    fn get(&mut self, family: Family, table: &str) -> Result<TableBlob, Error> {
        self.locked()?;
        let io = |op: &'static str| {
            let table = table.to_string();
            move |source| Error::Io {
                op,
                family,
                table,
                source,
            }
        };
        let fd = raw_socket(family).map_err(io("socket"))?;
        let mut info = blob::get_info_request(table);
        getsockopt(&fd, level(family), SO_GET_INFO, &mut info).map_err(io("GET_INFO"))?;
        let (valid_hooks, hook_entry, underflow, num_entries, size) = blob::parse_info(&info)
            .ok_or_else(|| Error::Malformed {
                family,
                table: table.into(),
                why: "short GET_INFO reply".into(),
            })?;
        let mut req = blob::get_entries_request(table, size);
        getsockopt(&fd, level(family), SO_GET_ENTRIES, &mut req).map_err(io("GET_ENTRIES"))?;
        Ok(TableBlob {
            name: table.to_string(),
            valid_hooks,
            hook_entry,
            underflow,
            num_entries,
            entries: req[GET_ENTRIES_HDR..].to_vec(),
        })
    }

    fn replace(&mut self, family: Family, old: &TableBlob, new: &Rewrite) -> Result<(), Error> {
        self.locked()?;
        let table = &new.table.name;
        let io = |op: &'static str| {
            move |source| Error::Io {
                op,
                family,
                table: table.clone(),
                source,
            }
        };
        let fd = raw_socket(family).map_err(io("socket"))?;
        // The kernel writes the old table's counters here; it must outlive the call.
        let mut counters = vec![0u8; old.num_entries as usize * COUNTERS_LEN];
        let req = blob::replace_request(&new.table, old.num_entries, counters.as_mut_ptr() as u64);
        setsockopt(&fd, level(family), SO_SET_REPLACE, &req).map_err(io("SET_REPLACE"))?;
        // The new table's entries start at zero: give the kept ones their counters back.
        let add = blob::add_counters_request(table, &counters, &new.kept).ok_or_else(|| {
            Error::Malformed {
                family,
                table: table.clone(),
                why: "a kept entry beyond the counters SET_REPLACE returned".into(),
            }
        })?;
        setsockopt(&fd, level(family), SO_SET_ADD_COUNTERS, &add).map_err(io("SET_ADD_COUNTERS"))
    }
}
