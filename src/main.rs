//! The kube-nlproxy binary: parse flags, set up logging, run until SIGTERM.

use kube_nlproxy::app::{exec_filter, EXIT_FAILED, EXIT_USAGE};
use kube_nlproxy::config::{Command, Config};

/// glibc's malloc (`tune_glibc_malloc` says how it is set up, release.md why not mimalloc),
/// counted so that the debug log and the soak see the bytes in use.
#[global_allocator]
static ALLOCATOR: kube_nlproxy::allocator::Counted<std::alloc::System> =
    kube_nlproxy::allocator::Counted::new(std::alloc::System);

fn main() -> std::process::ExitCode {
    kube_nlproxy::allocator::tune_glibc_malloc();
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    use kube_nlproxy::tools::{Dispatch, ToolError, EXIT_FINDING, EXIT_TROUBLE};
    let (state_tool, flags) = match kube_nlproxy::tools::dispatch(&args) {
        Dispatch::Daemon => (None, args),
        Dispatch::Done(out, tool) => {
            // As diff(1): 0 nothing found, 1 a finding, 2 trouble.
            return match out {
                Ok(printed) => {
                    print_out(&printed.text);
                    std::process::ExitCode::from(printed.exit_code())
                }
                Err(ToolError::Help(text)) => {
                    print_out(&text);
                    std::process::ExitCode::SUCCESS
                }
                Err(e @ ToolError::Usage { .. }) => {
                    eprintln!("kube-nlproxy {e}");
                    std::process::ExitCode::from(EXIT_TROUBLE)
                }
                Err(e) => {
                    eprintln!("kube-nlproxy {tool}: {e}");
                    std::process::ExitCode::from(EXIT_TROUBLE)
                }
            };
        }
        Dispatch::WithState(t, rest) => (Some(t), rest),
    };
    let mut cfg = match Config::from_args(flags) {
        Ok(Command::Run(c)) => *c,
        Ok(Command::Help) => {
            print_out(&kube_nlproxy::tools::top_level_help());
            return std::process::ExitCode::SUCCESS;
        }
        Ok(Command::Print(text)) => {
            print_out(&text);
            return std::process::ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("kube-nlproxy: {e}");
            return std::process::ExitCode::from(EXIT_USAGE);
        }
    };
    if let Some(path) = &cfg.write_config_to {
        return write_and_exit(path, &cfg.to_yaml());
    }
    if let Some(path) = &cfg.write_seccomp_profile {
        return write_and_exit(path, exec_filter::SECCOMP_PROFILE);
    }
    if let Some(t) = state_tool {
        // Read the sources once, change nothing, print the report; only warnings logged.
        cfg.state_tool = Some(t);
        cfg.dry_run = true;
        cfg.log_level = "warn";
    }
    kube_nlproxy::app::logging::init(cfg.json_logs, cfg.log_level);
    // Before the runtime's threads exist, so that each inherits the filter.
    exec_filter::install(cfg.exec_filter);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kube-nlproxy: cannot start the runtime: {e}");
            return std::process::ExitCode::from(EXIT_FAILED);
        }
    };
    let tool = state_tool.is_some();
    match rt.block_on(kube_nlproxy::app::run(cfg)) {
        Ok(kube_nlproxy::app::Finished::Stopped) => std::process::ExitCode::SUCCESS,
        Ok(kube_nlproxy::app::Finished::DriftReported) => {
            std::process::ExitCode::from(EXIT_FINDING)
        }
        Err(e) if e.is_usage() => {
            eprintln!("kube-nlproxy: {e}");
            std::process::ExitCode::from(EXIT_USAGE)
        }
        Err(e) => {
            let e = anyhow::Error::from(e);
            // The whole cause chain ("a: b: c"), as one field.
            let chain = format!("{e:#}");
            tracing::error!(err = %chain, "command failed");
            eprintln!("kube-nlproxy: {e:#}");
            // status and diff: trouble is 2, as diff(1); the daemon's failure stays 1.
            std::process::ExitCode::from(if tool { EXIT_TROUBLE } else { EXIT_FAILED })
        }
    }
}

/// `--write-config-to` and `--write-seccomp-profile`: write the file, exit 0, or 1 naming it.
fn write_and_exit(path: &std::path::Path, text: &str) -> std::process::ExitCode {
    match std::fs::write(path, text) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kube-nlproxy: cannot write {}: {e}", path.display());
            std::process::ExitCode::from(EXIT_FAILED)
        }
    }
}

/// What the tools and `--help` print. A reader that went away (`| head`) ends the output
/// quietly, as it ends a Go program's by SIGPIPE; `print!` would panic on it instead.
fn print_out(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("kube-nlproxy: cannot write the output: {e}");
        }
    }
}
