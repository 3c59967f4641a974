//! Bounded waits for test-time processes: a command's output or a child's exit within a
//! deadline, else the process is killed and the test fails with a message saying what hung
//! (one unbounded wait once held CI for seven minutes).

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// The longest any single test-time command may take (the IPVS VM runs under TCG emulation,
/// several times slower than the host).
pub const TEST_LIMIT: Duration = Duration::from_secs(300);

/// [`Command::output`] with a deadline.
pub trait OutputWithin {
    /// Runs to completion within `limit`, capturing stdout and stderr; on timeout the
    /// process is killed and this panics naming the command.
    fn output_within(&mut self, limit: Duration) -> std::io::Result<Output>;
}

impl OutputWithin for Command {
    fn output_within(&mut self, limit: Duration) -> std::io::Result<Output> {
        let what = format!("{self:?}");
        // stdin is left as the caller configured it (a baseline feeds its input file there).
        let child = self.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        Ok(collect_within(child, limit, &what))
    }
}

/// Waits for `child` within `limit`, draining its piped stdout and stderr on threads so a
/// chatty child cannot block on a full pipe; on timeout kills it and panics naming `what`.
fn collect_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let drain = |p: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = p {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let status = wait_within(&mut child, limit, what);
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// Waits for `child` at most `limit`; on timeout kills it (SIGKILL) and panics naming `what`.
pub fn wait_within(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let t0 = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return st,
            Ok(None) if t0.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what} did not finish within {limit:?}; killed");
            }
            Err(e) => panic!("waiting for {what}: {e}"),
        }
    }
}

/// SIGTERM to `child` (a daemon started by `ip netns exec`, which execs it in place: the same
/// pid), then [`wait_with_output_within`].
#[allow(unsafe_code)]
pub fn terminate_within(child: Child, limit: Duration, what: &str) -> Output {
    // SAFETY: signalling a child process the caller owns and has not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    collect_within(child, limit, what)
}

/// [`Child::wait_with_output`] within `limit`: what was piped is collected, and on timeout
/// the child is killed and this panics naming `what`.
pub fn wait_with_output_within(child: Child, limit: Duration, what: &str) -> Output {
    collect_within(child, limit, what)
}

/// Makes the process `cmd` starts receive SIGKILL when the thread that started it ends:
/// a test binary ended by its deadline watchdog (`std::process::exit`, no destructors)
/// leaves no etcd, apiserver, upstream kube-proxy or daemon running behind it.
pub fn dies_with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    #[allow(unsafe_code)]
    // SAFETY: prctl(2) is async-signal-safe and touches only the child being set up.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hanging_command_is_killed_and_reported() {
        let r = std::panic::catch_unwind(|| {
            Command::new("sleep")
                .arg("30")
                .output_within(Duration::from_millis(200))
        });
        let msg = r.unwrap_err();
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("did not finish within"), "{msg}");
        let ok = Command::new("sh")
            .args(["-c", "echo out; echo err >&2"])
            .output_within(Duration::from_secs(10))
            .unwrap();
        assert_eq!(
            (&ok.stdout[..], &ok.stderr[..]),
            (&b"out\n"[..], &b"err\n"[..])
        );
    }
}
