//! Conntrack sysctls from the config file's `conntrack` section (upstream
//! `pkg/proxy/conntrack/sysctls.go` and `cmd/kube-proxy` semantics), written through /proc/sys
//! and /sys, never by running `sysctl`. Planning is pure; [`apply`] does the writes.

use std::path::PathBuf;
use std::time::Duration;

/// The `conntrack` section of a KubeProxyConfiguration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConntrackConfig {
    pub max_per_core: Option<u32>,
    pub min: Option<u32>,
    pub tcp_established_timeout: Option<Duration>,
    pub tcp_close_wait_timeout: Option<Duration>,
    pub tcp_be_liberal: bool,
    pub udp_timeout: Option<Duration>,
    pub udp_stream_timeout: Option<Duration>,
}

impl Default for ConntrackConfig {
    fn default() -> Self {
        ConntrackConfig {
            max_per_core: Some(32768),
            min: Some(131072),
            tcp_established_timeout: Some(Duration::from_secs(86400)),
            tcp_close_wait_timeout: Some(Duration::from_secs(3600)),
            tcp_be_liberal: false,
            udp_timeout: None,
            udp_stream_timeout: None,
        }
    }
}

const NF: &str = "/proc/sys/net/netfilter";
/// The conntrack hash table size (a module parameter, global to the host).
pub const HASHSIZE: &str = "/sys/module/nf_conntrack/parameters/hashsize";

/// One write: the file and the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlWrite {
    pub path: PathBuf,
    pub value: u64,
}

fn w(name: &str, value: u64) -> SysctlWrite {
    SysctlWrite {
        path: PathBuf::from(format!("{NF}/{name}")),
        value,
    }
}

/// The nf_conntrack_max to set: maxPerCore × CPUs, at least `min`; none when maxPerCore is 0.
pub fn conntrack_max(cfg: &ConntrackConfig, cpus: u32) -> Option<u64> {
    let per_core = cfg.max_per_core.filter(|v| *v > 0)?;
    let max = per_core as u64 * cpus as u64;
    Some(max.max(cfg.min.unwrap_or(0) as u64))
}

/// The per-namespace writes (timeouts, be_liberal), in order.
pub fn plan_writes(cfg: &ConntrackConfig) -> Vec<SysctlWrite> {
    let mut out = Vec::new();
    let secs = |d: &Option<Duration>| d.map(|d| d.as_secs()).filter(|s| *s > 0);
    if let Some(s) = secs(&cfg.tcp_established_timeout) {
        out.push(w("nf_conntrack_tcp_timeout_established", s));
    }
    if let Some(s) = secs(&cfg.tcp_close_wait_timeout) {
        out.push(w("nf_conntrack_tcp_timeout_close_wait", s));
    }
    if cfg.tcp_be_liberal {
        out.push(w("nf_conntrack_tcp_be_liberal", 1));
    }
    if let Some(s) = secs(&cfg.udp_timeout) {
        out.push(w("nf_conntrack_udp_timeout", s));
    }
    if let Some(s) = secs(&cfg.udp_stream_timeout) {
        out.push(w("nf_conntrack_udp_timeout_stream", s));
    }
    out
}

/// `nf_conntrack_tcp_be_liberal`, per network namespace: /proc/sys/net shows the namespace
/// of the reading process, as every write here.
pub const TCP_BE_LIBERAL: &str = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal";

/// Whether INVALID packets are to be dropped: when the mode asks for it (upstream's iptables
/// mode) and the kernel is not liberal. As upstream's `NewProxier`, only a successful read of
/// a non-zero value counts as liberal: an unreadable sysctl (nf_conntrack not loaded yet)
/// keeps the drop.
pub fn drops_invalid(mode_asks: bool, tcp_be_liberal: &std::io::Result<u64>) -> bool {
    mode_asks && !matches!(tcp_be_liberal, Ok(v) if *v != 0)
}

/// Reads [`TCP_BE_LIBERAL`] (after [`apply`], which may have set it).
pub fn read_tcp_be_liberal() -> std::io::Result<u64> {
    read_u64(TCP_BE_LIBERAL)
}

