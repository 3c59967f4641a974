//! The host side of a real node: a long-lived holder process that owns the node's mount
//! namespace (entered with the node's network namespace by every daemon of the node), the
//! node's cgroups, and the sweep that removes every process, cgroup and namespace a node
//! left, even one left by a run that was killed.
//!
//! Why a holder and not `ip netns exec`: `ip netns exec` remounts `/sys` (which drops the
//! cgroup v1 mounts runc needs) and gives every command a mount namespace of its own, so
//! kubelet and containerd would not share their mounts. The holder saves the cgroup mounts,
//! mounts a sysfs of the node's network namespace, puts them back, binds private directories
//! over `/run`, `/var/lib` and `/var/log`, and makes `/` shared inside (slave of the host, so
//! nothing propagates back). `../shared/reference/real-node.md` has the measured recipe.
//!
//! I/O: processes, mounts, cgroups.
#![allow(unsafe_code)] // kill(2) on the node's processes

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The cgroup v1 hierarchies mounted under /sys/fs/cgroup (each a directory with
/// `cgroup.procs`), e.g. `cpu`, `memory`, `pids`, `systemd`.
pub fn cgroup_hierarchies() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") {
        for e in rd.flatten() {
            let p = e.path();
            // The unified (v2) mount is left alone: runc's v1 mode uses the v1 hierarchies.
            if p.join("cgroup.procs").exists() && !p.join("cgroup.controllers").exists() {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Creates `/<name>` in every v1 hierarchy (cpuset's with its parent's cpus and mems, which a
/// new cpuset cgroup lacks and runc then cannot join).
pub fn create_cgroups(name: &str) {
    for h in cgroup_hierarchies() {
        let dir = h.join(name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        if h.ends_with("cpuset") {
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let v = std::fs::read_to_string(h.join(f)).unwrap_or_default();
                let _ = std::fs::write(dir.join(f), v.trim());
            }
        }
    }
}

/// Every process in `/<name>` or below it, in any hierarchy.
fn cgroup_pids(name: &str) -> BTreeSet<i32> {
    let mut pids = BTreeSet::new();
    for h in cgroup_hierarchies() {
        let mut stack = vec![h.join(name)];
        while let Some(d) = stack.pop() {
            if let Ok(t) = std::fs::read_to_string(d.join("cgroup.procs")) {
                pids.extend(t.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
            if let Ok(rd) = std::fs::read_dir(&d) {
                stack.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
            }
        }
    }
    pids
}

/// Removes `/<name>` and every cgroup below it, deepest first, in every hierarchy. A cgroup
/// that still has processes stays (and is named in the result).
pub fn remove_cgroups(name: &str) -> Vec<PathBuf> {
    let mut left = Vec::new();
    for h in cgroup_hierarchies() {
        let root = h.join(name);
        let mut dirs = Vec::new();
        let mut stack = vec![root];
        while let Some(d) = stack.pop() {
            if !d.is_dir() {
                continue;
            }
            if let Ok(rd) = std::fs::read_dir(&d) {
                stack.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
            }
            dirs.push(d);
        }
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in dirs {
            if std::fs::remove_dir(&d).is_err() {
                left.push(d);
            }
        }
    }
    left
}

/// The namespace inode `/proc/PID/ns/KIND` links to (`mnt:[4026532]`).
fn ns_of(pid: i32, kind: &str) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                .collect()
        })
        .unwrap_or_default()
}

/// The processes of a node: those in its cgroups (pods) and those in its mount or network
/// namespace (the holder, containerd, kubelet, shims, hostNetwork helpers).
pub fn node_pids(cgroup: &str, mnt_ns: Option<&str>, net_ns: Option<&str>) -> BTreeSet<i32> {
    let me = std::process::id() as i32;
    let mut pids = cgroup_pids(cgroup);
    if mnt_ns.is_some() || net_ns.is_some() {
        for pid in all_pids() {
            if (mnt_ns.is_some() && ns_of(pid, "mnt").as_deref() == mnt_ns)
                || (net_ns.is_some() && ns_of(pid, "net").as_deref() == net_ns)
            {
                pids.insert(pid);
            }
        }
    }
    pids.remove(&me);
    pids
}

/// SIGKILLs every process of a node until none is left (at most `limit`); returns the
/// ones that would not go.
pub fn kill_node(
    cgroup: &str,
    mnt_ns: Option<&str>,
    net_ns: Option<&str>,
    limit: Duration,
) -> BTreeSet<i32> {
    let t0 = Instant::now();
    loop {
        let pids = node_pids(cgroup, mnt_ns, net_ns);
        if pids.is_empty() || t0.elapsed() > limit {
            return pids;
        }
        for &pid in &pids {
            // SAFETY: kill(2) with a pid read from /proc; a pid that exited meanwhile is ESRCH.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        // Reap our own children among them (the holder, kubelet, containerd).
        loop {
            // SAFETY: waitpid(2) on any child, non-blocking.
            let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
            if r <= 0 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The holder of a node's mount namespace, and what it needs to start daemons inside it.
pub struct Holder {
    child: Child,
    pub pid: u32,
    /// `mnt:[…]` of the holder's mount namespace, for the sweep.
    pub mnt_ns: String,
}

impl Holder {
    /// Starts the holder for network namespace `netns` with its private directories under
    /// `dir` (`run`, `var-lib`, `var-log`); waits (10 s at most) until its mounts are done.
    pub fn start(netns: &str, dir: &Path) -> Holder {
        for d in ["run", "var-lib", "var-log", "cgroup-save"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let ready = dir.join("holder.ready");
        let _ = std::fs::remove_file(&ready);
        let d = dir.display();
        let script = format!(
            "set -e
mount --rbind /sys/fs/cgroup {d}/cgroup-save
mount -t sysfs sysfs /sys
mount --rbind {d}/cgroup-save /sys/fs/cgroup
mount --bind {d}/run /run
mount --bind {d}/var-lib /var/lib
mount --bind {d}/var-log /var/log
mount --make-rshared /
touch {d}/holder.ready
exec sleep infinity"
        );
        let child = crate::bounded::dies_with_parent(&mut Command::new("unshare"))
            .args(["--mount", "--propagation", "slave", "--"])
            .args(["nsenter", &format!("--net=/run/netns/{netns}"), "--"])
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("holder.log")).unwrap())
            .spawn()
            .expect("start the node's holder (unshare, nsenter)");
        let pid = child.id();
        let mut h = Holder {
            child,
            pid,
            mnt_ns: String::new(),
        };
        let t0 = Instant::now();
        while !ready.exists() {
            if let Ok(Some(st)) = h.child.try_wait() {
                panic!(
                    "the node's holder exited ({st}): {}",
                    std::fs::read_to_string(dir.join("holder.log")).unwrap_or_default()
                );
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the node's holder did not set up its mounts within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        h.mnt_ns = ns_of(pid as i32, "mnt").expect("the holder's mount namespace");
        h
    }

    /// A command that runs inside the node's mount and network namespaces.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.args(["-t", &self.pid.to_string(), "-m", "-n", "--", program]);
        c
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
