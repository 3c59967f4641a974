//! Throwaway network namespaces for real-kernel tests: create one, run closures or commands
//! inside it, delete it on drop. Test-only: it uses the `ip` binary to manage namespaces.
#![allow(unsafe_code)] // kill(2), setns(2), geteuid(2) and socket calls on test processes

use crate::bounded::{OutputWithin, TEST_LIMIT};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A named network namespace (`/run/netns/NAME`), deleted when dropped.
pub struct NetNs {
    pub name: String,
    /// The test's deadline, for as long as its namespace lives.
    _deadline: crate::deadline::Deadline,
}

/// Runs a command and panics with its output when it fails.
pub fn sh(cmd: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output_within(TEST_LIMIT)
        .expect("spawn sh");
    if !out.status.success() {
        panic!(
            "command failed: {cmd}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ip GLOBAL -batch -` fed `cmds`, panicking with its output when a command fails.
pub fn ip_batch(global: &[&str], cmds: &[String]) {
    let mut script = format!("ip {} -batch - <<'EOF'\n", global.join(" "));
    for c in cmds {
        assert!(!c.contains('\n'), "one command per line: {c:?}");
        script += c;
        script.push('\n');
    }
    script += "EOF\n";
    sh(&script);
}

impl NetNs {
    /// Creates a fresh namespace with loopback up. The name is unique per process and call.
    pub fn new(tag: &str) -> NetNs {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("nlp-{}-{}-{}", tag, std::process::id(), n);
        sh(&format!("ip netns add {name}"));
        let ns = NetNs {
            name,
            _deadline: crate::deadline::start(crate::deadline::limit()),
        };
        ns.ip("link set lo up");
        ns
    }

    /// Runs `ip ARGS` inside the namespace.
    pub fn ip(&self, args: &str) -> String {
        sh(&format!("ip -n {} {args}", self.name))
    }

    /// Runs `ip` commands inside the namespace in one process (`ip -batch`: a line per
    /// command, as `ip`'s arguments without global options), panicking at the first that
    /// fails. Under the IPVS tests' emulated VM each process costs ~0.1 s, and a cluster's
    /// setup is some sixty commands.
    pub fn ip_batch(&self, cmds: &[String]) {
        ip_batch(&["-n", &self.name], cmds);
    }

    /// Writes `val` to `/proc/sys/KEY` inside the namespace (a thread that entered it sees
    /// the namespace's own net sysctls), panicking on failure.
    pub fn write_sysctl(&self, key: &str, val: &str) {
        let path = format!("/proc/sys/{key}");
        let val = val.to_string();
        self.run(move || std::fs::write(&path, val).map_err(|e| format!("write {path}: {e}")))
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Runs a shell command inside the namespace, panicking on failure.
    pub fn sh(&self, cmd: &str) -> String {
        sh(&format!(
            "ip netns exec {} sh -c '{}'",
            self.name,
            cmd.replace('\'', "'\\''")
        ))
    }

    /// Runs a command inside the namespace and returns its output whatever the status.
    pub fn output(&self, program: &str, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .output_within(TEST_LIMIT)
            .expect("spawn ip netns exec")
    }

    /// Runs `f` on a new thread that has entered this namespace (sockets it opens live here).
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            enter(&path);
            f()
        })
        .join()
        .expect("thread in namespace panicked")
    }

    /// Like [`run`](Self::run) but returns the thread's handle without waiting.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            enter(&path);
            f()
        })
    }
}

/// Moves the calling thread into the namespace at `path`.
pub fn enter(path: &str) {
    let f = File::open(path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    // SAFETY: setns on a valid namespace fd affects only the calling thread.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Whether this process may create namespaces and program nftables (root).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Panics with a clear message unless running as root: these tests never skip silently.
pub fn require_root() {
    assert!(
        is_root(),
        "netlink-tests must run as root (they create network namespaces and program nftables)"
    );
}
