//! Typed handles on the flags of [`FLAGS`]: a [`Flag`] names a flag and the type its value
//! reads as, and making one in a constant checks both when the crate compiles, so a
//! misspelt name or a flag read as the wrong type never builds. [`cli`] holds the handles
//! read outside the flag-to-field bindings. Pure.

use super::{parse_bool, parse_int, split_list, FlagSpec, Kind, FLAGS};
use crate::config::file::duration;
use crate::config::file::v1alpha1::GoDuration;
use Kind::*;

/// [`super::spec`] when the crate compiles.
const fn const_spec(name: &str) -> Option<&'static FlagSpec> {
    let mut i = 0;
    while i < FLAGS.len() {
        if const_str_eq(FLAGS[i].name, name) {
            return Some(&FLAGS[i]);
        }
        i += 1;
    }
    None
}

const fn const_str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// What a flag's value reads as through a [`Flag`]: the kinds of flag whose values read as
/// this type, and how a given flag's values become one.
pub trait FlagValue: Sized {
    /// The kinds whose values read as this type.
    const KINDS: &'static [Kind];
    /// The value of a flag that was given, from every value it was given (in order; they
    /// were checked by [`parse`]).
    fn read(values: &[&str]) -> Option<Self>;
}

impl FlagValue for bool {
    const KINDS: &'static [Kind] = &[Bool];
    fn read(values: &[&str]) -> Option<Self> {
        values.last().map(|v| parse_bool(v).unwrap_or(false))
    }
}

impl FlagValue for i32 {
    const KINDS: &'static [Kind] = &[Int32];
    fn read(values: &[&str]) -> Option<Self> {
        values.last().and_then(|v| parse_int(v).ok())
    }
}

impl FlagValue for GoDuration {
    const KINDS: &'static [Kind] = &[Duration];
    fn read(values: &[&str]) -> Option<Self> {
        values
            .last()
            .and_then(|v| duration::parse(v).ok())
            .map(GoDuration)
    }
}

/// The last value as written.
impl FlagValue for String {
    const KINDS: &'static [Kind] = &[Str, Ip, IpPort, Float32, Level, Uint64];
    fn read(values: &[&str]) -> Option<Self> {
        values.last().map(|v| v.to_string())
    }
}

/// A list flag: pflag's StringSlice replaces its default on the first use and appends on
/// the next ones.
impl FlagValue for Vec<String> {
    const KINDS: &'static [Kind] = &[StrSlice];
    fn read(values: &[&str]) -> Option<Self> {
        Some(values.iter().flat_map(|v| split_list(v)).collect())
    }
}

/// Every value of a flag whose repeats merge (`--feature-gates`, `--vmodule`), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EveryValue(pub Vec<String>);

impl FlagValue for EveryValue {
    const KINDS: &'static [Kind] = &[MapBool, VModule];
    fn read(values: &[&str]) -> Option<Self> {
        Some(EveryValue(values.iter().map(|v| v.to_string()).collect()))
    }
}

/// A flag of [`FLAGS`] and the type its value reads as. [`Flag::new`] in a constant checks
/// both when the crate compiles, so a misspelt name or a flag read as the wrong type never
/// builds.
pub struct Flag<T> {
    pub name: &'static str,
    value: std::marker::PhantomData<fn() -> T>,
}

impl<T> Clone for Flag<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Flag<T> {}

impl<T: FlagValue> Flag<T> {
    /// The flag called `name`; panics (at compile time in a constant) if there is none or
    /// its kind does not read as `T`.
    pub const fn new(name: &'static str) -> Self {
        let Some(spec) = const_spec(name) else {
            panic!("no such flag in FLAGS");
        };
        let mut i = 0;
        while i < T::KINDS.len() && T::KINDS[i] as u8 != spec.kind as u8 {
            i += 1;
        }
        assert!(
            i < T::KINDS.len(),
            "the flag's kind does not read as this type"
        );
        Flag {
            name,
            value: std::marker::PhantomData,
        }
    }
}

/// The flags read by name outside the flag-to-field bindings, checked when the crate
/// compiles.
pub mod cli {
    use super::{EveryValue, Flag};

    pub const CONFIG: Flag<String> = Flag::new("config");
    pub const WRITE_CONFIG_TO: Flag<String> = Flag::new("write-config-to");
    pub const CLEANUP: Flag<bool> = Flag::new("cleanup");
    pub const MASTER: Flag<String> = Flag::new("master");
    pub const HOSTNAME_OVERRIDE: Flag<String> = Flag::new("hostname-override");
    pub const PROFILING: Flag<bool> = Flag::new("profiling");
    pub const INIT_ONLY: Flag<bool> = Flag::new("init-only");
    pub const HEALTHZ_PORT: Flag<i32> = Flag::new("healthz-port");
    pub const METRICS_PORT: Flag<i32> = Flag::new("metrics-port");
    pub const LOGGING_FORMAT: Flag<String> = Flag::new("logging-format");
    pub const VMODULE: Flag<EveryValue> = Flag::new("vmodule");
    pub const VERSION: Flag<String> = Flag::new("version");
    pub const HELP: Flag<bool> = Flag::new("help");
    pub const MANIFESTS: Flag<String> = Flag::new("manifests");
    pub const SERVICE_CIDRS: Flag<String> = Flag::new("service-cidrs");
    pub const NFTABLES_TABLE: Flag<String> = Flag::new("nftables-table");
    pub const LOCALHOST_NODEPORTS: Flag<bool> = Flag::new("localhost-nodeports");
    pub const NO_CONNTRACK_CLEANUP: Flag<bool> = Flag::new("no-conntrack-cleanup");
    pub const RESET_DEAD_ENDPOINT_CONNECTIONS: Flag<bool> =
        Flag::new("reset-dead-endpoint-connections");
    pub const LOAD_BALANCING: Flag<String> = Flag::new("load-balancing");
    pub const SERVICE_PROXY_NAME: Flag<String> = Flag::new("service-proxy-name");
    pub const ONCE: Flag<bool> = Flag::new("once");
    pub const DRY_RUN: Flag<bool> = Flag::new("dry-run");
    pub const NO_EXEC_FILTER: Flag<bool> = Flag::new("no-exec-filter");
    pub const WRITE_SECCOMP_PROFILE: Flag<String> = Flag::new("write-seccomp-profile");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_is_found_when_compiling_and_every_upstream_default_names_one() {
        for spec in FLAGS {
            assert_eq!(const_spec(spec.name).map(|s| s.name), Some(spec.name));
        }
        assert!(const_spec("no-such-flag").is_none());
        for (name, _) in super::super::defaults::FLAG_DEFAULTS {
            assert!(const_spec(name).is_some_and(|s| !s.ours), "--{name}");
        }
    }

    #[test]
    fn handles_read_as_their_types() {
        let p = super::super::parse([
            "--once",
            "--master=https://x",
            "--vmodule=a=1",
            "--vmodule",
            "b=2",
        ])
        .unwrap();
        assert_eq!(p.get(cli::ONCE), Some(true));
        assert_eq!(p.get(cli::DRY_RUN), None);
        assert_eq!(p.get(cli::MASTER).as_deref(), Some("https://x"));
        assert_eq!(
            p.get(cli::VMODULE),
            Some(EveryValue(vec!["a=1".into(), "b=2".into()]))
        );
    }
}
