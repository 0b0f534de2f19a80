//! The shell examples of README.md, deploy/README.md and docs/*.md, run as a
//! reader would run them.
//!
//! Every fenced block names its language in the info string. Shell examples
//! are `sh` or `console`, and the rest of the info string says how they run:
//!
//! - `sh`: the block is one bash script (`set -e`): every command must succeed.
//! - `console`: a `$ ` line is a command (a line ending in `\` goes on), the
//!   lines after it its expected output, stdout and stderr together; `[..]`
//!   in a line stands for any text, a line `...` for any lines. A command may
//!   fail only where the next one reads `$?`.
//! - `sh daemon`: one command that starts a daemon and serves until stopped:
//!   it runs in the background, the page's later blocks run once it logged
//!   its ready line, and after the last one it gets SIGTERM and must exit 0.
//! - `sh skip: REASON` (or `console skip: REASON`): not run, for the reason
//!   given (a cluster, a GPU, root, the network); a `sh` one is still parsed
//!   by `bash -n`.
//!
//! Other languages (`text`, `yaml`, ...) are not run; a block without a
//! language fails the test, so that no example goes unnoticed.
//!
//! The examples run from a scratch folder holding links to the repository's
//! files, with the binary under test first on `PATH` as `tcpx-rxdm`. What
//! they name is mapped onto the test's own, so that they run beside a daemon
//! the reader started: `cargo run [--release] --` runs the binary under test,
//! `/tmp/` is the scratch folder and the HTTP port 9467 a free port (both
//! mapped back in the output), and a daemon without `--metrics_address`
//! serves on that port.
//!
//! `DOCS_SNAPSHOT_UPDATE=1 cargo test --test docs` rewrites the expected
//! output of `console` examples that no longer match, keeping each `[..]` and
//! `...` line that still does.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tcpx_rxdm::daemon::READY_LINE;

const BIN: &str = env!("CARGO_BIN_EXE_tcpx-rxdm");
const REPO: &str = env!("CARGO_MANIFEST_DIR");
const PORT: &str = "9467";
const UPDATE_VAR: &str = "DOCS_SNAPSHOT_UPDATE";

/// How a shell block is run.
#[derive(Clone, PartialEq)]
enum Mode {
    Run,
    Daemon,
    Skip(String),
}

/// A fenced block: its language, mode, first content line (0-based) and lines.
struct Block {
    lang: String,
    mode: Mode,
    start: usize,
    lines: Vec<String>,
}

/// The fenced blocks of a Markdown page; panics on a malformed info string.
fn blocks(page: &str, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (n, line) in text.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (Some(_), Some("")) => out.push(open.take().unwrap()),
            (Some(b), _) => b.lines.push(line.to_string()),
            (None, Some(info)) => {
                let (lang, rest) = info.split_once(' ').unwrap_or((info, ""));
                let rest = rest.trim();
                let mode = match rest.strip_prefix("skip:").map(str::trim) {
                    _ if rest.is_empty() => Mode::Run,
                    _ if rest == "daemon" => Mode::Daemon,
                    Some(reason) if !reason.is_empty() => Mode::Skip(reason.to_string()),
                    _ => panic!(
                        "{page}:{}: info string {info:?}: after the language, only `daemon` or \
                         `skip: REASON` (with the reason)",
                        n + 1
                    ),
                };
                open = Some(Block { lang: lang.to_string(), mode, start: n + 1, lines: Vec::new() });
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "{page}: a fenced block is never closed");
    out
}

/// A `console` block's commands: (command, first expected-output line, expected lines).
fn commands(b: &Block) -> Vec<(String, usize, Vec<String>)> {
    let mut out: Vec<(String, usize, Vec<String>)> = Vec::new();
    let mut lines = b.lines.iter().enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        if let Some(cmd) = line.strip_prefix("$ ") {
            let mut cmd = cmd.to_string();
            let mut last = i;
            while cmd.ends_with('\\') {
                let (j, more) = lines.next().expect("a continued command goes on");
                cmd.push('\n');
                cmd.push_str(more);
                last = j;
            }
            out.push((cmd, b.start + last + 1, Vec::new()));
        } else {
            let (_, _, expected) = out.last_mut().expect("a console block starts with `$ `");
            expected.push(line.to_string());
        }
    }
    out
}

