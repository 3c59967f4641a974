//! The kube-nlproxy binary: parse flags, set up logging, run until SIGTERM.

use kube_nlproxy::config::{Command, Config};

fn main() -> std::process::ExitCode {
    let cfg = match Config::from_args(std::env::args_os().skip(1)) {
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
    // kube-client logs a whole response body at WARN when it cannot decode one; our sources
    // report such failures themselves, in one line.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{},kube_client=error", cfg.log_level))
    });
    // Colours only on a terminal, and never with NO_COLOR set (log collectors keep the
    // escape codes otherwise).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    if cfg.json_logs {
        logs.json().init();
    } else {
        logs.init();
    }
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
