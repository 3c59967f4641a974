//! The first phase of reading the configuration: the `--config` file (decoded leniently,
//! defaulted, converted, the logging flags over it, a warning for each flag it replaces), or
//! without it the flags over upstream's defaults, as options.go's `Complete` and
//! `processV1Alpha1Flags` do; then the warnings every given flag earns (deprecated, no
//! effect here); then upstream's platform defaults and our overrides of the running mode's
//! settings. The one phase that reads the parsed flags: it hands on the configuration and
//! the other flags as a typed [`CliOptions`]. Pure: the file's bytes are read by the caller.

use std::path::PathBuf;

use super::file::internal::KubeProxyConfig;
use super::file::{decode, v1alpha1};
use super::flags::fields::{apply, Namer, CONFIG_FLAGS, LOGGING_FLAGS, OVERRIDES, V1ALPHA1_FLAGS};
use super::flags::options::CliOptions;
use super::flags::{cli, Meaning, Parsed, Target};
use super::{bad, ConfigError};

/// What loading produced: the configuration with our overrides applied, the other flags,
/// and where each value came from.
pub(super) struct Loaded {
    pub config: KubeProxyConfig,
    pub options: CliOptions,
    /// Names the file field or the flag in an error.
    pub namer: Namer,
    /// No mode was configured (upstream's platform default applied).
    pub mode_defaulted: bool,
    /// The `--config` file and its bytes (the file watcher compares against them).
    pub file: Option<(PathBuf, Vec<u8>)>,
    pub warnings: Vec<String>,
}

/// What the configuration came from before overrides.
struct Source {
    config: KubeProxyConfig,
    file: Option<(PathBuf, Vec<u8>)>,
    warnings: Vec<String>,
}

/// The file when there is one, else the flags; then the flags' own warnings and our
/// overrides.
pub(super) fn load(p: &Parsed, file: Option<(PathBuf, Vec<u8>)>) -> Result<Loaded, ConfigError> {
    let options = CliOptions::from_parsed(p);
    let Source {
        mut config,
        file,
        mut warnings,
    } = match file {
        Some((path, bytes)) => load_file(p, path, bytes)?,
        None => load_flags(p, &options),
    };
    warn_about_given_flags(p, &mut warnings);
    let mode_defaulted = apply_overrides(&mut config, p)?;
    warn_about_file_fields(&options, &config, &mut warnings);
    let namer = Namer {
        file: file.as_ref().map(|(path, _)| path.display().to_string()),
        given: options.given.clone(),
    };
    Ok(Loaded {
        config,
        options,
        namer,
        mode_defaulted,
        file,
        warnings,
    })
}

/// With `--config`: the file replaces the flag values, except the logging flags.
fn load_file(p: &Parsed, path: PathBuf, bytes: Vec<u8>) -> Result<Source, ConfigError> {
    let shown = path.display().to_string();
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        bad(
            &format!("config file {shown}"),
            format!("not UTF-8 (byte {})", e.valid_up_to()),
        )
    })?;
    let decoded = decode::decode(text).map_err(|e| match e.field {
        Some(f) => bad(&format!("config file {shown} field {f}"), e.why),
        None => bad(&format!("config file {shown}"), e.why),
    })?;
    let mut warnings: Vec<String> = decoded
        .strict_errors
        .into_iter()
        .map(|s| {
            format!("config file {shown}: using lenient decoding as strict decoding failed: {s}")
        })
        .collect();
    let mut v = decoded.config;
    v1alpha1::set_defaults(&mut v);
    let mut config = KubeProxyConfig::from_v1alpha1(&v);
    apply(LOGGING_FLAGS, &mut config, p);
    warn_about_replaced_flags(p, &mut warnings);
    Ok(Source {
        config,
        file: Some((path, bytes)),
        warnings,
    })
}

/// One warning per flag (given once or more) whose value the file replaces.
fn warn_about_replaced_flags(p: &Parsed, warnings: &mut Vec<String>) {
    for (spec, _) in &p.set {
        if spec.target == Target::Config
            && !warnings
                .iter()
                .any(|w| w.starts_with(&format!("--{} ", spec.name)))
        {
            warnings.push(format!(
                "--{} is ignored: --config is set and, as upstream, the file replaces \
                 the flag values (set it in the file)",
                spec.name
            ));
        }
    }
}

/// Without `--config`: the flags over upstream's defaults.
fn load_flags(p: &Parsed, options: &CliOptions) -> Source {
    let mut config = KubeProxyConfig::defaulted();
    apply(CONFIG_FLAGS, &mut config, p);
    apply(LOGGING_FLAGS, &mut config, p);
    if options.write_config_to.is_none() {
        let hp = p
            .get(cli::HEALTHZ_PORT)
            .unwrap_or(v1alpha1::PROXY_HEALTHZ_PORT.into());
        let mp = p
            .get(cli::METRICS_PORT)
            .unwrap_or(v1alpha1::PROXY_STATUS_PORT.into());
        config.healthz_bind_address =
            address_from_deprecated_port(&config.healthz_bind_address, hp);
        config.metrics_bind_address =
            address_from_deprecated_port(&config.metrics_bind_address, mp);
    }
    apply(V1ALPHA1_FLAGS, &mut config, p);
    Source {
        config,
        file: None,
        warnings: Vec::new(),
    }
}

/// `addressFromDeprecatedFlags`: `--healthz-port`/`--metrics-port` (default 10256/10249)
/// fill in a missing port; 0 disables the server.
fn address_from_deprecated_port(addr: &str, port: i32) -> String {
    if port == 0 {
        return String::new();
    }
    match u16::try_from(port) {
        Ok(p) => v1alpha1::append_port_if_needed(addr, p),
        Err(_) => addr.to_string(),
    }
}

/// A warning for each deprecated flag given, and one for each flag that has no effect here.
fn warn_about_given_flags(p: &Parsed, warnings: &mut Vec<String>) {
    for (spec, _) in &p.set {
        if let Some(d) = spec.deprecated {
            warnings.push(format!("--{} is deprecated: {d}", spec.name));
        }
        if let Meaning::NoEffect(why) = spec.meaning {
            let w = format!("--{} has no effect here: {why}", spec.name);
            if !warnings.contains(&w) {
                warnings.push(w);
            }
        }
    }
}

/// Upstream's platform defaults (an empty mode is iptables), then our own flags over the
/// running mode's settings and `--hostname-override`. Returns whether the mode was
/// defaulted.
fn apply_overrides(kp: &mut KubeProxyConfig, p: &Parsed) -> Result<bool, ConfigError> {
    let mode_defaulted = kp.apply_platform_defaults();
    apply(OVERRIDES, kp, p);
    if let Some(h) = p.get(cli::HOSTNAME_OVERRIDE).filter(|h| !h.is_empty()) {
        let h = h.trim();
        if h.is_empty() {
            return Err(bad(
                "--hostname-override",
                "empty hostname-override is invalid",
            ));
        }
        kp.hostname_override = h.to_lowercase();
    }
    Ok(mode_defaulted)
}

/// File fields accepted without effect (the flags warn for themselves when loaded).
fn warn_about_file_fields(o: &CliOptions, kp: &KubeProxyConfig, warnings: &mut Vec<String>) {
    if !kp.logging.vmodule.is_empty() && !o.given(cli::VMODULE.name) {
        warnings.push(
            "config field logging.vmodule has no effect here: per-file verbosity needs Go \
             source files; logging.verbosity applies to all"
                .into(),
        );
    }
    if kp.enable_profiling && !o.given(cli::PROFILING.name) {
        warnings.push("config field enableProfiling has no effect here: no /debug/pprof".into());
    }
}