/// Whether `actual` fits `pattern`, where `[..]` stands for any text.
fn line_matches(pattern: &str, actual: &str) -> bool {
    let pieces: Vec<&str> = pattern.split("[..]").collect();
    let [first, middle @ .., last] = pieces.as_slice() else { return pattern == actual };
    let Some(mut rest) = actual.strip_prefix(first) else { return false };
    for piece in middle {
        match rest.find(piece) {
            Some(i) => rest = &rest[i + piece.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Whether `actual` fits `expected`, where a line `...` stands for any lines.
fn lines_match(expected: &[String], actual: &[String]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((dots, rest)) if dots == "..." => (0..=actual.len()).any(|k| lines_match(rest, &actual[k..])),
        Some((first, rest)) => {
            actual.first().is_some_and(|a| line_matches(first, a)) && lines_match(rest, &actual[1..])
        }
    }
}

/// The expected lines refreshed to fit `actual`: lines (wildcards included)
/// that still fit are kept, the others replaced by what was printed. A least-
/// cost alignment: dropping an expected line costs most, so that as many as
/// possible are kept, writing out a printed line costs little, and a `...`
/// takes lines for free.
fn refreshed(expected: &[String], actual: &[String]) -> Vec<String> {
    const DROP: usize = 10;
    const TAKE: usize = 1;
    let (n, m) = (expected.len(), actual.len());
    // cost[i][j]: the cheapest fit of expected[i..] to actual[j..].
    let mut cost = vec![vec![0; m + 1]; n + 1];
    for i in (0..=n).rev() {
        for j in (0..=m).rev() {
            cost[i][j] = if i == n {
                (m - j) * TAKE
            } else {
                let mut c = cost[i + 1][j] + if expected[i] == "..." { 0 } else { DROP };
                if j < m {
                    c = c.min(cost[i][j + 1] + if expected[i] == "..." { 0 } else { TAKE });
                    if expected[i] != "..." && line_matches(&expected[i], &actual[j]) {
                        c = c.min(cost[i + 1][j + 1]);
                    }
                }
                c
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < n || j < m {
        let here = cost[i][j];
        if i < n && expected[i] == "..." {
            if j < m && cost[i][j + 1] == here {
                j += 1;
            } else {
                out.push(expected[i].clone());
                i += 1;
            }
        } else if i < n && j < m && line_matches(&expected[i], &actual[j]) && cost[i + 1][j + 1] == here {
            out.push(expected[i].clone());
            (i, j) = (i + 1, j + 1);
        } else if j < m && cost[i][j + 1] + TAKE == here {
            out.push(actual[j].clone());
            j += 1;
        } else {
            i += 1;
        }
    }
    out
}

/// The lines of `old` and `new` that differ, `-`/`+` and the page's line
/// number (`old` starts on line `from`), with one line of context each side.
fn diff(old: &[String], new: &[String], from: usize) -> String {
    let (n, m) = (old.len(), new.len());
    // common[i][j]: the longest common subsequence of old[i..] and new[j..].
    let mut common = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            common[i][j] = if old[i] == new[j] {
                common[i + 1][j + 1] + 1
            } else {
                common[i + 1][j].max(common[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut lines) = (0, 0, Vec::new());
    while i < n || j < m {
        if i < n && j < m && old[i] == new[j] {
            lines.push((' ', i, &old[i]));
            (i, j) = (i + 1, j + 1);
        } else if j < m && (i == n || common[i][j + 1] > common[i + 1][j]) {
            lines.push(('+', i, &new[j]));
            j += 1;
        } else {
            lines.push(('-', i, &old[i]));
            i += 1;
        }
    }
    let near = |k: usize| lines[k.saturating_sub(1)..(k + 2).min(lines.len())].iter().any(|l| l.0 != ' ');
    (0..lines.len())
        .filter(|&k| near(k))
        .map(|k| format!("{:>5} {} {}", from + lines[k].1, lines[k].0, lines[k].2))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Lines without trailing blanks, and no empty lines at the end.
fn normalised(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text.lines().map(|l| l.trim_end().to_string()).collect();
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
}

/// The scratch folder a page's examples run in, and the names mapped for them.
struct Sandbox {
    dir: tempfile::TempDir,
    port: String,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = tempfile::Builder::new().prefix("docs").tempdir().unwrap();
        for entry in std::fs::read_dir(REPO).unwrap() {
            let name = entry.unwrap().file_name();
            if name != "target" && name != ".git" {
                symlink(Path::new(REPO).join(&name), dir.path().join(&name)).unwrap();
            }
        }
        // A free port, for the daemons the examples start and the requests they send.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
        Sandbox { dir, port }
    }

    /// A command as the examples write it, mapped onto this sandbox.
    fn command(&self, cmd: &str) -> String {
        let cmd = cmd.replace("cargo run --release -- ", "tcpx-rxdm ").replace("cargo run -- ", "tcpx-rxdm ");
        cmd.replace("/tmp/", &format!("{}/", self.dir.path().display())).replace(PORT, &self.port)
    }

    /// Output, mapped back to the names the examples use.
    fn output(&self, out: &str) -> String {
        out.replace(&self.dir.path().display().to_string(), "/tmp")
            .replace(&format!(":{}", self.port), ":9467")
    }

    /// bash running `script` in the sandbox, stdout and stderr in one pipe.
    fn bash(&self, script: &str) -> (Command, std::os::fd::OwnedFd) {
        let (read, write) = nix::unistd::pipe().unwrap();
        let bin_dir = Path::new(BIN).parent().unwrap();
        let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
        let mut cmd = Command::new("bash");
        cmd.arg("-c").arg(script).current_dir(self.dir.path()).env("PATH", path).stdin(Stdio::null());
        cmd.stdout(Stdio::from(write.try_clone().unwrap())).stderr(Stdio::from(write));
        // The examples' output must not depend on the environment the tests run in.
        for (k, _) in std::env::vars() {
            let prefixed = ["NCCL_", "TCPX_", "SLURM_"].iter().any(|p| k.starts_with(p));
            if prefixed || ["HEALTH_CHECK_LOG_FILE", "NOTIFY_SOCKET", "RUST_LOG"].contains(&k.as_str()) {
                cmd.env_remove(k);
            }
        }
        (cmd, read)
    }

    /// Runs `script` to its end (at most a minute); returns (exit code, output).
    fn run(&self, script: &str) -> (i32, String) {
        let (mut cmd, read) = self.bash(script);
        let mut child = cmd.spawn().expect("bash");
        drop(cmd); // the write ends: the pipe ends when the script does
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            std::fs::File::from(read).read_to_end(&mut out).unwrap();
            String::from_utf8_lossy(&out).into_owned()
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("still running after 60 s: {script}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        (status.code().unwrap_or(-1), self.output(&reader.join().unwrap()))
    }
}

/// A daemon an example started, with its output.
struct Background {
    child: Child,
    log: Arc<(Mutex<String>, Condvar)>,
}

impl Background {
    fn start(sandbox: &Sandbox, cmd: &str) -> Background {
        let mut cmd = sandbox.command(cmd);
        if !cmd.contains("--metrics_address") {
            cmd.push_str(&format!(" --metrics_address=127.0.0.1:{}", sandbox.port));
        }
        let (mut command, read) = sandbox.bash(&format!("exec {cmd}"));
        let child = command.spawn().expect("bash");
        drop(command);
        let log = Arc::new((Mutex::new(String::new()), Condvar::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(std::fs::File::from(read)).lines().map_while(Result::ok) {
                let mut text = sink.0.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
                sink.1.notify_all();
            }
        });
        Background { child, log }
    }

    /// Waits until the log holds `needle`; false after `limit`.
    fn wait_for(&self, needle: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut text = self.log.0.lock().unwrap();
        while !text.contains(needle) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { return false };
            text = self.log.1.wait_timeout(text, left).unwrap().0;
        }
        true
    }

    fn log(&self) -> String {
        self.log.0.lock().unwrap().clone()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a page's examples came to.
#[derive(Default)]
struct Tally {
    blocks_run: usize,
    commands_run: usize,
    skipped: usize,
}

/// Runs the shell examples of `page` (relative to the repository) in order.
fn run_page(page: &str) -> Tally {
    let path = Path::new(REPO).join(page);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{page}: {e}"));
    let sandbox = Sandbox::new();
    let mut daemons: Vec<(String, Background)> = Vec::new();
    let mut tally = Tally::default();
    let mut updates: Vec<(usize, usize, Vec<String>)> = Vec::new();
    let mut failures = Vec::new();
    for b in blocks(page, &text).into_iter().filter(|b| b.lang == "sh" || b.lang == "console") {
        let at = format!("{page}:{}", b.start);
        match (&b.mode, b.lang.as_str()) {
            (Mode::Skip(_), "sh") => {
                let (code, out) =
                    sandbox.run(&format!("bash -n <<'DOCS_EXAMPLE'\n{}\nDOCS_EXAMPLE", b.lines.join("\n")));
                assert_eq!(code, 0, "{at}: a skipped example that bash cannot parse:\n{out}");
                tally.skipped += 1;
            }
            (Mode::Skip(_), _) => tally.skipped += 1,
            (Mode::Daemon, _) => {
                let lines: Vec<&String> = b.lines.iter().filter(|l| !l.trim().is_empty()).collect();
                assert_eq!(lines.len(), 1, "{at}: a daemon block holds one command");
                let d = Background::start(&sandbox, lines[0]);
                assert!(
                    d.wait_for(READY_LINE, Duration::from_secs(30)),
                    "{at}: `{}` did not log its ready line:\n{}",
                    lines[0],
                    d.log()
                );
                daemons.push((at, d));
                tally.blocks_run += 1;
                tally.commands_run += 1;
            }
            (Mode::Run, "sh") => {
                let (code, out) = sandbox.run(&format!("set -e\n{}", sandbox.command(&b.lines.join("\n"))));
                if code == 127 {
                    failures.push(format!("{at}: needs a program that is not on PATH; install it:\n{out}"));
                } else if code != 0 {
                    failures.push(format!("{at}: exit {code}:\n{out}"));
                }
                tally.blocks_run += 1;
                tally.commands_run +=
                    b.lines.iter().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).count();
            }
            (Mode::Run, _) => {
                let cmds = commands(&b);
                let mut status = 0;
                for (k, (cmd, first, expected)) in cmds.iter().enumerate() {
                    let (code, out) = sandbox.run(&format!("(exit {status}); {}", sandbox.command(cmd)));
                    let actual = normalised(&out);
                    let next_reads_status = cmds.get(k + 1).is_some_and(|(c, _, _)| c.contains("$?"));
                    if code == 127 {
                        failures.push(format!(
                            "{at}: `{cmd}` needs a program that is not on PATH; install it:\n{out}"
                        ));
                    } else if code != 0 && !next_reads_status {
                        failures.push(format!("{at}: `{cmd}` exited {code}:\n{out}"));
                    } else if !lines_match(expected, &actual) {
                        if std::env::var_os(UPDATE_VAR).is_some() {
                            updates.push((*first, expected.len(), refreshed(expected, &actual)));
                        } else {
                            failures.push(format!(
                                "{page}:{}: `{cmd}` printed other output; the page's lines \
                                 (-) against what was printed (+):\n{}\n\
                                 (run with {UPDATE_VAR}=1 to rewrite the page's expected output)",
                                first + 1,
                                diff(expected, &refreshed(expected, &actual), first + 1)
                            ));
                        }
                    }
                    status = code;
                    tally.commands_run += 1;
                }
                tally.blocks_run += 1;
            }
        }
    }
    for (at, mut d) in daemons {
        // A daemon that is gone already is reported by its exit status below.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(d.child.id() as i32),
            nix::sys::signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(st) = d.child.try_wait().unwrap() {
                break st;
            }
            assert!(Instant::now() < deadline, "{at}: the daemon did not stop on SIGTERM:\n{}", d.log());
            std::thread::sleep(Duration::from_millis(20));
        };
        if !status.success() {
            failures.push(format!("{at}: the daemon exited with {status} on SIGTERM:\n{}", d.log()));
        }
    }
    if !updates.is_empty() {
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        for (first, len, new) in updates.into_iter().rev() {
            lines.splice(first..first + len, new);
        }
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        eprintln!("{page}: expected output rewritten");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    eprintln!(
        "{page}: {} examples run ({} commands), {} skipped",
        tally.blocks_run, tally.commands_run, tally.skipped
    );
    tally
}

/// The pages whose examples are run: README.md, deploy/README.md, docs/*.md.
fn pages() -> Vec<String> {
    let mut pages = vec!["README.md".to_string(), "deploy/README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(Path::new(REPO).join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

#[test]
fn every_fenced_block_names_its_language() {
    for page in pages() {
        let text = std::fs::read_to_string(PathBuf::from(REPO).join(&page)).unwrap();
        for b in blocks(&page, &text) {
            assert!(
                !b.lang.is_empty(),
                "{page}:{}: a fenced block without a language (sh, console, text, ...)",
                b.start
            );
            assert!(
                !["bash", "shell", "shell-session"].contains(&b.lang.as_str()),
                "{page}:{}: shell examples are `sh` (commands) or `console` (`$ ` commands and their output)",
                b.start
            );
            if b.lang != "sh" && b.lang != "console" {
                assert!(b.mode == Mode::Run, "{page}:{}: only shell examples are run or skipped", b.start);
            }
        }
    }
}

#[test]
fn readme_examples_run() {
    let t = run_page("README.md");
    assert!(t.blocks_run >= 3, "README.md: only {} examples run", t.blocks_run);
}

#[test]
fn deploy_readme_examples_run() {
    run_page("deploy/README.md");
}

#[test]
fn docs_pages_examples_run() {
    for page in pages().into_iter().filter(|p| p.starts_with("docs/")) {
        run_page(&page);
    }
}

#[test]
fn output_patterns_fit_what_they_should_and_nothing_else() {
    let lines = |s: &str| s.lines().map(str::to_string).collect::<Vec<_>>();
    assert!(line_matches("pid [..]: ready, up [..]", "pid 42: ready, up 2s"));
    assert!(line_matches("[..]", ""));
    assert!(!line_matches("pid [..]: ready", "pid 42: not ready"));
    assert!(!line_matches("a[..]b[..]b", "ab"));
    assert!(lines_match(&lines("a\n...\nz"), &lines("a\nb\nc\nz")));
    assert!(lines_match(&lines("a\n...\nz"), &lines("a\nz")));
    assert!(!lines_match(&lines("a\n...\nz"), &lines("a\nb")));
    assert!(!lines_match(&lines("a\nb"), &lines("a\nb\nc")));
    // A refresh keeps the wildcard lines that still fit and takes the rest as printed.
    let expected = lines("head [..]\n...\nkernel [..]\nverdict: ready");
    let actual = lines("head 1\nx\ny\nkernel 6.1\nnew line\nverdict: NOT ready");
    assert_eq!(
        refreshed(&expected, &actual),
        lines("head [..]\n...\nkernel [..]\nnew line\nverdict: NOT ready")
    );
    assert!(lines_match(&refreshed(&expected, &actual), &actual));
}
