//! What the top-level page says after the flags (how the command line is
//! read, the exit status, the signals) and the man pages. The exit status
//! and the signals are written once, here: `--help`, `tcpx-rxdm(1)` and
//! README's tables (checked by `tests/docs_tables.rs`) all show these rows.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Command;

/// How to read the top-level page.
const READING: &str = "\
Without a command, tcpx-rxdm runs the daemon with the daemon flags above (the
reference tcpgpudmarxd's flags, in its absl forms: --flag=V, --flag V, -flag=V,
-flag V; booleans also --flag and --noflag). A flag given again overrides the
earlier value, so words appended to a command line change any flag it already
sets; only --sim_fault and --sim_delay add up.

`tcpx-rxdm help COMMAND` (or `tcpx-rxdm COMMAND --help`) shows a command's page.";

/// The daemon's exit status: the code, and when it is given.
pub const EXIT_STATUS: [(&str, &str); 3] = [
    (
        "0",
        "An orderly shutdown (a signal, the shutdown file, the last client gone), a stop while \
         waiting for the NICs, or a handover to a successor; also `--show_version` and `--help`.",
    ),
    (
        "1",
        "A runtime failure: a failed start (after undoing what it had applied), another daemon on the \
         same `--uds_path` or NIC, a NIC failure (after an orderly restore), a failed takeover, or a \
         second signal forcing the exit.",
    ),
    (
        "2",
        "Bad flags or topology, or the topology's NICs still missing after `--wait_for_nics`: nothing \
         was touched.",
    ),
];

/// The signals the daemon acts on, and what each does.
pub const SIGNALS: [(&str, &str); 4] = [
    (
        "SIGTERM, SIGINT",
        "An orderly shutdown: requests not yet started get `UNAVAILABLE`, the rules are removed, the \
         NICs and host tuning restored, the files removed; exit 0. While `--wait_for_nics` waits, the \
         wait ends at once, exit 0 (nothing was touched yet). A second signal more than a second later \
         forces the exit (1) without finishing the restore.",
    ),
    ("SIGHUP", "As SIGTERM; with `--node_wide` it is logged and ignored."),
    (
        "SIGUSR2",
        "An upgrade: starts the binary at the path the daemon was started from, with the same flags \
         and `--takeover=auto`, over a channel made for it alone; once that one serves, this daemon \
         exits 0 without restoring anything (`tcpx-rxdm upgrade` sends it and waits). A successor that \
         cannot take over is stopped and this daemon serves on.",
    ),
    (
        "SIGUSR1, SIGQUIT",
        "Not handled: the process ends at once (SIGQUIT with a core dump) without restoring the NICs, \
         as with SIGKILL. The NICs keep the primed settings and the rules; the next daemon takes that \
         state as the one to restore.",
    ),
];

/// A list of `(term, text)` for `--help`: the term, then the text indented.
fn help_list(title: &str, rows: &[(&str, &str)]) -> String {
    let mut out = format!("{title}:\n");
    for (term, text) in rows {
        out += &format!("  {term}\n      {text}\n");
    }
    out
}

/// After the flags on `tcpx-rxdm -h`: how to read the command line, and where the rest is.
pub fn after_help() -> String {
    format!("{READING}\n\nThe exit status and the signals the daemon acts on: `tcpx-rxdm --help`.")
}

/// After the flags on `tcpx-rxdm --help`: the same, the exit status and the signals.
pub fn after_long_help() -> String {
    format!("{READING}\n\n{}\n{}", help_list("Exit status", &EXIT_STATUS), help_list("Signals", &SIGNALS))
}

/// Text for roff: backslashes, hyphens and a dot or quote that would start
/// a line escaped.
fn roff_text(s: &str) -> String {
    let lines = s.split('\n').map(|l| {
        let t = l.replace('\\', "\\e").replace('-', "\\-");
        if t.starts_with(['.', '\'']) {
            format!("\\&{t}")
        } else {
            t
        }
    });
    lines.collect::<Vec<_>>().join("\n")
}

/// A man page section of `(term, text)` paragraphs.
fn roff_section(title: &str, rows: &[(&str, &str)]) -> String {
    let mut out = format!(".SH \"{title}\"\n");
    for (term, text) in rows {
        out += &format!(".TP\n\\fB{}\\fR\n{}\n", roff_text(term), roff_text(text));
    }
    out
}

/// The command as the man pages show it: no `help` command (no page of its
/// own is written for it), and only the reading notes after the flags (the
/// exit status and the signals get sections of their own).
fn for_man(cmd: Command) -> Command {
    cmd.disable_help_subcommand(true).after_help(READING).after_long_help(READING)
}

