//! `tcpx-rxdm`: argv normalisation, flags, logging, run, exit code.

use std::process::ExitCode;

use tcpx_rxdm::config::flags::{Flags, LogFormat};
use tcpx_rxdm::daemon;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let flags = match Flags::parse_args(std::env::args()) {
        Ok(f) => f,
        Err(e) => {
            // clap prints the message naming the flag; usage errors exit 2, --help 0.
            let _ = e.print();
            return ExitCode::from(e.exit_code() as u8);
        }
    };
    if flags.show_version {
        println!("tcpx-rxdm {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    init_logging(&flags);
    tcpx_rxdm::server::memory::fix_mmap_threshold();
    // Services start with a soft fd limit of 1024; every client connection is one fd.
    match tcpx_rxdm::server::accept_backoff::raise_nofile_limit() {
        Ok((before, soft, hard)) => tracing::info!(soft_before = before, soft, hard, "RLIMIT_NOFILE"),
        Err(e) => tracing::warn!(error = %e, "could not raise RLIMIT_NOFILE"),
    }
    // Files we create are private unless made otherwise (socket files get --socket_mode).
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));

    let workers = std::thread::available_parallelism().map(|n| n.get().min(4)).unwrap_or(2);
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "could not start the async runtime");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(daemon::run(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "tcpx-rxdm stopped");
            eprintln!("tcpx-rxdm: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
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
