//! The operator tools' flags: `--name=value`, `--name value` and boolean `--name`, as the
//! daemon's pflag-style parser spells them, with one error line naming the flag. Pure.

use std::collections::BTreeMap;

use super::ToolError;

/// One flag a tool takes.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    pub name: &'static str,
    /// Takes a value (`--to 10.96.0.10:53/udp`); otherwise a switch (`--json`).
    pub value: bool,
    pub help: &'static str,
}

/// Parsed flags: values by name, switches as `"true"`.
#[derive(Debug, Clone, Default)]
pub struct Args {
    values: BTreeMap<&'static str, String>,
}

impl Args {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }
    pub fn has(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }
}

/// Parses `args` against `flags`; `--help`/`-h` gives [`ToolError::Help`] with the usage.
pub fn parse(
    tool: &'static str,
    usage: &str,
    flags: &[Flag],
    args: &[String],
) -> Result<Args, ToolError> {
    let usage_err = |msg: String| ToolError::Usage { tool, msg };
    let mut out = Args::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--help" || a == "-h" {
            return Err(ToolError::Help(help(tool, usage, flags)));
        }
        let Some(body) = a.strip_prefix("--") else {
            return Err(usage_err(format!(
                "unexpected argument {a:?} (flags start with --; see {tool} --help)"
            )));
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (body, None),
        };
        let name = name.replace('_', "-");
        let Some(flag) = flags.iter().find(|f| f.name == name) else {
            return Err(usage_err(format!("unknown flag: --{name}")));
        };
        let v = if flag.value {
            match inline {
                Some(v) => v,
                None => it
                    .next()
                    .cloned()
                    .ok_or_else(|| usage_err(format!("flag needs an argument: --{name}")))?,
            }
        } else {
            match inline.as_deref() {
                None | Some("true") => "true".to_string(),
                Some("false") => continue,
                Some(v) => {
                    return Err(usage_err(format!(
                        "invalid argument {v:?} for --{name}: want true or false"
                    )))
                }
            }
        };
        out.values.insert(flag.name, v);
    }
    Ok(out)
}

/// The usage text of a tool.
pub fn help(tool: &str, usage: &str, flags: &[Flag]) -> String {
    let mut s = format!("Usage: kube-nlproxy {tool} {usage}\n\nFlags:\n");
    for f in flags {
        let name = if f.value {
            format!("--{} VALUE", f.name)
        } else {
            format!("--{}", f.name)
        };
        s.push_str(&format!("  {name:<24} {}\n", f.help));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: &[Flag] = &[
        Flag {
            name: "to",
            value: true,
            help: "",
        },
        Flag {
            name: "json",
            value: false,
            help: "",
        },
    ];

    fn p(a: &[&str]) -> Result<Args, ToolError> {
        let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        parse("explain", "", FLAGS, &a)
    }

    #[test]
    fn values_switches_and_their_errors() {
        let a = p(&["--to", "1.2.3.4:80", "--json"]).unwrap();
        assert_eq!(a.get("to"), Some("1.2.3.4:80"));
        assert!(a.has("json"));
        assert_eq!(p(&["--to=x"]).unwrap().get("to"), Some("x"));
        assert!(!p(&["--json=false"]).unwrap().has("json"));
        let e = |a: &[&str]| p(a).unwrap_err().to_string();
        assert_eq!(e(&["--from", "x"]), "explain: unknown flag: --from");
        assert_eq!(e(&["--to"]), "explain: flag needs an argument: --to");
        assert!(e(&["x"]).contains("unexpected argument \"x\""));
        assert!(e(&["--json=maybe"]).contains("--json"));
        assert!(matches!(p(&["--help"]), Err(ToolError::Help(_))));
    }
}
