use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = ckptfs::cli::Cli::parse();
    // The AWS SDK warns about each credential provider it tries; the command's own
    // error already says why credentials could not be found.
    let default_level = match cli.command {
        ckptfs::cli::Command::Mount(_) => "info,aws_config=error",
        _ => "warn,aws_config=error",
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .init();
    match ckptfs::commands::run(cli) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(code) => ExitCode::from(code as u8),
        Err(err) => {
            // A closed pipe (`ckptfs ls | head`) is not an error worth reporting.
            if err
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            {
                return ExitCode::SUCCESS;
            }
            eprintln!("ckptfs: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
