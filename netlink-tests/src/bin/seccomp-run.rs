//! `seccomp-run ARGS...`: installs deploy/'s seccomp profile (a call outside it kills the
//! process, or only logs with `KNP_SECCOMP=log`), then execs the kube-nlproxy built beside
//! it with ARGS. What tests start as the daemon (`cluster::proxy_bin`), so that every test
//! fails when the daemon makes a call the profile does not list. `KNP_SECCOMP_TARGET`
//! names another binary.

#![allow(clippy::disallowed_methods)] // a test harness: its job is the exec

use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use netlink_tests::seccomp::{self, Mismatch};

fn main() {
    let fail = |msg: String| -> ! {
        eprintln!("seccomp-run: {msg}");
        std::process::exit(125)
    };
    let mismatch = Mismatch::from_env().unwrap_or_else(|e| fail(e));
    let target = match std::env::var_os("KNP_SECCOMP_TARGET") {
        Some(t) => PathBuf::from(t),
        None => std::env::current_exe()
            .unwrap_or_else(|e| fail(format!("cannot find myself: {e}")))
            .with_file_name("kube-nlproxy"),
    };
    let mut cmd = std::process::Command::new(&target);
    cmd.args(std::env::args_os().skip(1));
    if mismatch != Mismatch::Off {
        let path = seccomp::profile_path();
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| fail(format!("cannot read {}: {e}", path.display())));
        let names = seccomp::allowed_names(&text).unwrap_or_else(|e| fail(e));
        let program = seccomp::compile(&names, seccomp::native_arch(), mismatch)
            .unwrap_or_else(|e| fail(format!("{}: {e}", path.display())));
        // The filter stays across the exec below; from here on the profile holds.
        if let Err(e) = seccompiler::apply_filter(&program) {
            fail(format!("cannot install the filter: {e}"));
        }
    }
    let e = cmd.exec();
    fail(format!("cannot exec {}: {e}", target.display()))
}
