//! A TCPX daemon started from a shell (`bash -c SCRIPT`), as the model
//! recipes start the reference: the script is read, never run, and only in
//! the two forms people write for it:
//!
//! 1. the daemon's command line alone, `exec` before it or not;
//! 2. the daemon in the background (`&`), then a loop that waits for a
//!    file the workload creates when it is done:
//!    `while [ ! -e FILE ]; do sleep 10; echo sleeping; done`.
//!
//! In the loop, `until [ -e FILE ]` does as well, `[[ … ]]` or `test` for
//! `[ … ]`, `-f` for `-e`; its body is any of `sleep N`, `echo WORDS`, `:`
//! and `true`. Words may be quoted; commands end at `;` or a newline;
//! comments and `\`-newline are skipped. Anything else (a pipe, a
//! redirection, `&&`, `$` or a backquote, globbing, another command) makes
//! the script one inject cannot read, and says why.
//!
//! The script comes from a Pod the webhook reviews, so reading it is one
//! pass over at most [`MAX_SCRIPT`] bytes, without recursion.

/// The longest script read, in bytes.
pub const MAX_SCRIPT: usize = 16 * 1024;

/// The shells whose `-c` is read.
const SHELLS: [&str; 4] = ["sh", "bash", "dash", "ash"];

/// What inject reads in a shell script, for messages.
pub const READS: &str = "inject reads a shell script only when it is the daemon's command line \
    alone (exec or not), or the daemon started in the background with `&` followed by a loop that \
    waits for a file (`while [ ! -e FILE ]; do sleep N; done`, an echo allowed)";

/// The daemon's command line read from a script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    /// The shell that runs it (`bash`), as the command names it.
    pub shell: String,
    /// The daemon's command line: its binary, then its words.
    pub argv: Vec<String>,
    /// The file whose creation ended the wait loop (form 2).
    pub wait_file: Option<String>,
}

/// The binary a command word names (`/usr/bin/bash` → `bash`).
fn base(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

/// Whether a command line starts with a shell.
pub fn is_shell(argv: &[String]) -> bool {
    argv.first().is_some_and(|w| SHELLS.contains(&base(w)))
}

/// The script of a command line `SHELL -c SCRIPT`: `None` where the first
/// word is no shell; why not where it is one in another form.
pub fn started(argv: &[String]) -> Option<Result<Script, String>> {
    if !is_shell(argv) {
        return None;
    }
    let shell = base(&argv[0]).to_string();
    Some(match &argv[1..] {
        [c, text] if c == "-c" => read(text).map(|(argv, wait_file)| Script { shell, argv, wait_file }),
        [c, _, more @ ..] if c == "-c" => {
            Err(format!("its script has {} more word(s) after it, which inject does not pass on", more.len()))
        }
        _ => Err(format!("{shell} is not run as `{shell} -c SCRIPT`")),
    })
}

/// A shell token.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Word(String),
    /// `&`: the command before it runs in the background.
    Amp,
    /// `;` or a newline.
    End,
}

/// The words and separators of a script, quotes removed; why not, where it
/// holds what inject does not read.
fn lex(text: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    // Whether the word holds an unquoted glob character.
    let mut glob = false;
    let mut chars = text.chars().peekable();
    let finish = |word: &mut Option<String>, glob: &mut bool, out: &mut Vec<Tok>| -> Result<(), String> {
        if let Some(w) = word.take() {
            if std::mem::take(glob) && !["[", "[[", "]", "]]"].contains(&w.as_str()) {
                return Err(format!("the word {} would be expanded as a pattern", super::show_str(&w)));
            }
            out.push(Tok::Word(w));
        }
        Ok(())
    };
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => finish(&mut word, &mut glob, &mut out)?,
            '\n' | ';' => {
                finish(&mut word, &mut glob, &mut out)?;
                if c == ';' && chars.peek() == Some(&';') {
                    return Err("it holds `;;`".into());
                }
                out.push(Tok::End);
            }
            '&' => {
                finish(&mut word, &mut glob, &mut out)?;
                if chars.peek() == Some(&'&') {
                    return Err("it holds `&&`".into());
                }
                out.push(Tok::Amp);
            }
            '#' if word.is_none() => {
                while chars.peek().is_some_and(|c| *c != '\n') {
                    chars.next();
                }
            }
            '\\' => match chars.next() {
                Some('\n') => {}
                Some(x) => word.get_or_insert_with(String::new).push(x),
                None => return Err("it ends in a backslash".into()),
            },
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(x) => w.push(x),
                        None => return Err("a quote (') is not closed".into()),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some('\n') => {}
                            Some(x @ ('"' | '\\' | '$' | '`')) => w.push(x),
                            Some(x) => {
                                w.push('\\');
                                w.push(x);
                            }
                            None => return Err("a quote (\") is not closed".into()),
                        },
                        Some('$' | '`') => return Err(EXPANSION.into()),
                        Some(x) => w.push(x),
                        None => return Err("a quote (\") is not closed".into()),
                    }
                }
            }
            '$' | '`' => return Err(EXPANSION.into()),
            '|' | '<' | '>' | '(' | ')' | '{' | '}' => {
                return Err(format!("it holds `{c}` (a pipe, a redirection or a group)"))
            }
            '~' if word.is_none() => return Err("a word starts with `~`, which the shell expands".into()),
            '*' | '?' | '[' | ']' => {
                glob = true;
                word.get_or_insert_with(String::new).push(c);
            }
            _ => word.get_or_insert_with(String::new).push(c),
        }
    }
    finish(&mut word, &mut glob, &mut out)?;
    Ok(out)
}

