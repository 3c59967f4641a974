//! The sysctls IPVS mode needs (upstream `pkg/proxy/ipvs/proxier.go`), written through
//! /proc/sys. Planning is pure; [`apply`] does the writes and reports failures as warnings,
//! except the ones without which Services cannot work, which are errors.

use crate::kernel::sysctl::SysctlFailure;
use std::path::PathBuf;

use super::plan::IpvsConfig;

/// One write and whether the mode fails without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub path: PathBuf,
    pub value: &'static str,
    pub required: bool,
}

fn w(key: &str, value: &'static str, required: bool) -> Write {
    Write {
        path: PathBuf::from(format!("/proc/sys/{key}")),
        value,
        required,
    }
}

/// Parses "6.1.0-57-amd64" into (6, 1).
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(['.', '-']);
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// The writes for `cfg` on a kernel of `version`.
pub fn plan(cfg: &IpvsConfig, version: Option<(u32, u32)>) -> Vec<Write> {
    let mut v = vec![
        // Masquerading IPVS traffic needs conntrack entries for it.
        w("net/ipv4/vs/conntrack", "1", true),
        // Connections to a deleted real server fail fast instead of hanging.
        w("net/ipv4/vs/expire_nodest_conn", "1", false),
        // Persistence templates of a weight-0 real server expire with it.
        w("net/ipv4/vs/expire_quiescent_template", "1", false),
        w("net/ipv4/ip_forward", "1", true),
    ];
    // Before 5.9, conn_reuse_mode=1 stalled reused ports for a second (upstream #81775);
    // later kernels fixed it and 0 would break graceful termination.
    if version.is_some_and(|v| v < (5, 9)) {
        v.push(w("net/ipv4/vs/conn_reuse_mode", "0", false));
    }
    if cfg.strict_arp {
        v.push(w("net/ipv4/conf/all/arp_ignore", "1", false));
        v.push(w("net/ipv4/conf/all/arp_announce", "2", false));
    }
    v
}

/// Applies the writes; returns warnings for optional failures, an error for required ones.
pub fn apply(cfg: &IpvsConfig) -> Result<Vec<SysctlFailure>, String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut warnings = Vec::new();
    for wr in plan(cfg, kernel_version(release.trim())) {
        if std::fs::read_to_string(&wr.path).is_ok_and(|cur| cur.trim() == wr.value) {
            continue;
        }
        if let Err(e) = std::fs::write(&wr.path, wr.value) {
            let failure = SysctlFailure::write(wr.path.display().to_string(), wr.value, e);
            if wr.required {
                return Err(failure.to_string());
            }
            warnings.push(failure);
        }
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(v: &[Write]) -> Vec<String> {
        v.iter()
            .map(|w| format!("{}={}", w.path.display(), w.value))
            .collect()
    }

    #[test]
    fn conn_reuse_mode_only_before_5_9() {
        let cfg = IpvsConfig::default();
        let old = keys(&plan(&cfg, Some((5, 4))));
        assert!(old.contains(&"/proc/sys/net/ipv4/vs/conn_reuse_mode=0".to_string()));
        let new = keys(&plan(&cfg, Some((6, 1))));
        assert!(!new.iter().any(|k| k.contains("conn_reuse_mode")));
        assert!(new.contains(&"/proc/sys/net/ipv4/vs/conntrack=1".to_string()));
        assert!(new.contains(&"/proc/sys/net/ipv4/vs/expire_nodest_conn=1".to_string()));
        assert!(new.contains(&"/proc/sys/net/ipv4/vs/expire_quiescent_template=1".to_string()));
        assert!(new.contains(&"/proc/sys/net/ipv4/ip_forward=1".to_string()));
    }

    #[test]
    fn strict_arp() {
        let cfg = IpvsConfig {
            strict_arp: true,
            ..Default::default()
        };
        let k = keys(&plan(&cfg, Some((6, 1))));
        assert!(k.contains(&"/proc/sys/net/ipv4/conf/all/arp_ignore=1".to_string()));
        assert!(k.contains(&"/proc/sys/net/ipv4/conf/all/arp_announce=2".to_string()));
    }

    #[test]
    fn versions() {
        assert_eq!(kernel_version("6.1.0-57-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("5.10.0"), Some((5, 10)));
        assert_eq!(kernel_version("garbage"), None);
    }
}
