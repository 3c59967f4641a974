//! [`SysctlFailure`]: a /proc/sys write (or read) that failed, typed so that its log line
//! carries the sysctl, the value and the error as fields under one fixed message. Pure.

/// One sysctl that could not be set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlFailure {
    /// The /proc/sys path.
    pub path: String,
    /// The value wanted (`None`: the read before the write failed).
    pub value: Option<String>,
    pub err: String,
    /// Why it may be expected, e.g. read-only outside the host network namespace.
    pub hint: Option<&'static str>,
}

impl SysctlFailure {
    pub fn write(path: impl Into<String>, value: impl ToString, err: impl ToString) -> Self {
        SysctlFailure {
            path: path.into(),
            value: Some(value.to_string()),
            err: err.to_string(),
            hint: None,
        }
    }

    pub fn read(path: impl Into<String>, err: impl ToString) -> Self {
        SysctlFailure {
            path: path.into(),
            value: None,
            err: err.to_string(),
            hint: None,
        }
    }

    pub fn with_hint(self, hint: &'static str) -> Self {
        SysctlFailure {
            hint: Some(hint),
            ..self
        }
    }

    /// Logs it as a warning: `"cannot set a sysctl" sysctl=… value=… err=…` (`hint=` when
    /// there is one), or `"cannot read a sysctl"`.
    pub fn log(&self) {
        let hint = self.hint.unwrap_or("");
        match &self.value {
            Some(v) => {
                tracing::warn!(sysctl = %self.path, value = %v, err = %self.err, hint, "cannot set a sysctl")
            }
            None => {
                tracing::warn!(sysctl = %self.path, err = %self.err, hint, "cannot read a sysctl")
            }
        }
    }
}

/// Logs `failures` as one warning: one alone as [`SysctlFailure::log`], several (an
/// unprivileged container, where /proc/sys is read-only, fails every write) as
/// `"cannot set sysctls" count=… sysctls="…; …" hint=…`, so that a NET_ADMIN-only
/// DaemonSet says once what the host must set.
pub fn log_failures(failures: &[SysctlFailure], hint: &str) {
    match failures {
        [] => {}
        [one] => one.log(),
        many => tracing::warn!(
            count = many.len(),
            sysctls = %describe_failures(many),
            hint,
            "cannot set sysctls"
        ),
    }
}

/// `PATH=VALUE: ERR; …` for each failure (`PATH: ERR` for a read), paths without
/// `/proc/sys/`.
pub fn describe_failures(failures: &[SysctlFailure]) -> String {
    failures
        .iter()
        .map(|f| {
            let path = f.path.strip_prefix("/proc/sys/").unwrap_or(&f.path);
            match &f.value {
                Some(v) => format!("{path}={v}: {}", f.err),
                None => format!("{path}: {}", f.err),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// `cannot set PATH to VALUE: ERR (HINT)`, the text form.
impl std::fmt::Display for SysctlFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.value {
            Some(v) => write!(f, "cannot set {} to {v}: {}", self.path, self.err)?,
            None => write!(f, "cannot read {}: {}", self.path, self.err)?,
        }
        if let Some(h) = self.hint {
            write!(f, " ({h})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_as_before_with_its_parts_apart() {
        let f = SysctlFailure::write(
            "/proc/sys/net/netfilter/nf_conntrack_max",
            131072,
            "Permission denied",
        )
        .with_hint("outside the host network namespace it is read-only");
        assert_eq!(
            f.to_string(),
            "cannot set /proc/sys/net/netfilter/nf_conntrack_max to 131072: Permission denied (outside the host network namespace it is read-only)"
        );
        assert_eq!(f.value.as_deref(), Some("131072"));
        let r = SysctlFailure::read("/proc/sys/x", "gone");
        assert_eq!(r.to_string(), "cannot read /proc/sys/x: gone");
    }

    #[test]
    fn several_failures_are_described_in_one_line() {
        let failures = [
            SysctlFailure::write(
                "/proc/sys/net/netfilter/nf_conntrack_max",
                131072,
                "Read-only file system (os error 30)",
            ),
            SysctlFailure::write(
                "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait",
                3600,
                "Read-only file system (os error 30)",
            ),
            SysctlFailure::read("/sys/module/nf_conntrack/parameters/hashsize", "gone"),
        ];
        assert_eq!(
            describe_failures(&failures),
            "net/netfilter/nf_conntrack_max=131072: Read-only file system (os error 30); \
             net/netfilter/nf_conntrack_tcp_timeout_close_wait=3600: Read-only file system (os error 30); \
             /sys/module/nf_conntrack/parameters/hashsize: gone"
        );
    }
}
