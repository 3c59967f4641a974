//! Property tests: the configuration file (decoded, defaulted, validated and converted)
//! and the duration parser take any input without panicking, and every field takes any value with an error or a result, never a
//! panic. `PROPTEST_CASES=100000 cargo test -p kube-nlproxy --lib config::proptests` runs
//! them longer by hand. Pure.

use proptest::prelude::*;

use super::file::duration;
use super::{flags, Config};

fn parse_file(text: &str, _name: &str) {
    let p = flags::parse(["--hostname-override", "n"]).expect("static flags");
    let _ = Config::from_parsed_with(&p, Some(("kp.yaml".into(), text.as_bytes().to_vec())));
}

const FIELDS: &[&str] = &[
    "bindAddress",
    "clusterCIDR",
    "configSyncPeriod",
    "detectLocalMode",
    "healthzBindAddress",
    "hostnameOverride",
    "metricsBindAddress",
    "mode",
    "nodePortAddresses",
    "oomScoreAdj",
    "conntrack: {maxPerCore",
    "conntrack: {tcpEstablishedTimeout",
    "conntrack: {tcpBeLiberal",
    "ipvs: {syncPeriod",
    "ipvs: {scheduler",
    "ipvs: {excludeCIDRs",
    "ipvs: {strictARP",
    "nftables: {masqueradeBit",
    "nftables: {masqueradeAll",
    "nftables: {syncPeriod",
    "detectLocal: {bridgeInterface",
];

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("null".to_string()),
        Just("true".to_string()),
        Just("''".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|n| n.to_string()),
        "[0-9]{1,25}(ns|us|ms|s|m|h)",
        "[ -~]{0,20}".prop_map(|s| format!("{s:?}")),
        "[0-9a-f:./,]{0,30}".prop_map(|s| format!("'{s}'")),
    ]
}

proptest! {

    #[test]
    fn config_text_never_panics(text in "(apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n)?[ -~\n]{0,300}") {
        parse_file(&text, "kp.yaml");
    }

    #[test]
    fn every_field_takes_any_value(field in proptest::sample::select(FIELDS), v in value()) {
        let close = if field.contains('{') { "}" } else { "" };
        let text = format!("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{field}: {v}{close}\n");
        parse_file(&text, "kp.yaml");
    }

    #[test]
    fn durations_never_panic(s in "[-+]?([0-9.]{0,25}(ns|us|µs|ms|s|m|h|d|x)?){0,4}") {
        if let Ok(ns) = duration::parse(&s) {
            prop_assert_eq!(duration::parse(&duration::format(ns)), Ok(ns));
        }
    }
}