const EXPANSION: &str =
    "it holds `$` or a backquote (a variable or a command's output, which inject cannot know)";

/// One simple command and whether `&` ended it.
struct Command {
    words: Vec<String>,
    background: bool,
}

/// The script's commands, empty ones skipped.
fn commands(toks: Vec<Tok>) -> Result<Vec<Command>, String> {
    let mut out = Vec::new();
    let mut words = Vec::new();
    for t in toks {
        match t {
            Tok::Word(w) => words.push(w),
            Tok::End if words.is_empty() => {}
            Tok::Amp if words.is_empty() => return Err("a `&` follows no command".into()),
            end => out.push(Command { words: std::mem::take(&mut words), background: end == Tok::Amp }),
        }
    }
    if !words.is_empty() {
        out.push(Command { words, background: false });
    }
    Ok(out)
}

/// The daemon's command line, checked to start with a daemon binary.
fn daemon(words: Vec<String>) -> Result<Vec<String>, String> {
    match words.first().map(|w| base(w)) {
        Some("tcpgpudmarxd" | "tcpx-rxdm") => Ok(words),
        Some(w) => Err(format!(
            "its first command is {}, not the daemon (tcpgpudmarxd or tcpx-rxdm)",
            super::show_str(w)
        )),
        None => Err("it is empty".into()),
    }
}

/// The file a loop's condition tests: `[ ! -e F ]` (`while`) or `[ -e F ]`
/// (`until`), with `[[ ]]` or `test`, `-e` or `-f`.
fn tested(words: &[String]) -> Option<&str> {
    let (keyword, cond) = words.split_first()?;
    let cond: Vec<&str> = cond.iter().map(String::as_str).collect();
    let cond = match cond[..] {
        ["[", ref inner @ .., "]"] | ["[[", ref inner @ .., "]]"] | ["test", ref inner @ ..] => {
            inner.to_vec()
        }
        _ => return None,
    };
    match (keyword.as_str(), &cond[..]) {
        ("while", ["!", "-e" | "-f", file]) | ("until", ["-e" | "-f", file]) => Some(*file),
        _ => None,
    }
}

/// Whether a loop body command is one that only waits or prints.
fn idle(words: &[String]) -> bool {
    let number = |n: &str| {
        let n = n.strip_suffix(['s', 'm', 'h', 'd']).unwrap_or(n);
        !n.is_empty() && n.len() <= 12 && n.chars().all(|c| c.is_ascii_digit() || c == '.')
    };
    match words {
        [w] => [":", "true"].contains(&w.as_str()),
        [w, n] if w == "sleep" => number(n),
        [w, ..] => w == "echo",
        [] => false,
    }
}

/// The daemon's command line and the file the script waits for (form 2).
fn read(text: &str) -> Result<(Vec<String>, Option<String>), String> {
    if text.len() > MAX_SCRIPT {
        return Err(format!("it is longer than {MAX_SCRIPT} bytes"));
    }
    let mut cmds = commands(lex(text)?)?.into_iter();
    let Some(first) = cmds.next() else { return Err("it is empty".into()) };
    let Some(next) = cmds.next() else {
        if first.background {
            return Err("it only starts the daemon in the background and ends".into());
        }
        let mut words = first.words;
        if words.first().is_some_and(|w| w == "exec") {
            words.remove(0);
        }
        return Ok((daemon(words)?, None));
    };
    let loop_form = "after the daemon it holds no `while [ ! -e FILE ]; do …; done` loop";
    if !first.background {
        daemon(first.words)?;
        return Err("the daemon runs in the foreground, and more follows it".into());
    }
    let argv = daemon(first.words)?;
    let file = tested(&next.words).ok_or(loop_form)?;
    if next.background {
        return Err(loop_form.into());
    }
    if !file.starts_with('/') || file.split('/').any(|p| p == "." || p == "..") {
        return Err(format!(
            "the file it waits for, {}, is not an absolute path without `.` or `..`",
            super::show_str(file)
        ));
    }
    let file = file.to_string();
    let mut body = 0;
    let mut done = false;
    for (i, c) in cmds.enumerate() {
        let mut words = &c.words[..];
        if i == 0 {
            match words.split_first() {
                Some((w, rest)) if w == "do" => words = rest,
                _ => return Err(loop_form.into()),
            }
        }
        if done {
            return Err("more follows the loop".into());
        }
        if c.background {
            return Err("its loop starts a command in the background".into());
        }
        match words {
            [] => {}
            [w] if w == "done" => done = true,
            w if idle(w) => body += 1,
            w => {
                return Err(format!(
                    "its loop runs {}, where inject reads only sleep, echo, : and true",
                    super::show_str(&w.join(" "))
                ))
            }
        }
    }
    if !done {
        return Err(loop_form.into());
    }
    if body == 0 {
        return Err("its loop does nothing".into());
    }
    Ok((argv, Some(file)))
}

#[cfg(test)]
mod tests;
