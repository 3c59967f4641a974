//! The command line's settings that are not `KubeProxyConfiguration` fields, read once from
//! the parsed flags into a typed struct: upstream's own (`Options` in options.go: `--master`,
//! `--cleanup`, `--init-only`, `--write-config-to`) and ours. Later phases read this struct
//! and never the raw flags. Values that need checking stay text here; resolving them names
//! the flag in its error. Pure.

use std::collections::BTreeSet;
use std::path::PathBuf;

use super::{cli, flagz, Parsed};

/// The flags beside the configuration file's fields.
#[derive(Debug, Clone, Default)]
pub struct CliOptions {
    /// `--manifests`: serve from manifest files instead of the API server.
    pub manifests: Option<PathBuf>,
    /// `--master`: the API server's URL, unchecked.
    pub master: Option<String>,
    /// `--write-config-to`: write the configuration there and exit.
    pub write_config_to: Option<PathBuf>,
    pub cleanup: bool,
    pub init_only: bool,
    pub once: bool,
    pub dry_run: bool,
    /// `--service-cidrs`, unchecked.
    pub service_cidrs: Option<String>,
    /// `--nftables-table`, unchecked.
    pub nftables_table: Option<String>,
    /// `--load-balancing`, unchecked.
    pub load_balancing: Option<String>,
    /// `--service-proxy-name`, unchecked (empty when not given).
    pub service_proxy_name: String,
    /// `--localhost-nodeports` (ours).
    pub localhost_nodeports: bool,
    /// Not `--no-conntrack-cleanup`.
    pub conntrack_cleanup: bool,
    pub reset_dead_endpoint_connections: bool,
    /// Not `--no-exec-filter`.
    pub exec_filter: bool,
    /// `--write-seccomp-profile`: write the profile there and exit.
    pub write_seccomp_profile: Option<PathBuf>,
    /// Every flag given, by name: which flag a file field's error names, and which file
    /// fields a flag overrode.
    pub given: BTreeSet<&'static str>,
    /// What `/flagz` lists.
    pub flagz: std::collections::BTreeMap<String, String>,
}

impl CliOptions {
    pub fn from_parsed(p: &Parsed) -> CliOptions {
        let text = |s: Option<String>| s.filter(|s| !s.is_empty());
        CliOptions {
            manifests: text(p.get(cli::MANIFESTS)).map(PathBuf::from),
            master: text(p.get(cli::MASTER)),
            write_config_to: text(p.get(cli::WRITE_CONFIG_TO)).map(PathBuf::from),
            cleanup: p.get(cli::CLEANUP).unwrap_or(false),
            init_only: p.get(cli::INIT_ONLY).unwrap_or(false),
            once: p.get(cli::ONCE).unwrap_or(false),
            dry_run: p.get(cli::DRY_RUN).unwrap_or(false),
            service_cidrs: p.get(cli::SERVICE_CIDRS),
            nftables_table: p.get(cli::NFTABLES_TABLE),
            load_balancing: text(p.get(cli::LOAD_BALANCING)),
            service_proxy_name: p.get(cli::SERVICE_PROXY_NAME).unwrap_or_default(),
            localhost_nodeports: p.get(cli::LOCALHOST_NODEPORTS).unwrap_or(false),
            conntrack_cleanup: !p.get(cli::NO_CONNTRACK_CLEANUP).unwrap_or(false),
            reset_dead_endpoint_connections: p
                .get(cli::RESET_DEAD_ENDPOINT_CONNECTIONS)
                .unwrap_or(false),
            exec_filter: !p.get(cli::NO_EXEC_FILTER).unwrap_or(false),
            write_seccomp_profile: text(p.get(cli::WRITE_SECCOMP_PROFILE)).map(PathBuf::from),
            given: p.set.iter().map(|(spec, _)| spec.name).collect(),
            flagz: flagz::values(p),
        }
    }

    /// Whether the flag called `name` was given.
    pub fn given(&self, name: &str) -> bool {
        self.given.contains(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_flag_once_and_keeps_unchecked_values_as_text() {
        let p = super::super::parse([
            "--master=https://10.0.0.1:6443",
            "--cleanup",
            "--no-conntrack-cleanup",
            "--nftables-table=",
            "--load-balancing=",
            "--service-cidrs=not-a-cidr",
            "--manifests=/etc/m",
            "-v=2",
        ])
        .unwrap();
        let o = CliOptions::from_parsed(&p);
        assert_eq!(o.master.as_deref(), Some("https://10.0.0.1:6443"));
        assert!(o.cleanup && !o.once && !o.dry_run && !o.init_only);
        assert!(!o.conntrack_cleanup);
        // An empty table name is kept, to be refused by name; an empty --load-balancing
        // means the default.
        assert_eq!(o.nftables_table.as_deref(), Some(""));
        assert_eq!(o.load_balancing, None);
        assert_eq!(o.service_cidrs.as_deref(), Some("not-a-cidr"));
        assert_eq!(o.manifests, Some(PathBuf::from("/etc/m")));
        assert!(o.given("v") && o.given("cleanup") && !o.given("once"));
        assert_eq!(o.flagz.get("v").map(String::as_str), Some("2"));
        let none = CliOptions::from_parsed(&Parsed::default());
        assert!(none.conntrack_cleanup && none.given.is_empty() && none.master.is_none());
    }
}
