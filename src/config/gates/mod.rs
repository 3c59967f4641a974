//! Feature gates as upstream kube-proxy applies `--feature-gates` / `featureGates`:
//! component-base's `featuregate.SetFromMap` on the binary's default gate, at emulation
//! version 1.37 (the binary version: kube-proxy has no `--emulated-version`) and minimum
//! compatibility version 1.36 (one minor before). Every gate the upstream binary knows is in
//! [`table`]; an unknown gate, a locked gate set to the other value,
//! a gate not yet available at 1.37 and an enabled gate whose dependencies are off are
//! errors with upstream's texts; setting a deprecated or GA gate is a warning. Pure.

use std::collections::BTreeMap;

mod table;

pub use table::BINARY_VERSION;
use table::GATES;

/// A gate's maturity (component-base's `prerelease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Not yet available at the emulated version.
    PreAlpha,
    Alpha,
    Beta,
    Ga,
    Deprecated,
}

impl Stage {
    /// The string upstream prints and puts in `kubernetes_feature_enabled`'s `stage` label
    /// (GA is the empty string).
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::PreAlpha => "PRE-ALPHA",
            Stage::Alpha => "ALPHA",
            Stage::Beta => "BETA",
            Stage::Ga => "",
            Stage::Deprecated => "DEPRECATED",
        }
    }
}

/// One entry of a gate's versioned specs (component-base's `FeatureSpec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    /// The first version (major, minor) this entry is valid from.
    pub version: (u32, u32),
    pub default: bool,
    pub stage: Stage,
    /// `LockToDefault`: the gate cannot be set to the other value.
    pub locked: bool,
    /// The entry applies only when the minimum compatibility version is at least this.
    pub min_compat: Option<(u32, u32)>,
}

/// A gate the upstream binary registers.
#[derive(Debug, Clone, Copy)]
pub struct GateDef {
    pub name: &'static str,
    /// Ordered by version.
    pub specs: &'static [Spec],
    /// Gates that must be on when this one is.
    pub depends_on: &'static [&'static str],
}

/// The spec that applies when `specs` are not yet available (component-base returns this).
const PRE_ALPHA: Spec = Spec {
    version: (0, 0),
    default: false,
    stage: Stage::PreAlpha,
    locked: false,
    min_compat: None,
};

/// The generic gates that switch every alpha / beta gate not set explicitly.
const ALL_ALPHA: &str = "AllAlpha";
const ALL_BETA: &str = "AllBeta";

impl GateDef {
    /// `featureSpecAtEmulationAndMinCompatVersion`: the last entry whose version is at most
    /// the emulation version and whose minimum compatibility version is met.
    pub fn spec_at(&self, emulation: (u32, u32), min_compat: (u32, u32)) -> Spec {
        self.specs
            .iter()
            .rev()
            .find(|s| s.version <= emulation && s.min_compat.is_none_or(|m| min_compat >= m))
            .copied()
            .unwrap_or(PRE_ALPHA)
    }

    /// The spec in effect in this binary.
    pub fn spec(&self) -> Spec {
        let (major, minor) = BINARY_VERSION;
        self.spec_at(BINARY_VERSION, (major, minor.saturating_sub(1)))
    }
}

/// The known gate called `name`.
pub fn lookup(name: &str) -> Option<&'static GateDef> {
    GATES
        .binary_search_by(|g| g.name.cmp(name))
        .ok()
        .map(|i| &GATES[i])
}

/// Why a gate setting was refused; the texts are component-base's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error("unrecognized feature gate: {0}")]
    Unrecognized(String),
    #[error("cannot set feature gate {name} to {value}, feature is locked to {locked}")]
    Locked {
        name: String,
        value: bool,
        locked: bool,
    },
    #[error(
        "cannot set feature gate {name} to {value}, feature is PreAlpha at emulated version \
         {}.{}, min compatibility version {}.{}",
        BINARY_VERSION.0, BINARY_VERSION.1, BINARY_VERSION.0, BINARY_VERSION.1 - 1
    )]
    PreAlpha { name: String, value: bool },
    #[error("{name} is enabled, but depends on features that are disabled: [{}]", disabled.join(" "))]
    Dependency {
        name: String,
        disabled: Vec<&'static str>,
    },
}

