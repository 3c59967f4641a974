//! The kube-nlproxy binary: parse flags, set up logging, run until SIGTERM.

use kube_nlproxy::config::{Command, Config};

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    use kube_nlproxy::tools::{Dispatch, ToolError};
    let (state_tool, flags) = match kube_nlproxy::tools::dispatch(&args) {
        Dispatch::Daemon => (None, args),
        Dispatch::Done(out, tool) => {
            return match out {
                Ok(text) | Err(ToolError::Help(text)) => {
                    print!("{text}");
                    std::process::ExitCode::SUCCESS
                }
                Err(e @ ToolError::Usage { .. }) => {
                    eprintln!("kube-nlproxy {e}");
                    std::process::ExitCode::from(2)
                }
                Err(e) => {
                    eprintln!("kube-nlproxy {tool}: {e}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
        Dispatch::WithState(t, rest) => (Some(t), rest),
    };
    let mut cfg = match Config::from_args(flags) {
        Ok(Command::Run(c)) => *c,
        Ok(Command::Print(text)) => {
            print!("{text}");
            return std::process::ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("kube-nlproxy: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if let Some(path) = &cfg.write_config_to {
        if let Err(e) = std::fs::write(path, cfg.to_yaml()) {
            eprintln!("kube-nlproxy: cannot write {}: {e}", path.display());
            return std::process::ExitCode::FAILURE;
        }
        return std::process::ExitCode::SUCCESS;
    }
    if let Some(t) = state_tool {
        // Read the sources once, change nothing, print the report; only warnings logged.
        cfg.state_tool = Some(t);
        cfg.dry_run = true;
        cfg.log_level = "warn";
    }
    kube_nlproxy::app::logging::init(cfg.json_logs, cfg.log_level);
    kube_nlproxy::proxy::runner::limit_allocator_arenas();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kube-nlproxy: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(kube_nlproxy::app::run(cfg)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if e.is_usage() => {
            eprintln!("kube-nlproxy: {e}");
            std::process::ExitCode::from(2)
        }
        Err(e) => {
            let e = anyhow::Error::from(e);
            tracing::error!("{e:#}");
            eprintln!("kube-nlproxy: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
