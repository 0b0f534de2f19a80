//! The command line as a person meets it, through the real binary: one
//! tree of commands, a page of help per command, `help CMD`, `--version`,
//! suggestions for a mistyped command or flag with the usage of the command
//! it was given to, completions and a man page, and errors that name the
//! real cause.

mod common;

use common::run_bin;

/// Every command the tree has (besides `help`), as the help lists them.
fn commands() -> Vec<String> {
    tcpx_rxdm::cli::command().get_subcommands().map(|c| c.get_name().to_string()).collect()
}

/// The daemon flags no subcommand reads: their presence on a subcommand's
/// page would mean the daemon's whole list is there.
const DAEMON_ONLY: [&str; 4] =
    ["--client_idle_timeout", "--max_http_connections", "--takeover_timeout", "--sim_fault"];

#[test]
fn help_lists_every_command_one_line_each_before_the_daemon_flags() {
    let want = ["status", "doctor", "nccl-env", "inject", "upgrade", "completions", "man", "version"];
    assert!(want.iter().all(|w| commands().iter().any(|c| c == w)), "{:?}", commands());
    for args in [&["--help"][..], &["-h"], &["help"]] {
        let (code, out, err) = run_bin(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let commands_at = out.find("Commands:").unwrap_or_else(|| panic!("{args:?}: no Commands:\n{out}"));
        let flags_at = out.find("Daemon flags:").expect("a heading for the daemon's flags");
        assert!(commands_at < flags_at, "the commands come first:\n{out}");
        let listed: Vec<&str> =
            out[commands_at..flags_at].lines().skip(1).filter(|l| !l.trim().is_empty()).collect();
        for c in commands().iter().chain(std::iter::once(&"help".to_string())) {
            let line = listed.iter().find(|l| l.split_whitespace().next() == Some(c.as_str()));
            let line = line.unwrap_or_else(|| panic!("{args:?}: {c} not listed:\n{out}"));
            assert!(line.split_whitespace().count() > 2, "{c} has no one-line summary: {line}");
        }
        assert!(out.contains("--gpu_nic_preset") && out.contains("--tenant_isolation"), "{args:?}");
    }
}

#[test]
fn each_command_has_a_page_of_its_own() {
    let own: [(&[&str], &[&str]); 7] = [
        (&["status"], &["--format", "--uds_path", "flows", "mine"]),
        (&["doctor"], &["--format", "--gpu_nic_preset", "--sysfs_root", "--tenant_isolation"]),
        (&["nccl-env"], &["--format", "--check", "--env-file", "--machine", "--gpu_nic_preset"]),
        (&["inject"], &["--filename", "--mode", "--nccl", "--image", "--require-gpu", "serve"]),
        (&["inject", "serve"], &["--on-error", "--listen", "--tls-cert", "--mode"]),
        (&["upgrade"], &["--uds_path", "--timeout"]),
        (&["completions"], &["bash", "zsh", "fish"]),
    ];
    for (cmd, flags) in own {
        let mut args = cmd.to_vec();
        args.push("--help");
        let (code, out, err) = run_bin(&args);
        assert_eq!(code, 0, "{cmd:?}: {err}");
        let usage = format!("Usage: tcpx-rxdm {}", cmd.join(" "));
        assert!(out.contains(&usage), "{cmd:?}: no {usage:?}:\n{out}");
        for f in flags {
            assert!(out.contains(f), "{cmd:?} --help does not show {f}:\n{out}");
        }
        for f in DAEMON_ONLY {
            assert!(!out.contains(f), "{cmd:?} --help shows the daemon's {f}:\n{out}");
        }
        // `help CMD` is the same page.
        let mut help = vec!["help"];
        help.extend(cmd);
        let (code, same, _) = run_bin(&help);
        assert_eq!((code, same.as_str()), (0, out.as_str()), "help {cmd:?}");
    }
}

#[test]
fn version_in_every_form() {
    let want = format!("tcpx-rxdm {}\n", env!("CARGO_PKG_VERSION"));
    for flag in ["--version", "-V", "--show_version", "-show_version"] {
        let (code, out, err) = run_bin(&[flag]);
        assert_eq!((code, out.as_str()), (0, want.as_str()), "{flag}: {err}");
    }
}

#[test]
fn a_mistyped_command_or_flag_exits_2_with_a_suggestion_and_its_commands_usage() {
    let (code, out, err) = run_bin(&["stauts"]);
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty());
    assert!(err.contains("'stauts'") && err.contains("a similar subcommand exists: 'status'"), "{err}");

    for (args, suggestion, usage) in [
        (&["status", "--jsn"][..], "--json", "Usage: tcpx-rxdm status"),
        (&["nccl-env", "--chekc"], "--check", "Usage: tcpx-rxdm nccl-env"),
        (&["inject", "serve", "--on-eror=allow"], "--on-error", "Usage: tcpx-rxdm inject serve"),
        (&["--uds_pth=/tmp/x"], "--uds_path", "Usage: tcpx-rxdm [DAEMON FLAGS]"),
    ] {
        let (code, _, err) = run_bin(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(&format!("a similar argument exists: '{suggestion}")), "{args:?}: {err}");
        assert!(err.contains(usage), "{args:?}: {err}");
        if !args[0].starts_with('-') {
            assert!(!err.contains("[DAEMON FLAGS]\n       tcpx-rxdm <COMMAND>"), "the daemon's usage: {err}");
        }
    }
}

