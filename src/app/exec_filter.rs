//! The kernel's refusal of exec to this process, and the container seccomp profile deploy/
//! ships. We never exec (clippy holds `src/` to it); the filter holds to it whoever might take
//! control of the process too, in every runtime and in privileged pods, to which containerd
//! and CRI-O apply no seccomp profile at all. It is installed in `main` before the runtime
//! starts: a thread inherits its creator's filters, so every thread after it carries it, and
//! TSYNC puts it on any that already run. Building the filter is pure; installing it is I/O
//! (prctl, seccomp).

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

/// The container profile (OCI JSON, for a `Localhost` seccompProfile): every system call the
/// daemon makes in every mode, traced from the test suites, which run the daemon under it
/// (netlink-tests' `seccomp-run`). `--write-seccomp-profile` writes it, so that the profile a
/// node holds is the one of the binary it runs.
pub const SECCOMP_PROFILE: &str = include_str!("../../deploy/components/seccomp/kube-nlproxy.json");

/// Bit 30 marks the x32 ABI's system calls, which reach an x86_64 process under
/// AUDIT_ARCH_X86_64 too: without their numbers, an x32 `execve` would pass the filter.
const X32: i64 = 0x4000_0000;

/// `execve` and `execveat` on `arch` (arch/*/entry/syscalls tables of Linux 6.x).
fn exec_syscalls(arch: TargetArch) -> &'static [i64] {
    match arch {
        TargetArch::x86_64 => &[59, 322, X32 + 520, X32 + 545],
        TargetArch::aarch64 | TargetArch::riscv64 => &[221, 281],
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExecFilterError {
    #[error("this architecture ({0}) has no exec filter")]
    Arch(&'static str),
    #[error("cannot build the exec filter: {0}")]
    Build(seccompiler::BackendError),
    #[error("cannot install the exec filter (--no-exec-filter runs without it): {0}")]
    Install(seccompiler::Error),
}

/// The filter for `arch`: `execve` and `execveat` fail with EPERM, every other call of the
/// native ABI passes; a call of another ABI (i386's `int 0x80`) kills the process, which
/// seccompiler checks first.
pub fn exec_filter(arch: TargetArch) -> Result<BpfProgram, ExecFilterError> {
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> = exec_syscalls(arch)
        .iter()
        .map(|&nr| (nr, Vec::new()))
        .collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(ExecFilterError::Build)?;
    BpfProgram::try_from(filter).map_err(ExecFilterError::Build)
}

/// The filter for the architecture this binary runs on.
pub fn native_exec_filter() -> Result<BpfProgram, ExecFilterError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| ExecFilterError::Arch(std::env::consts::ARCH))?;
    exec_filter(arch)
}

/// Installs the filter on every thread of the process (no_new_privs first, which a process
/// that never execs loses nothing by).
pub fn forbid_exec() -> Result<(), ExecFilterError> {
    let program = native_exec_filter()?;
    seccompiler::apply_filter_all_threads(&program).map_err(ExecFilterError::Install)
}

/// Installs the filter unless `--no-exec-filter`; a failure (a kernel without seccomp
/// filters) is a warning, since the daemon works the same without it.
pub fn install(enabled: bool) {
    if !enabled {
        tracing::warn!("Exec filter off (--no-exec-filter): the kernel will not refuse exec");
        return;
    }
    match forbid_exec() {
        Ok(()) => tracing::debug!("Exec filter installed: execve and execveat fail with EPERM"),
        Err(e) => tracing::warn!(err = %e, "Exec filter not installed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_numbers_are_libc_s() {
        let native = TargetArch::try_from(std::env::consts::ARCH).unwrap();
        let nrs = exec_syscalls(native);
        assert!(nrs.contains(&libc::SYS_execve));
        assert!(nrs.contains(&libc::SYS_execveat));
    }

    #[test]
    fn builds_for_each_release_architecture() {
        for arch in [TargetArch::x86_64, TargetArch::aarch64] {
            let p = exec_filter(arch).unwrap();
            // Arch check (3), number load (1), one compare per number, the two returns.
            let n = exec_syscalls(arch).len();
            assert!(p.len() >= 4 + n, "{arch:?}: {} instructions", p.len());
        }
    }

    #[test]
    fn the_profile_is_an_errno_default_allow_list_without_exec_at() {
        let v: serde_json::Value = serde_json::from_str(SECCOMP_PROFILE).unwrap();
        assert_eq!(v["defaultAction"], "SCMP_ACT_ERRNO");
        let allowed: Vec<&str> = v["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["action"] == "SCMP_ACT_ALLOW")
            .flat_map(|g| g["names"].as_array().unwrap())
            .map(|n| n.as_str().unwrap())
            .collect();
        // The runtime execs the binary once after the profile is on: execve must pass (a
        // profile without it never starts, moby#36830); execveat, which nothing needs, not.
        assert!(allowed.contains(&"execve"));
        assert!(!allowed.contains(&"execveat"));
        assert!(allowed.contains(&"sendmsg") && allowed.contains(&"recvmsg"));
    }
}
