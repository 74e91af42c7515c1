use std::ffi::OsString;
use std::process::ExitCode;

use clap::FromArgMatches;

use ckptfs::cli::{Cli, Command, LogFormat};

fn main() -> ExitCode {
    let cli = match parse_arguments() {
        Ok(cli) => cli,
        Err(message) => {
            eprintln!("ckptfs: {message}");
            return ExitCode::FAILURE;
        }
    };
    init_logging(&cli);
    ckptfs::commands::say::init(cli.quiet, matches!(cli.log_format, LogFormat::Json));
    match ckptfs::commands::run(cli) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(code) => ExitCode::from(code as u8),
        Err(err) => {
            // A closed pipe (`ckptfs ls | head`) is not an error worth reporting.
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            // One line, whatever names the causes quote.
            let text = format!("{err:#}");
            ckptfs::commands::say::error(&ckptfs::printable::message(&text));
            ExitCode::FAILURE
        }
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == BrokenPipe)
            || cause
                .downcast_ref::<serde_json::Error>()
                .is_some_and(|e| e.io_error_kind() == Some(BrokenPipe))
    })
}

/// The command line, or the `ckptfs mount` that a mount helper's arguments stand for
/// (`mount -t fuse.ckptfs`, `/etc/fstab`).
fn parse_arguments() -> Result<Cli, String> {
    let args: Vec<OsString> = std::env::args_os().collect();
    let command = ckptfs::cli::command();
    let args = {
        let mut names: Vec<&str> = command.get_subcommands().map(|c| c.get_name()).collect();
        names.push("help");
        // What `-o` may say: the flags of `ckptfs mount` and the global ones, as
        // `cache_dir`.
        let mount = command
            .find_subcommand("mount")
            .expect("a mount subcommand");
        let spelled: Vec<(String, bool)> = command
            .get_arguments()
            .chain(mount.get_arguments())
            .filter_map(|arg| {
                let long = arg
                    .get_long()
                    .filter(|l| !matches!(*l, "help" | "version"))?;
                Some((long.replace('-', "_"), arg.get_action().takes_values()))
            })
            .collect();
        let flags: Vec<_> = spelled.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        match ckptfs::mount_helper::translate(&args, &names, &flags) {
            None => args,
            Some(Ok(mount)) => mount,
            Some(Err(message)) => return Err(message),
        }
    };
    let matches = command.get_matches_from(args);
    Ok(Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit()))
}

/// Logs go to stderr: info for the mount daemon and warnings for the other commands,
/// more with -v or -vv, errors only with -q; `RUST_LOG` wins over all of these. The
/// AWS SDK's own chatter about each credential provider it tries stays quiet unless
/// asked for: the command's error says why credentials could not be found.
fn init_logging(cli: &Cli) {
    let base = match (cli.quiet, cli.verbose, &cli.command) {
        (true, _, _) => "error",
        // fuser says "Mounting" and "Unmounting" at info (the daemon says it better),
        // and warns that its own unmount failed after every clean `umount`: the
        // kernel had already detached the mount, which is how the session ended.
        (_, 0, Command::Mount(_)) => "info,aws_config=error,fuser=warn,fuser::session=error",
        (_, 0, _) => "warn,aws_config=error",
        (_, 1, _) => {
            "debug,aws_config=warn,aws=info,hyper=info,hyper_util=info,h2=info,rustls=info"
        }
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(base));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match cli.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_ansi(colour()).init(),
    }
}

/// Colours on a terminal, unless `NO_COLOR` is set to anything (no-color.org).
fn colour() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}
