use std::io::IsTerminal;

use clap::Parser;
use settled::config::{Cli, Command, LogFormat};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Command::Openapi) => {
            print!("{}", settled::http::openapi_yaml());
            return std::process::ExitCode::SUCCESS;
        }
        Some(Command::Serve(args)) => *args,
        None => cli.serve,
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal: escape codes in a file or a
    // log shipper's pipe are noise (NO_COLOR is honoured as well).
    let colour = std::io::stdout().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour);
    match args.log_format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.init(),
    }
    match settled::server::run(&args, settled::server::shutdown_signal()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Once, on stderr: logging it as well printed it twice at a terminal.
            eprintln!("settled: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
