//! What upstream's `/flagz` page lists, from the parsed command line. Pure.

use std::collections::BTreeMap;

use super::{defaults::FLAG_DEFAULTS, duration, parse_bool, parse_int, split_list, Kind, Parsed};

/// Every flag of upstream's command line with the value it holds (its default unless given: with `--config` the flags still hold their own values,
/// as upstream's flag set does), plus each of our flags that was given. Values are printed
/// as pflag's `String()` prints them.
pub fn values(p: &Parsed) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = FLAG_DEFAULTS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (spec, _) in &p.set {
        let all = p.all(spec.name);
        let last = all.last().copied().unwrap_or_default();
        let v = match spec.kind {
            Kind::Bool => parse_bool(last).unwrap_or(false).to_string(),
            Kind::Int32 | Kind::Level => match parse_int(last) {
                Ok(n) => n.to_string(),
                Err(_) => last.to_string(),
            },
            Kind::Duration => match duration::parse(last) {
                Ok(ns) => duration::format(ns),
                Err(_) => last.to_string(),
            },
            // pflag's stringSlice prints `[a,b]`.
            Kind::StrSlice => format!(
                "[{}]",
                all.iter()
                    .flat_map(|v| split_list(v))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            // cliflag's MapStringBool prints its sorted `k=v` pairs.
            Kind::MapBool => {
                let mut m = BTreeMap::new();
                for kv in all.iter().flat_map(|v| v.split(',')) {
                    if let Some((k, b)) = kv.split_once('=') {
                        m.insert(k.trim(), parse_bool(b.trim()).unwrap_or(false));
                    }
                }
                m.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            }
            Kind::VModule => all.join(","),
            _ => last.to_string(),
        };
        out.insert(spec.name.to_string(), v);
    }
    out
}
