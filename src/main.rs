//! `tcpx-rxdm`: argv normalisation, flags, logging, run, exit code; the
//! `doctor`, `status`, `nccl-env`, `inject` and `upgrade` subcommands (dispatched
//! on the first argument, before the daemon's flags are parsed).

use std::process::ExitCode;

use tcpx_rxdm::config::flags::{Flags, LogFormat};
use tcpx_rxdm::daemon;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|a| a == "inject") {
        if args.get(2).is_some_and(|a| a == "serve") {
            return ExitCode::from(tcpx_rxdm::inject::serve::main(&args[3..]));
        }
        return ExitCode::from(tcpx_rxdm::inject::command::main(&args[2..]));
    }
    if args.get(1).is_some_and(|a| a == "upgrade") {
        return ExitCode::from(tcpx_rxdm::upgrade::main(&args[2..]));
    }
    if let Some(cmd) = args.get(1).filter(|a| ["doctor", "status", "nccl-env"].contains(&a.as_str())).cloned()
    {
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
    /// `nccl-env` only: `--format`, `--check`, `--env-file`.
    format: Option<String>,
    check: bool,
    env_file: Option<String>,
}

/// A boolean option's value in its absl forms (`--x`, `--x=true|1`, `--nox`,
/// `--x=false|0`), if `flag` (without dashes) is option `name`.
fn bool_opt(flag: &str, name: &str) -> Option<Result<bool, String>> {
    if flag == name {
        return Some(Ok(true));
    }
    if flag.strip_prefix("no") == Some(name) {
        return Some(Ok(false));
    }
    match flag.strip_prefix(name)?.strip_prefix('=')? {
        "true" | "1" => Some(Ok(true)),
        "false" | "0" => Some(Ok(false)),
        v => Some(Err(format!("--{name}: invalid value {v:?}"))),
    }
}

/// Takes `--json` (absl forms too), `nccl-env`'s options and positional words
/// out of `args` (program name first); the rest are the daemon's flags.
fn split_sub_args(cmd: &str, args: Vec<String>) -> Result<(SubOpts, Vec<String>), String> {
    let mut opts = SubOpts { json: false, words: Vec::new(), format: None, check: false, env_file: None };
    let mut rest = Vec::new();
    let mut it = args.into_iter();
    rest.extend(it.next());
    let mut value_next = false;
    let nccl = cmd == "nccl-env";
    while let Some(a) = it.next() {
        let flag = a.trim_start_matches('-');
        if value_next {
            value_next = false;
            rest.push(a);
            continue;
        }
        if a.starts_with('-') {
            let (name, inline) = match flag.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (flag, None),
            };
            let mut value = |name: &str| -> Result<String, String> {
                inline.clone().or_else(|| it.next()).ok_or_else(|| format!("--{name} needs a value"))
            };
            match flag {
                f if bool_opt(f, "json").is_some() => opts.json = bool_opt(f, "json").expect("matched")?,
                f if nccl && bool_opt(f, "check").is_some() => {
                    opts.check = bool_opt(f, "check").expect("matched")?
                }
                _ if nccl && name == "format" => opts.format = Some(value("format")?),
                _ if nccl && (name == "env-file" || name == "env_file") => {
                    opts.env_file = Some(value("env-file")?)
                }
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
    let (opts, rest) = match split_sub_args(cmd, args) {
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
            "nccl-env" => println!(
                "Usage: tcpx-rxdm nccl-env [--format=env|json|configmap] [DAEMON FLAGS]\n       tcpx-rxdm \
                 nccl-env --check [--env-file=FILE] [--json] [DAEMON FLAGS]\n\nPrints the NCCL plugin's \
                 settings for this node and the daemon these flags describe, or checks the environment \
                 (or FILE) against them; exit 0 fine, 1 problems found, 2 bad flags. The daemon's flags:\n"
            ),
            _ => println!(
                "Usage: tcpx-rxdm status [flows|mine] [--json] [--uds_path=DIR]\n\nAsks the daemon serving \
                 --uds_path; exit 0 ready, 1 unreachable or not ready, 2 bad arguments. `mine`: ready and \
                 serving from this cgroup (a container's readiness probe across a takeover). The daemon's flags:\n"
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
        "nccl-env" => match nccl_options(opts) {
            Ok(o) => ExitCode::from(tcpx_rxdm::nccl::command::main(&flags, &o)),
            Err(e) => {
                eprintln!("tcpx-rxdm nccl-env: {e}");
                ExitCode::from(2)
            }
        },
        _ => ExitCode::from(tcpx_rxdm::server::status::client_main(&flags, &opts.words, opts.json)),
    }
}

/// `nccl-env`'s options, checked for consistency.
fn nccl_options(opts: SubOpts) -> Result<tcpx_rxdm::nccl::command::Options, String> {
    use tcpx_rxdm::nccl::command::{Format, Options};
    if let Some(w) = opts.words.first() {
        return Err(format!("unexpected argument {w:?}"));
    }
    let format = match opts.format.as_deref() {
        None => Format::Env,
        Some(f) => Format::from_name(f).ok_or_else(|| {
            format!("--format: invalid value {f:?} (expected one of {})", Format::NAMES.join(", "))
        })?,
    };
    if !opts.check && (opts.env_file.is_some() || opts.json) {
        return Err("--env-file and --json go with --check (for JSON output use --format=json)".into());
    }
    if opts.check && opts.format.is_some() {
        return Err("--format does not go with --check (use --json)".into());
    }
    Ok(Options { format, check: opts.check, env_file: opts.env_file.map(Into::into), json: opts.json })
}
