//! Operator subcommands of the same binary, so `kubectl exec ds/kube-nlproxy --
//! /kube-nlproxy explain …` works in the distroless image: `explain` (what the live kernel
//! does to one packet), read-only, over netlink, text or `--json`. [`dispatch`] picks the
//! tool from the first argument; each tool keeps its pure logic apart from its kernel reads.

pub mod args;
pub mod explain;

/// The subcommands, by the first argument (upstream's kube-proxy takes no positional
/// arguments, so none of these can be a flag line of upstream's).
pub const TOOLS: &[(&str, &str)] = &[("explain", "what the live kernel does to one packet")];

/// An operator tool's failure: one line naming the flag or the kernel operation.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("{tool}: {msg}")]
    Usage { tool: &'static str, msg: String },
    /// `--help`: the usage text (printed, exit 0).
    #[error("{0}")]
    Help(String),
    #[error("{op}: {reason}")]
    Kernel { op: String, reason: String },
}

impl ToolError {
    pub fn kernel(op: impl Into<String>, e: impl std::fmt::Display) -> ToolError {
        ToolError::Kernel {
            op: op.into(),
            reason: e.to_string(),
        }
    }
}

/// Runs the tool named by `args[0]`, if it names one: its output and exit code.
pub fn dispatch(args: &[String]) -> Option<(Result<String, ToolError>, &'static str)> {
    let (name, rest) = args.split_first()?;
    let (tool, _) = TOOLS.iter().find(|(t, _)| t == name)?;
    let out = match *tool {
        "explain" => explain::run(rest),
        _ => unreachable!("every tool in TOOLS is dispatched"),
    };
    Some((out, tool))
}