#[test]
fn completions_for_each_shell_name_the_commands() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = run_bin(&["completions", shell]);
        assert_eq!(code, 0, "{shell}: {err}");
        for c in commands() {
            assert!(out.contains(&c), "{shell}: {c} missing");
        }
        assert!(out.contains("gpu_nic_preset") && out.contains("on-error"), "{shell}: flags missing");
    }
    let (code, _, err) = run_bin(&["completions", "tcsh"]);
    assert_eq!(code, 2);
    assert!(err.contains("possible values") && err.contains("bash"), "{err}");
}

/// What bash's completion offers for the last of `words` (the script as
/// installed, its function found with `complete -p`, called as bash calls it).
fn bash_completes(script: &std::path::Path, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        "source '{}'\n\
         f=$(complete -p tcpx-rxdm | sed -n 's/.* -F \\([^ ]*\\) .*/\\1/p')\n\
         [ -n \"$f\" ] || {{ echo 'no completion function for tcpx-rxdm' >&2; exit 3; }}\n\
         COMP_WORDS=({})\nCOMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))\n\
         \"$f\" tcpx-rxdm \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        quoted.join(" ")
    );
    let out = std::process::Command::new("bash").args(["--norc", "--noprofile", "-c", &program]).output();
    let out = out.expect("bash runs (the completion test needs it)");
    assert!(out.status.success(), "{words:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect()
}

