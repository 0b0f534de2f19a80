//! `tcpx-rxdm`: argv normalisation, flags, logging, run, exit code; the
//! `doctor` and `status` subcommands (dispatched on the first argument, before
//! the daemon's flags are parsed, and sharing them).

use std::process::ExitCode;

use tcpx_rxdm::config::flags::{Flags, LogFormat};
use tcpx_rxdm::daemon;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().collect();
    if let Some(cmd) = args.get(1).filter(|a| *a == "doctor" || *a == "status").cloned() {
        args.remove(1);
        return subcommand(&cmd, args);
    }
    let flags = match Flags::parse_args(args) {
        Ok(f) => f,
        Err(e) => {
            // clap prints the message naming the flag; usage errors exit 2, --help 0.
            let _ = e.print();
            if e.exit_code() != 0 {
                let text = e.to_string();
                let first = text.lines().next().unwrap_or_default();
                failed_status(first.trim_start_matches("error: "), e.exit_code());
            }
            return ExitCode::from(e.exit_code() as u8);
        }
    };
    if flags.show_version {
        println!("tcpx-rxdm {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    init_logging(&flags);
    tcpx_rxdm::endpoint::memory::fix_mmap_threshold();
    // Services start with a soft fd limit of 1024; every client connection is one fd.
    match tcpx_rxdm::endpoint::accept_backoff::raise_nofile_limit() {
        Ok((before, soft, hard)) => tracing::info!(soft_before = before, soft, hard, "RLIMIT_NOFILE"),
        Err(e) => tracing::warn!(error = %e, "could not raise RLIMIT_NOFILE"),
    }
    // Files we create are private unless made otherwise (socket files get --socket_mode).
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));

    let workers = tcpx_rxdm::steering::intake::worker_threads();
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "could not start the async runtime");
            failed_status(&format!("could not start the async runtime: {e}"), 1);
            return ExitCode::from(1);
        }
    };
    match rt.block_on(serve(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line per fatal error: the log goes to stderr, i.e. the journal.
            tracing::error!(error = %e, "tcpx-rxdm stopped");
            failed_status(&e.to_string(), e.exit_code().into());
            ExitCode::from(e.exit_code())
        }
    }
}

/// Tells the service manager why the process exits with `code`, so that
/// `systemctl status` shows it after a failed start.
fn failed_status(why: &str, code: i32) {
    daemon::notify::send(&daemon::notify::status(&format!("failed (exit {code}): {why}")));
}

/// The one assembly point: the configuration, the real backends and the
/// signals, handed to the daemon.
async fn serve(flags: Flags) -> Result<(), daemon::DaemonError> {
    // Handlers first, so that a signal during startup is kept, not fatal.
    let shutdown = daemon::shutdown_on_signals(flags.node_wide).map_err(daemon::DaemonError::Signals)?;
    let mut config = daemon::load_config_waiting_for_nics(flags).await?;
    let backends = daemon::select_backends(&mut config)?;
    daemon::run(config, backends, shutdown).await
}

fn init_logging(flags: &Flags) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&flags.log_level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr);
    match flags.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Options of the subcommands besides the daemon's flags.
struct SubOpts {
    json: bool,
    /// Positional words (`status flows`).
    words: Vec<String>,
}

/// Takes `--json` (absl forms too) and positional words out of `args`
/// (program name first); the rest are the daemon's flags.
fn split_sub_args(args: Vec<String>) -> Result<(SubOpts, Vec<String>), String> {
    let mut opts = SubOpts { json: false, words: Vec::new() };
    let mut rest = Vec::new();
    let mut it = args.into_iter();
    rest.extend(it.next());
    let mut value_next = false;
    for a in it {
        let flag = a.trim_start_matches('-');
        if value_next {
            value_next = false;
            rest.push(a);
            continue;
        }
        if a.starts_with('-') {
            match flag {
                "json" | "json=true" | "json=1" => opts.json = true,
                "json=false" | "json=0" | "nojson" => opts.json = false,
                f if f.starts_with("json=") => return Err(format!("--json: invalid value {:?}", &f[5..])),
                f => {
                    // A value in the next word for non-boolean flags (`--uds_path /x`).
                    let boolean = tcpx_rxdm::config::flags::BOOL_FLAGS;
                    let name = f.trim_start_matches("no");
                    value_next = !f.contains('=')
                        && !boolean.contains(&f)
                        && !boolean.contains(&name)
                        && f != "help"
                        && f != "h";
                    rest.push(a);
                }
            }
        } else {
            opts.words.push(a);
        }
    }
    Ok((opts, rest))
}

fn subcommand(cmd: &str, args: Vec<String>) -> ExitCode {
    // Like other command-line tools, end quietly when the reader of our
    // output goes away (`tcpx-rxdm status flows | head -1`): the default
    // SIGPIPE action instead of Rust's "ignore, then panic on EPIPE". Unix
    // sockets are written with MSG_NOSIGNAL, so only stdout/stderr are affected.
    // SAFETY: no other thread exists yet and SIG_DFL installs no handler code.
    let _ = unsafe {
        nix::sys::signal::signal(nix::sys::signal::Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl)
    };
    let (opts, rest) = match split_sub_args(args) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("tcpx-rxdm {cmd}: {e}");
            return ExitCode::from(2);
        }
    };
    if rest.iter().skip(1).any(|a| a == "--help" || a == "-h" || a == "-help") {
        match cmd {
            "doctor" => println!(
                "Usage: tcpx-rxdm doctor [--json] [DAEMON FLAGS]\n\nRead-only checks of this node for the \
                 daemon's flags; exit 0 ready, 1 not ready, 2 bad flags. The daemon's flags:\n"
            ),
            _ => println!(
                "Usage: tcpx-rxdm status [flows] [--json] [--uds_path=DIR]\n\nAsks the daemon serving \
                 --uds_path; exit 0 ready, 1 unreachable or not ready, 2 bad arguments. The daemon's flags:\n"
            ),
        }
    }
    let flags = match Flags::parse_args(rest) {
        Ok(f) => f,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(e.exit_code() as u8);
        }
    };
    // Logs (from the code the checks share with the daemon) stay quiet unless asked for.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    match cmd {
        "doctor" => {
            if let Some(w) = opts.words.first() {
                eprintln!("tcpx-rxdm doctor: unexpected argument {w:?}");
                return ExitCode::from(2);
            }
            ExitCode::from(tcpx_rxdm::doctor::main(&flags, opts.json))
        }
        _ => ExitCode::from(tcpx_rxdm::server::status::client_main(&flags, &opts.words, opts.json)),
    }
}
