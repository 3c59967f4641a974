//! deploy/'s seccomp profile applied to the daemon in tests: its allowed names, compiled by
//! seccompiler's JSON frontend (which knows each architecture's numbers) into the BPF that
//! `seccomp-run` installs before it execs the daemon. Every test that starts the daemon
//! through [`crate::cluster::proxy_bin`] runs it under the profile, with a call outside it
//! killing the process (`KNP_SECCOMP=log` only logs it, `off` runs the daemon bare). Pure,
//! but for reading the profile file.

use std::path::PathBuf;

use seccompiler::{BpfProgram, TargetArch};

/// The profile deploy/ ships (and `--write-seccomp-profile` writes).
pub fn profile_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/components/seccomp/kube-nlproxy.json")
}

/// What a call outside the profile does, from `KNP_SECCOMP`: `kill` (the default), `log`
/// (allowed, and the kernel logs `type=1326 ... syscall=N` to dmesg), `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mismatch {
    Kill,
    Log,
    Off,
}

impl Mismatch {
    pub fn from_env() -> Result<Mismatch, String> {
        match std::env::var("KNP_SECCOMP").as_deref() {
            Err(_) | Ok("") | Ok("kill") => Ok(Mismatch::Kill),
            Ok("log") => Ok(Mismatch::Log),
            Ok("off") => Ok(Mismatch::Off),
            Ok(other) => Err(format!("KNP_SECCOMP={other}: want kill, log or off")),
        }
    }

    fn action(self) -> &'static str {
        match self {
            Mismatch::Kill | Mismatch::Off => "kill_process",
            Mismatch::Log => "log",
        }
    }
}

/// The names the profile allows (groups whose action is `SCMP_ACT_ALLOW`), after checking
/// that everything else is denied by default.
pub fn allowed_names(profile: &str) -> Result<Vec<String>, String> {
    let v: serde_json::Value =
        serde_json::from_str(profile).map_err(|e| format!("the profile is not JSON: {e}"))?;
    if v["defaultAction"] != "SCMP_ACT_ERRNO" {
        return Err(format!(
            "defaultAction is {}, want SCMP_ACT_ERRNO",
            v["defaultAction"]
        ));
    }
    let mut names = Vec::new();
    for group in v["syscalls"].as_array().ok_or("no syscalls array")? {
        if group["action"] != "SCMP_ACT_ALLOW" {
            continue;
        }
        for n in group["names"].as_array().ok_or("a group without names")? {
            names.push(n.as_str().ok_or("a name that is not a string")?.to_owned());
        }
    }
    Ok(names)
}

fn compile_json(
    names: &[&str],
    arch: TargetArch,
    mismatch: Mismatch,
) -> Result<BpfProgram, String> {
    let filter: Vec<serde_json::Value> = names
        .iter()
        .map(|n| serde_json::json!({ "syscall": n }))
        .collect();
    let doc = serde_json::json!({
        "daemon": {
            "mismatch_action": mismatch.action(),
            "match_action": "allow",
            "filter": filter,
        }
    });
    let mut map = seccompiler::compile_from_json(doc.to_string().as_bytes(), arch)
        .map_err(|e| format!("{e}"))?;
    map.remove("daemon").ok_or_else(|| "no program".to_owned())
}

/// Whether `arch` has a system call called `name`.
pub fn known_on(name: &str, arch: TargetArch) -> bool {
    compile_json(&[name], arch, Mismatch::Kill).is_ok()
}

/// The profile's allow-list for `arch` as BPF: names `arch` does not have are left out, as
/// runc and libseccomp leave them out (x86_64's `open` on arm64).
pub fn compile(
    names: &[String],
    arch: TargetArch,
    mismatch: Mismatch,
) -> Result<BpfProgram, String> {
    let here: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| known_on(n, arch))
        .collect();
    compile_json(&here, arch, mismatch)
}

/// A process's seccomp state, from the `Seccomp:`, `Seccomp_filters:` and `NoNewPrivs:`
/// lines of its `/proc/PID/status` (empty where a line is missing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeccompState {
    /// 0 off, 2 filter mode.
    pub mode: String,
    pub filters: String,
    pub no_new_privs: String,
}

impl SeccompState {
    pub fn of(status: &str) -> SeccompState {
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        SeccompState {
            mode: field("Seccomp:"),
            filters: field("Seccomp_filters:"),
            no_new_privs: field("NoNewPrivs:"),
        }
    }

    /// (mode, filters) as text, for comparing in one assertion.
    pub fn mode_and_filters(&self) -> (&str, &str) {
        (&self.mode, &self.filters)
    }
}

/// The architecture the tests run on.
pub fn native_arch() -> TargetArch {
    TargetArch::try_from(std::env::consts::ARCH).expect("x86_64, aarch64 or riscv64")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_a_system_call_of_a_release_architecture() {
        let profile = std::fs::read_to_string(profile_path()).unwrap();
        let names = allowed_names(&profile).unwrap();
        let unknown: Vec<&String> = names
            .iter()
            .filter(|n| !known_on(n, TargetArch::x86_64) && !known_on(n, TargetArch::aarch64))
            .collect();
        assert!(unknown.is_empty(), "not a system call: {unknown:?}");
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "a name listed twice");
        for arch in [TargetArch::x86_64, TargetArch::aarch64] {
            let p = compile(&names, arch, Mismatch::Kill).unwrap();
            assert!(p.len() > names.len() / 2, "{arch:?}");
        }
    }

    #[test]
    fn a_bad_profile_is_refused_with_its_reason() {
        let e = allowed_names(r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[]}"#).unwrap_err();
        assert!(e.contains("SCMP_ACT_ERRNO"), "{e}");
        assert!(!known_on("no_such_call", TargetArch::x86_64));
        assert!(known_on("open", TargetArch::x86_64) && !known_on("open", TargetArch::aarch64));
    }
}