#[test]
fn bash_completes_the_options_of_each_command() {
    let (code, script, _) = run_bin(&["completions", "bash"]);
    assert_eq!(code, 0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tcpx-rxdm");
    std::fs::write(&path, script).unwrap();
    for (words, want) in [
        (&["tcpx-rxdm", "st"][..], "status"),
        (&["tcpx-rxdm", "--uds"], "--uds_path"),
        (&["tcpx-rxdm", "inject", "--im"], "--image"),
        (&["tcpx-rxdm", "inject", "serve", "--on"], "--on-error"),
        (&["tcpx-rxdm", "nccl-env", "--for"], "--format"),
        (&["tcpx-rxdm", "status", "--fo"], "--format"),
        (&["tcpx-rxdm", "doctor", "--gpu_nic"], "--gpu_nic_preset"),
        (&["tcpx-rxdm", "upgrade", "--ti"], "--timeout"),
        (&["tcpx-rxdm", "completions", "ba"], "bash"),
    ] {
        let offered = bash_completes(&path, words);
        assert!(offered.iter().any(|o| o == want), "{words:?}: offered {offered:?}, not {want}");
    }
}

/// The bash completion script, installed in a temporary folder.
fn bash_script() -> (tempfile::TempDir, std::path::PathBuf) {
    let (code, script, _) = run_bin(&["completions", "bash"]);
    assert_eq!(code, 0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tcpx-rxdm");
    std::fs::write(&path, script).unwrap();
    (dir, path)
}

#[test]
fn bash_offers_each_command_only_the_flags_it_takes() {
    let (_dir, path) = bash_script();
    // status reads --uds_path alone of the daemon's flags; doctor reads the ones it checks.
    let status = bash_completes(&path, &["tcpx-rxdm", "status", "--"]);
    assert!(status.iter().any(|o| o == "--uds_path") && status.iter().any(|o| o == "--format"), "{status:?}");
    for daemon_only in ["--gpu_nic_preset", "--leases", "--log_level"] {
        assert!(!status.iter().any(|o| o == daemon_only), "status offers {daemon_only}: {status:?}");
    }
    let doctor = bash_completes(&path, &["tcpx-rxdm", "doctor", "--"]);
    assert!(doctor.iter().any(|o| o == "--tenant_isolation"), "{doctor:?}");
    assert!(!doctor.iter().any(|o| o == "--node_wide" || o == "--log_level"), "{doctor:?}");
    // inject passes daemon flags on, but none it refuses.
    for words in [&["tcpx-rxdm", "inject", "--"][..], &["tcpx-rxdm", "inject", "serve", "--"]] {
        let inject = bash_completes(&path, words);
        assert!(inject.iter().any(|o| o == "--rx_pool_size"), "{inject:?}");
        for refused in
            ["--node_wide", "--takeover", "--takeover_timeout", "--after_handover", "--show_version"]
        {
            assert!(!inject.iter().any(|o| o == refused), "{words:?} offers {refused}: {inject:?}");
        }
    }
}

#[test]
fn bash_offers_the_preset_names_and_files_after_gpu_nic_preset() {
    let (dir, path) = bash_script();
    // A preset file's path completes as well.
    std::fs::write(dir.path().join("mine.textproto"), "").unwrap();
    let file_prefix = format!("{}/mi", dir.path().display());
    for cmd in [&["tcpx-rxdm"][..], &["tcpx-rxdm", "doctor"], &["tcpx-rxdm", "inject"]] {
        let mut words = cmd.to_vec();
        words.extend(["--gpu_nic_preset", "a"]);
        let offered = bash_completes(&path, &words);
        assert_eq!(offered, ["auto", "a3vm", "a3vm4gpu4nic", "a6"], "{words:?}");
        words.pop();
        words.push(&file_prefix);
        let offered = bash_completes(&path, &words);
        let want = dir.path().join("mine.textproto").display().to_string();
        assert_eq!(offered, [want], "{words:?}");
    }
}

#[test]
fn help_of_help_exits_0_with_its_page() {
    for args in [&["help", "--help"][..], &["help", "-h"]] {
        let (code, out, err) = run_bin(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(out.contains("Usage: tcpx-rxdm help [COMMAND]"), "{out}");
        assert!(err.is_empty(), "{err}");
    }
}

#[test]
fn the_man_pages_come_from_the_same_definitions() {
    let (code, out, _) = run_bin(&["man"]);
    assert_eq!(code, 0);
    assert!(out.starts_with(".ie") && out.contains(".TH tcpx-rxdm 1"), "{out}");
    assert!(out.contains(".SH \"EXIT STATUS\"") && out.contains(".SH \"SIGNALS\""), "{out}");
    // A folder not there yet is made, as `install -D` would.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("share/man/man1");
    let (code, out, err) = run_bin(&["man", &format!("--dir={}", dir.display())]);
    assert_eq!(code, 0, "{err}");
    for c in commands() {
        let page = dir.join(format!("tcpx-rxdm-{c}.1"));
        assert!(page.is_file() && out.contains(&page.display().to_string()), "{c}: {out}");
        // The exit status is a section of its own, not clap's catch-all EXTRA.
        let text = std::fs::read_to_string(&page).unwrap();
        assert!(!text.contains(".SH EXTRA"), "{c}: {text}");
        let has_status = tcpx_rxdm::cli::command()
            .find_subcommand(&c)
            .and_then(|s| s.get_after_help().map(|h| h.to_string().contains("Exit status:")))
            .unwrap_or(false);
        assert_eq!(text.contains(".SH \"EXIT STATUS\"\n.TP\n\\fB0\\fR"), has_status, "{c}: {text}");
    }
    // Every page another page points to was written; on stdout too.
    let (_, top, _) = run_bin(&["man"]);
    let pages: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .chain(std::iter::once(top))
        .collect();
    for page in &pages {
        for named in page.split_whitespace().filter(|w| w.starts_with("tcpx") && w.ends_with("(1)")) {
            let file = named.trim_end_matches("(1)").replace("\\-", "-");
            assert!(dir.join(format!("{file}.1")).is_file(), "{named} is named but no page was written");
        }
    }
}

#[test]
fn errors_name_the_real_cause() {
    // A preset that looks like a path and is not there: no such file, not "unknown preset".
    for value in ["./nope.textproto", "nope.textproto", "/etc/tcpx/nope"] {
        let (code, _, err) = run_bin(&["--gpu_nic_preset", value, "--metrics_address="]);
        assert_eq!(code, 2, "{value}: {err}");
        assert!(err.contains("--gpu_nic_preset") && err.contains(&format!("no such file {value}")), "{err}");
        assert!(!err.contains("unknown preset"), "{err}");
        // The same on a subcommand that reads the flag.
        let (code, _, err) = run_bin(&["nccl-env", "--gpu_nic_preset", value]);
        assert_eq!(code, 2, "{value}: {err}");
        assert!(err.contains("no such file") && !err.contains("Usage: tcpx-rxdm [DAEMON FLAGS]"), "{err}");
    }
    let (code, _, err) = run_bin(&["--gpu_nic_preset=a3"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown preset") && err.contains("a3vm"), "{err}");
    let (code, _, err) = run_bin(&["--gpu_nic_preset=/tmp"]);
    assert_eq!(code, 2);
    assert!(err.contains("/tmp is a folder"), "{err}");
    // A bad value exits 2 naming the flag.
    for (flag, why) in
        [("--uds_path=", "empty"), ("--socket_mode=rw", "octal"), ("--takeover=maybe", "possible values")]
    {
        let (code, _, err) = run_bin(&[flag]);
        assert_eq!(code, 2, "{flag}: {err}");
        let name = flag.split('=').next().unwrap();
        assert!(err.contains(name) && err.contains(why), "{flag}: {err}");
    }
}

#[test]
fn options_before_a_command_are_the_commands_as_with_kubectl() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("nobody-here");
    let flag = format!("--uds_path={}", uds.display());
    let (code, _, err) = run_bin(&[&flag, "status"]);
    assert_eq!(code, 1, "asked the folder given before the command: {err}");
    assert!(err.contains(&format!("no daemon answers at {}", uds.display())), "{err}");
    let (same, _, err_after) = run_bin(&["status", &flag]);
    assert_eq!((same, err_after), (code, err));
    // The value in the next word, and an option the command does not take.
    let (code, _, err) = run_bin(&["--uds_path", uds.to_str().unwrap(), "status", "--json"]);
    assert!(code == 1 && err.contains("no daemon answers"), "{err}");
    let (code, _, err) = run_bin(&["--metrics_address=:1", "upgrade"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--metrics_address") && err.contains("Usage: tcpx-rxdm upgrade"), "{err}");
}

#[test]
fn version_as_a_command_too() {
    let (code, out, err) = run_bin(&["version"]);
    assert_eq!(
        (code, out.as_str()),
        (0, format!("tcpx-rxdm {}\n", env!("CARGO_PKG_VERSION")).as_str()),
        "{err}"
    );
}

#[test]
fn reference_flags_we_do_not_take_name_what_to_do_instead() {
    for (name, instead) in tcpx_rxdm::config::retired::RETIRED {
        // (`-helpfull` is `-h` and more letters: the help itself.)
        let single = (!name.starts_with('h')).then(|| format!("-{name}=1"));
        for typed in std::iter::once(format!("--{name}")).chain(single) {
            let (code, _, err) = run_bin(&[&typed]);
            assert_eq!(code, 2, "{typed}: {err}");
            assert!(err.contains(&format!("--{name} is a flag the reference tcpgpudmarxd takes")), "{err}");
            assert!(err.contains(instead), "{typed}: {err}");
        }
    }
    let (code, _, err) = run_bin(&["--enable_quickack"]);
    assert!(code == 2 && err.contains("--setup_param=\"--verbose 128 2 1\""), "{err}");
    // On a command that takes the daemon's flags, with that command's usage.
    let (code, _, err) = run_bin(&["doctor", "--logtostderr"]);
    assert!(code == 2 && err.contains("stderr") && err.contains("Usage: tcpx-rxdm doctor"), "{err}");
}

#[test]
fn log_level_takes_the_levels_listed_and_refuses_others_by_name() {
    for bad in ["verbose", "warn,tcpx_rxdm=debug"] {
        let (code, _, err) = run_bin(&[&format!("--log_level={bad}")]);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains("--log_level") && err.contains("error, warn, info, debug, trace"), "{err}");
    }
    let (code, out, _) = run_bin(&["--log_level=warning", "--show_version"]);
    assert_eq!((code, out.starts_with("tcpx-rxdm ")), (0, true));
}

#[test]
fn a_failed_start_is_printed_whatever_the_log_filter() {
    // A NIC that is not there (a sysfs without it): exit 2 before anything is touched.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("sys/class/net")).unwrap();
    let sysfs = format!("--sysfs_root={}", dir.path().join("sys").display());
    let uds = format!("--uds_path={}", dir.path().join("uds").display());
    let line = ["--gpu_nic_preset=a3vm", "--metrics_address=", &uds, &sysfs];
    for (level, filter) in [
        ("--log_level=error", None),
        ("--log_level=info", Some("off")),
        ("--log_level=info", Some("warning")),
    ] {
        let mut cmd = std::process::Command::new(common::BIN);
        cmd.args(line).arg(level).env_remove("RUST_LOG");
        if let Some(f) = filter {
            cmd.env("RUST_LOG", f);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{level} RUST_LOG={filter:?}: {err}");
        assert!(err.contains("eth1"), "{level} RUST_LOG={filter:?}: the cause is not printed: {err:?}");
    }
}

#[test]
fn the_image_ships_the_completions_and_man_pages() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Dockerfile")).unwrap();
    for (shell, path) in [
        ("bash", "/usr/share/bash-completion/completions/tcpx-rxdm"),
        ("zsh", "/usr/share/zsh/vendor-completions/_tcpx-rxdm"),
        ("fish", "/usr/share/fish/vendor_completions.d/tcpx-rxdm.fish"),
    ] {
        let step = format!("target/release/tcpx-rxdm completions {shell} > /out{path}");
        assert!(text.contains(&step), "the Dockerfile lacks `{step}`");
    }
    assert!(text.contains("target/release/tcpx-rxdm man --dir /out/usr/share/man/man1"));
    // What the build stage lays out under /out is the runtime image's.
    assert!(text.contains("COPY --from=build /out/ /"));
    // The steps are command lines the binary takes.
    for line in [&["completions", "zsh"][..], &["man", "--dir", "/out/usr/share/man/man1"]] {
        let argv = std::iter::once("tcpx-rxdm").chain(line.iter().copied()).map(String::from);
        assert!(tcpx_rxdm::cli::parse(argv).is_ok(), "{line:?}");
    }
}
