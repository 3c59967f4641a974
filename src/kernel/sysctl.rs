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
}
