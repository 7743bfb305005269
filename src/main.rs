use std::io::IsTerminal;

use clap::Parser;
use settled::config::{Cli, Command, LogFormat, ServeArgs};
use tracing_subscriber::EnvFilter;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Command::Openapi) => {
            print!("{}", settled::http::openapi_yaml());
            return std::process::ExitCode::SUCCESS;
        }
        // No runtime: a health check runs every few seconds for the life of a container.
        Some(Command::Healthcheck(args)) => return settled::healthcheck::run(&args),
        Some(Command::Serve(args)) => *args,
        None => cli.serve,
    };
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(serve(args)),
        Err(e) => {
            eprintln!("settled: cannot start the async runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> std::process::ExitCode {
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