/// A command's text after its options, in paragraphs: the exit status
/// (`Exit status: 0 …; 1 …`) as `(code, meaning)` rows, and the rest.
fn after_options(cmd: &Command) -> (Vec<(String, String)>, Vec<String>) {
    let text = cmd.get_after_long_help().or(cmd.get_after_help()).map(|s| s.to_string()).unwrap_or_default();
    let mut exit = Vec::new();
    let mut rest = Vec::new();
    for para in text.split("\n\n").map(str::trim).filter(|p| !p.is_empty()) {
        match para.strip_prefix("Exit status: ") {
            Some(codes) => exit.extend(exit_rows(codes)),
            None => rest.push(para.to_string()),
        }
    }
    (exit, rest)
}

/// `0 ready; 1 not ready (a; b); 2 bad flags.` as rows: a row starts where
/// `; ` is followed by a code and a space.
fn exit_rows(codes: &str) -> Vec<(String, String)> {
    let mut rows: Vec<String> = Vec::new();
    let mut at = 0;
    for (i, _) in codes.match_indices("; ") {
        let next = &codes[i + 2..];
        if next.split_once(' ').is_some_and(|(code, _)| code.parse::<u8>().is_ok()) {
            rows.push(codes[at..i].to_string());
            at = i + 2;
        }
    }
    rows.push(codes[at..].trim_end_matches('.').to_string());
    rows.iter()
        .map(|r| r.split_once(' ').map(|(c, m)| (c.to_string(), m.to_string())).unwrap_or_default())
        .collect()
}

/// One page: clap's sections, then NOTES (the text after the options), EXIT
/// STATUS (the daemon's on the top page, the command's own on the others),
/// SIGNALS (top page) and the version.
fn render_page(cmd: &Command, top: bool, out: &mut dyn Write) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(cmd.clone());
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(out)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(out)?;
    }
    let (exit, notes) = after_options(cmd);
    if !notes.is_empty() {
        let paras: Vec<String> = notes.iter().map(|p| roff_text(p)).collect();
        out.write_all(format!(".SH NOTES\n{}\n", paras.join("\n.PP\n")).as_bytes())?;
    }
    if top {
        out.write_all(roff_section("EXIT STATUS", &EXIT_STATUS).as_bytes())?;
        out.write_all(roff_section("SIGNALS", &SIGNALS).as_bytes())?;
    } else if !exit.is_empty() {
        let rows: Vec<(&str, &str)> = exit.iter().map(|(c, m)| (c.as_str(), m.as_str())).collect();
        out.write_all(roff_section("EXIT STATUS", &rows).as_bytes())?;
    }
    if cmd.get_version().or(cmd.get_long_version()).is_some() {
        man.render_version_section(out)?;
    }
    Ok(())
}

/// Writes the top-level man page to `out`, or every page into `dir`
/// (created if missing), returning their paths.
pub fn write_man(cmd: Command, dir: Option<&Path>, out: &mut dyn Write) -> std::io::Result<Vec<PathBuf>> {
    let mut cmd = for_man(cmd);
    let Some(dir) = dir else { return render_page(&cmd, true, out).map(|()| Vec::new()) };
    std::fs::create_dir_all(dir)?;
    cmd.build();
    fn write(cmd: &Command, top: bool, dir: &Path) -> std::io::Result<PathBuf> {
        let path = dir.join(clap_mangen::Man::new(cmd.clone()).get_filename());
        let mut file = std::fs::File::create(&path)?;
        render_page(cmd, top, &mut file)?;
        file.flush()?;
        Ok(path)
    }
    fn each(cmd: &Command, dir: &Path, pages: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            pages.push(write(sub, false, dir)?);
            each(sub, dir, pages)?;
        }
        Ok(())
    }
    let mut pages = vec![write(&cmd, true, dir)?];
    each(&cmd, dir, &mut pages)?;
    pages.sort();
    Ok(pages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roff_text_is_escaped() {
        assert_eq!(roff_text("--uds_path"), "\\-\\-uds_path");
        assert_eq!(roff_text(".x \\y"), "\\&.x \\ey");
        assert_eq!(roff_text("a\n'b"), "a\n\\&'b");
    }

    #[test]
    fn a_commands_exit_status_is_a_section_of_rows() {
        let rows = exit_rows(
            "0 upgraded; 1 not upgraded (the old one serves on; its log says why); 2 bad arguments.",
        );
        let codes: Vec<&str> = rows.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(codes, ["0", "1", "2"]);
        assert_eq!(rows[1].1, "not upgraded (the old one serves on; its log says why)");
        assert_eq!(rows[2].1, "bad arguments");
        let cmd = Command::new("x").after_help("Exit status: 0 fine; 2 bad.\n\nSee also y.");
        let mut page = Vec::new();
        render_page(&cmd, false, &mut page).unwrap();
        let page = String::from_utf8(page).unwrap();
        assert!(page.contains(".SH \"EXIT STATUS\"\n.TP\n\\fB0\\fR\nfine\n"), "{page}");
        assert!(page.contains(".SH NOTES\nSee also y."), "{page}");
        assert!(!page.contains("EXTRA"), "{page}");
    }
}