/// Several errors as apimachinery's `NewAggregate` prints them: one alone, else `[a, b]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateErrors(pub Vec<GateError>);

impl std::fmt::Display for GateErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_slice() {
            [one] => write!(f, "{one}"),
            many => {
                let all: Vec<String> = many.iter().map(ToString::to_string).collect();
                write!(f, "[{}]", all.join(", "))
            }
        }
    }
}

impl std::error::Error for GateErrors {}

/// The resolved gates: every known gate's value in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureGates {
    /// Values set explicitly or through AllAlpha/AllBeta; the rest take their default.
    enabled: BTreeMap<&'static str, bool>,
}

impl Default for FeatureGates {
    /// Every gate at its default.
    fn default() -> Self {
        FeatureGates {
            enabled: BTreeMap::new(),
        }
    }
}

/// What upstream logs when a deprecated or GA gate is set by name.
fn setting_warning(name: &str, value: bool, stage: Stage) -> Option<String> {
    match stage {
        Stage::Deprecated => Some(format!(
            "setting deprecated feature gate {name}={value}: it will be removed in a future release"
        )),
        Stage::Ga => Some(format!(
            "setting GA feature gate {name}={value}: it will be removed in a future release"
        )),
        _ => None,
    }
}

/// AllAlpha/AllBeta set every gate of their stage that was not set by name.
fn set_all_alpha_and_beta(
    enabled: &mut BTreeMap<&'static str, bool>,
    explicit: Vec<(&'static str, bool)>,
) {
    for (all, v) in explicit {
        let stage = if all == ALL_ALPHA {
            Stage::Alpha
        } else {
            Stage::Beta
        };
        for g in GATES {
            if g.name != ALL_ALPHA && g.name != ALL_BETA && g.spec().stage == stage {
                enabled.entry(g.name).or_insert(v);
            }
        }
        enabled.insert(all, v);
    }
}

impl FeatureGates {
    /// `SetFromMap` on a fresh default gate. Returns the gates and the warnings upstream
    /// logs (setting a deprecated or GA gate).
    pub fn from_map(m: &BTreeMap<String, bool>) -> Result<(FeatureGates, Vec<String>), GateErrors> {
        let mut errs = Vec::new();
        let mut warnings = Vec::new();
        let mut enabled = BTreeMap::new();
        let mut explicit = Vec::new();
        for (k, &v) in m {
            let Some(def) = lookup(k) else {
                // Upstream returns at the first unknown gate, with the errors so far.
                errs.push(GateError::Unrecognized(k.clone()));
                return Err(GateErrors(errs));
            };
            let spec = def.spec();
            if spec.locked && spec.default != v {
                errs.push(GateError::Locked {
                    name: k.clone(),
                    value: v,
                    locked: spec.default,
                });
                continue;
            }
            if def.name == ALL_ALPHA || def.name == ALL_BETA {
                explicit.push((def.name, v));
                continue;
            }
            if spec.stage == Stage::PreAlpha {
                errs.push(GateError::PreAlpha {
                    name: k.clone(),
                    value: v,
                });
                continue;
            }
            enabled.insert(def.name, v);
            warnings.extend(setting_warning(k, v, spec.stage));
        }
        set_all_alpha_and_beta(&mut enabled, explicit);
        if !errs.is_empty() {
            return Err(GateErrors(errs));
        }
        let gates = FeatureGates { enabled };
        let errs = gates.dependency_errors();
        if !errs.is_empty() {
            return Err(GateErrors(errs));
        }
        Ok((gates, warnings))
    }

    /// Every enabled gate whose dependencies are not all enabled.
    fn dependency_errors(&self) -> Vec<GateError> {
        let mut errs = Vec::new();
        for g in GATES {
            if g.depends_on.is_empty() || !self.enabled(g.name) {
                continue;
            }
            let disabled: Vec<&'static str> = g
                .depends_on
                .iter()
                .copied()
                .filter(|d| !self.enabled(d))
                .collect();
            if !disabled.is_empty() {
                errs.push(GateError::Dependency {
                    name: g.name.to_string(),
                    disabled,
                });
            }
        }
        errs
    }

    /// Whether the gate is on. An unknown name is off (upstream panics; every name this
    /// binary asks about is in the table, which a test checks).
    pub fn enabled(&self, name: &str) -> bool {
        match self.enabled.get(name) {
            Some(v) => *v,
            None => lookup(name).is_some_and(|g| g.spec().default),
        }
    }

    /// `AddMetrics`: (name, stage label, enabled) of every gate available at this version,
    /// for `kubernetes_feature_enabled`.
    pub fn metric_values(&self) -> Vec<(&'static str, &'static str, bool)> {
        GATES
            .iter()
            .filter_map(|g| {
                let s = g.spec();
                (s.stage != Stage::PreAlpha)
                    .then(|| (g.name, s.stage.as_str(), self.enabled(g.name)))
            })
            .collect()
    }
}

/// The gates kube-nlproxy reads (each must be in the table).
pub const KUBE_PROXY_NFTABLES_LOCALHOST_NODE_PORTS: &str = "KubeProxyNFTablesLocalhostNodePorts";
pub const ALLOW_SERVICE_EXTERNAL_IPS: &str = "AllowServiceExternalIPs";
pub const KUBE_PROXY_IPVS: &str = "KubeProxyIPVS";
pub const COMPONENT_STATUSZ: &str = "ComponentStatusz";
pub const COMPONENT_FLAGZ: &str = "ComponentFlagz";

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&str, bool)]) -> Result<(FeatureGates, Vec<String>), GateErrors> {
        FeatureGates::from_map(&pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect())
    }

    #[test]
    fn table_is_sorted_and_pins_known_entries() {
        assert!(GATES.windows(2).all(|w| w[0].name < w[1].name));
        assert_eq!(BINARY_VERSION, (1, 37));
        // Upstream's count at v1.37.2 (kube_features.go plus client-go, apiserver,
        // component-base's metrics, logs and zpages gates, AllAlpha and AllBeta).
        assert_eq!(GATES.len(), 254);
        let s = |n: &str| lookup(n).unwrap().spec();
        assert_eq!(
            (
                s("KubeProxyNFTablesLocalhostNodePorts").stage,
                s("KubeProxyNFTablesLocalhostNodePorts").default
            ),
            (Stage::Alpha, false)
        );
        assert_eq!(
            (s("KubeProxyIPVS").stage, s("KubeProxyIPVS").default),
            (Stage::Deprecated, true)
        );
        assert_eq!(
            (
                s("AllowServiceExternalIPs").stage,
                s("AllowServiceExternalIPs").default
            ),
            (Stage::Ga, true)
        );
        assert_eq!(
            (s("ComponentStatusz").stage, s("ComponentStatusz").default),
            (Stage::Beta, true)
        );
        assert_eq!(
            (s("ComponentFlagz").stage, s("ComponentFlagz").default),
            (Stage::Beta, true)
        );
        let p = s("PreferSameTrafficDistribution");
        assert!(p.locked && p.default && p.stage == Stage::Ga);
        assert_eq!(s("NFTablesNetlink").stage, Stage::Beta);
        for n in [
            KUBE_PROXY_NFTABLES_LOCALHOST_NODE_PORTS,
            ALLOW_SERVICE_EXTERNAL_IPS,
            KUBE_PROXY_IPVS,
            COMPONENT_STATUSZ,
            COMPONENT_FLAGZ,
        ] {
            assert!(lookup(n).is_some(), "{n}");
        }
    }

    #[test]
    fn emulation_version_picks_the_last_entry_not_after_it() {
        let ipvs = lookup("KubeProxyIPVS").unwrap();
        assert_eq!(ipvs.spec_at((1, 36), (1, 35)).stage, Stage::Ga);
        assert_eq!(ipvs.spec_at((1, 37), (1, 36)).stage, Stage::Deprecated);
        assert_eq!(ipvs.spec_at((0, 9), (0, 8)).stage, Stage::PreAlpha);
    }

    #[test]
    fn unknown_gate_is_an_error_with_upstreams_text() {
        let e = set(&[("NoSuchGate", true)]).unwrap_err();
        assert_eq!(e.to_string(), "unrecognized feature gate: NoSuchGate");
    }

    #[test]
    fn locked_gate_set_to_the_other_value_is_an_error() {
        let e = set(&[("PreferSameTrafficDistribution", false)]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot set feature gate PreferSameTrafficDistribution to false, feature is locked to true"
        );
        // To its default: accepted, with the GA warning.
        let (g, w) = set(&[("PreferSameTrafficDistribution", true)]).unwrap();
        assert!(g.enabled("PreferSameTrafficDistribution"));
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn several_errors_print_as_an_aggregate() {
        let e = set(&[
            ("MultiCIDRServiceAllocator", false),
            ("PreferSameTrafficDistribution", false),
        ])
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("[cannot set feature gate MultiCIDRServiceAllocator"),
            "{e}"
        );
    }

    #[test]
    fn deprecated_gate_warns_and_applies() {
        let (g, w) = set(&[("KubeProxyIPVS", false)]).unwrap();
        assert!(!g.enabled("KubeProxyIPVS"));
        assert_eq!(
            w,
            ["setting deprecated feature gate KubeProxyIPVS=false: it will be removed in a future release"]
        );
    }

    #[test]
    fn defaults_apply_to_gates_not_set() {
        let g = FeatureGates::default();
        assert!(g.enabled("AllowServiceExternalIPs"));
        assert!(!g.enabled("KubeProxyNFTablesLocalhostNodePorts"));
        assert!(g.enabled("ComponentStatusz"));
        assert!(!g.enabled("NotAGate"));
    }

    #[test]
    fn all_alpha_sets_alpha_gates_not_named() {
        // Alone it fails upstream too: alpha gates depend on GenericWorkload, beta and off.
        let e = set(&[("AllAlpha", true)]).unwrap_err();
        assert!(
            e.to_string()
                .contains("depends on features that are disabled: [GenericWorkload]"),
            "{e}"
        );
        let (g, _) = set(&[
            ("AllAlpha", true),
            ("GenericWorkload", true),
            ("KubeProxyNFTablesLocalhostNodePorts", false),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(!g.enabled("KubeProxyNFTablesLocalhostNodePorts"));
        assert!(g.enabled("AtomicWriteVolumeUserFields"));
        assert!(g.enabled("AllAlpha"));
        // Beta gates keep their default.
        assert!(g.enabled("NFTablesNetlink"));
    }

    #[test]
    fn enabling_a_gate_whose_dependency_is_off_is_an_error() {
        let (name, dep) = GATES
            .iter()
            .find_map(|g| g.depends_on.first().map(|d| (g.name, *d)))
            .unwrap();
        let e = set(&[(name, true), (dep, false)]).unwrap_err();
        assert!(
            e.to_string().starts_with(&format!(
                "{name} is enabled, but depends on features that are disabled: ["
            )),
            "{e}"
        );
    }

    #[test]
    fn metric_values_cover_available_gates_with_upstreams_stage_strings() {
        let m = FeatureGates::default().metric_values();
        assert!(m.contains(&("AllowServiceExternalIPs", "", true)));
        assert!(m.contains(&("KubeProxyIPVS", "DEPRECATED", true)));
        assert!(m.contains(&("KubeProxyNFTablesLocalhostNodePorts", "ALPHA", false)));
        assert!(m.contains(&("AllBeta", "BETA", false)));
    }
}