fn read_u64(path: &str) -> std::io::Result<u64> {
    std::fs::read_to_string(path)?
        .trim()
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Applies the tuning. Failures are warnings: some kernels lack some knobs, and a
/// `nf_conntrack_max` outside the host namespace is read-only.
pub fn apply(cfg: &ConntrackConfig) -> Vec<crate::kernel::sysctl::SysctlFailure> {
    use crate::kernel::sysctl::SysctlFailure;
    let mut warnings = Vec::new();
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    if let Some(max) = conntrack_max(cfg, cpus) {
        let path = format!("{NF}/nf_conntrack_max");
        let current = read_u64(&path).unwrap_or(0);
        if current < max {
            match std::fs::write(&path, max.to_string()) {
                Ok(()) => {
                    tracing::info!(max, "set nf_conntrack_max");
                    // Upstream keeps the hash table at least max/4 buckets.
                    let want = max / 4;
                    match read_u64(HASHSIZE) {
                        Ok(h) if h >= want => {}
                        Ok(_) => {
                            if let Err(e) = std::fs::write(HASHSIZE, want.to_string()) {
                                warnings.push(SysctlFailure::write(HASHSIZE, want, e));
                            }
                        }
                        Err(e) => warnings.push(SysctlFailure::read(HASHSIZE, e)),
                    }
                }
                Err(e) => warnings.push(
                    SysctlFailure::write(path, max, e)
                        .with_hint("outside the host network namespace it is read-only"),
                ),
            }
        }
    }
    for wr in plan_writes(cfg) {
        let path = wr.path.display().to_string();
        // As upstream's setIntSysCtl: written only when it reads otherwise, so a host that
        // sets them itself (sysctl.d) needs no write, which /proc/sys read-only in an
        // unprivileged container would refuse.
        match read_u64(&path) {
            Ok(v) if v == wr.value => continue,
            Ok(_) => {}
            Err(e) => {
                warnings.push(SysctlFailure::read(path, e));
                continue;
            }
        }
        match std::fs::write(&wr.path, wr.value.to_string()) {
            Ok(()) => {
                tracing::info!(path = %wr.path.display(), value = wr.value, "set conntrack sysctl")
            }
            Err(e) => warnings.push(SysctlFailure::write(path, wr.value, e)),
        }
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_packets_are_dropped_unless_the_kernel_is_liberal() {
        let gone = || Err(std::io::Error::from(std::io::ErrorKind::NotFound));
        assert!(drops_invalid(true, &Ok(0)));
        assert!(!drops_invalid(true, &Ok(1)));
        assert!(drops_invalid(true, &gone()), "unreadable: upstream drops");
        assert!(!drops_invalid(false, &Ok(0)), "not iptables mode");
        assert!(!drops_invalid(false, &gone()));
    }

    #[test]
    fn max_follows_upstream_formula() {
        let c = ConntrackConfig::default();
        assert_eq!(
            conntrack_max(&c, 2),
            Some(131072),
            "min wins on small machines"
        );
        assert_eq!(conntrack_max(&c, 8), Some(262144));
        let off = ConntrackConfig {
            max_per_core: Some(0),
            ..c
        };
        assert_eq!(conntrack_max(&off, 8), None);
    }

    #[test]
    fn writes_only_what_is_set() {
        let c = ConntrackConfig {
            tcp_be_liberal: true,
            udp_timeout: Some(Duration::from_secs(30)),
            tcp_close_wait_timeout: Some(Duration::ZERO),
            ..Default::default()
        };
        let names: Vec<String> = plan_writes(&c)
            .iter()
            .map(|w| {
                format!(
                    "{}={}",
                    w.path.file_name().unwrap().to_str().unwrap(),
                    w.value
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                "nf_conntrack_tcp_timeout_established=86400",
                "nf_conntrack_tcp_be_liberal=1",
                "nf_conntrack_udp_timeout=30"
            ]
        );
    }
}
