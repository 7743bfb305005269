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
        Some(Command::Serve(args)) => args,
        None => cli.serve,
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    match args.log_format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.init(),
    }
    match settled::server::run(&args, settled::server::shutdown_signal()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("settled: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
