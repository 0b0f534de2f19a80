//! `tcpx-rxdm`: the command line (see `cli`), then the daemon (logging,
//! runtime, run, exit code) or one of the subcommands.

use std::process::ExitCode;

use std::io::Write;

use tcpx_rxdm::cli::{self, logging, Invocation};
use tcpx_rxdm::config::flags::Flags;
use tcpx_rxdm::daemon;
use tcpx_rxdm::types::exit::Exit;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let daemon_line = !cli::is_command_line(&args);
    let invocation = match cli::parse(args) {
        Ok(i) => i,
        Err(e) => {
            // clap prints the message naming the flag and the usage of the
            // command it was given to; usage errors exit 2, --help 0.
            let _ = e.print();
            if e.exit_code() != 0 && daemon_line {
                let text = e.to_string();
                let first = text.lines().next().unwrap_or_default();
                failed_status(first.trim_start_matches("error: "), e.exit_code());
            }
            return ExitCode::from(e.exit_code() as u8);
        }
    };
    let flags = match invocation {
        Invocation::Daemon(flags) => flags,
        // The one place a command's end becomes the process's exit status.
        other => return ExitCode::from(subcommand(other).exit_code()),
    };
    if flags.show_version {
        println!("tcpx-rxdm {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    // The channel from a daemon that started this one (SIGUSR2), if any:
    // taken before any thread or child can be started.
    tcpx_rxdm::handover::channel::claim();
    if let Err(e) = logging::init_daemon(&flags) {
        // A configuration error, as a bad --log_level is.
        let _ = writeln!(std::io::stderr(), "tcpx-rxdm: {e}");
        failed_status(&e.to_string(), 2);
        return ExitCode::from(2);
    }
    tcpx_rxdm::endpoint::memory::fix_mmap_threshold();
    // Services start with a soft fd limit of 1024; every client connection is one fd.
    match tcpx_rxdm::endpoint::accept_backoff::raise_nofile_limit() {
        Ok((before, soft, hard)) => tracing::info!(soft_before = before, soft, hard, "RLIMIT_NOFILE"),
        Err(e) => tracing::warn!(error = %e, "could not raise RLIMIT_NOFILE"),
    }
    // Files we create are private unless made otherwise (socket files get --socket_mode).
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));

    let workers = tcpx_rxdm::steering::intake::runtime_workers();
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "tcpx-rxdm: could not start the async runtime: {e}");
            failed_status(&format!("could not start the async runtime: {e}"), 1);
            return ExitCode::from(1);
        }
    };
    match rt.block_on(serve(*flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line per fatal error: the log goes to stderr, i.e. the journal.
            // A filter that hides errors (RUST_LOG=off, a target-only
            // directive) must not make a failed start silent.
            if tracing::enabled!(tracing::Level::ERROR) {
                tracing::error!(error = %e, "tcpx-rxdm stopped");
            } else {
                let _ = writeln!(std::io::stderr(), "tcpx-rxdm: {e}");
            }
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
    let mut shutdown = Box::pin(shutdown);
    // Nothing is touched while waiting for NICs: a signal ends the wait at once, exit 0.
    let loaded = tokio::select! {
        loaded = daemon::load_config_waiting_for_nics(flags) => loaded?,
        why = &mut shutdown => {
            tracing::info!(reason = %why, "stopped while waiting for the NICs; nothing was touched");
            daemon::notify::send(&daemon::notify::status(&format!("stopped while waiting for the NICs: {why}")));
            return Ok(());
        }
    };
    let daemon::Loaded { mut config, dir } = loaded;
    let backends = daemon::select_backends(&mut config)?;
    daemon::run_in(config, backends, shutdown, dir).await
}

/// Runs a subcommand; returns its exit code.
fn subcommand(invocation: Invocation) -> Exit {
    // A short command ends quietly when the reader of its output goes away
    // (`tcpx-rxdm status flows | head -1`), as other command-line tools do:
    // the default SIGPIPE action instead of Rust's "ignore, then panic on
    // EPIPE". Its Unix sockets are written with MSG_NOSIGNAL. The webhook
    // is a server: it writes to TCP peers that may hang up at any moment,
    // so it keeps SIGPIPE ignored and sees EPIPE as an error of that peer.
    if !matches!(invocation, Invocation::InjectServe(_)) {
        // SAFETY: no other thread exists yet and SIG_DFL installs no handler code.
        let _ = unsafe {
            nix::sys::signal::signal(nix::sys::signal::Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl)
        };
    }
    // Logs (from the code the checks share with the daemon) stay quiet unless asked for.
    let quiet_logs = logging::init_quiet;
    match invocation {
        Invocation::Daemon(_) => unreachable!("the daemon is not a subcommand"),
        Invocation::Status { flags, what, json } => {
            quiet_logs();
            tcpx_rxdm::server::status::client_main(&flags, what.as_deref(), json)
        }
        Invocation::Doctor { flags, json } => {
            quiet_logs();
            tcpx_rxdm::doctor::main(&flags, json)
        }
        Invocation::NcclEnv { flags, opts } => {
            quiet_logs();
            tcpx_rxdm::nccl::command::main(&flags, &opts)
        }
        Invocation::Inject(inv) => tcpx_rxdm::inject::command::main(inv),
        Invocation::InjectServe(cfg) => {
            if let Err(e) = logging::init_webhook() {
                let _ = writeln!(std::io::stderr(), "tcpx-rxdm inject serve: {e}");
                return Exit::Usage;
            }
            tcpx_rxdm::inject::serve::main(*cfg)
        }
        Invocation::Upgrade(opts) => tcpx_rxdm::upgrade::main(&opts),
        Invocation::Version => {
            println!("tcpx-rxdm {}", env!("CARGO_PKG_VERSION"));
            Exit::Done
        }
        Invocation::Completions(shell) => {
            cli::write_completions(shell, &mut std::io::stdout());
            Exit::Done
        }
        Invocation::Man { dir } => match cli::write_man(dir.as_deref(), &mut std::io::stdout()) {
            Ok(pages) => {
                for p in pages {
                    println!("{}", p.display());
                }
                Exit::Done
            }
            Err(e) => {
                let dir = dir.map(|d| format!(" {}", d.display())).unwrap_or_default();
                eprintln!("tcpx-rxdm man:{dir}: {e}");
                Exit::Failed
            }
        },
    }
}
