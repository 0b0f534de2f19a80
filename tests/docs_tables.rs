//! The reference parts of the docs, checked against the code they describe:
//! README's flag table against the daemon's `--help` (names and defaults),
//! its metric table against a freshly started daemon's `/metrics` (names,
//! types, labels, label values), docs/MIGRATING.md's flag lists against the
//! same flags, and the capabilities the READMEs promise for the systemd unit
//! against the unit's `CapabilityBoundingSet=`. A failure names the item
//! that is missing or differs, and on which side.

use std::collections::{BTreeMap, BTreeSet};

mod common;
use common::{run_bin, Daemon};

fn read(rel: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text under the heading `title` (any level), up to the next heading of
/// the same or a higher level.
fn section<'a>(doc: &'a str, title: &str) -> &'a str {
    let mut start = None;
    let mut level = 0;
    let mut offset = 0;
    for line in doc.split_inclusive('\n') {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let is_heading = hashes > 0 && line[hashes..].starts_with(' ');
        match start {
            None if is_heading && line[hashes..].trim() == title => {
                start = Some(offset + line.len());
                level = hashes;
            }
            Some(s) if is_heading && hashes <= level => return &doc[s..offset],
            _ => {}
        }
        offset += line.len();
    }
    let s = start.unwrap_or_else(|| panic!("no heading {title:?}"));
    &doc[s..]
}

/// The rows of the first Markdown table in `text`, as cells (header and
/// separator left out). A `|` inside a code span does not split a cell.
fn table_rows(text: &str) -> Vec<Vec<String>> {
    let lines: Vec<&str> =
        text.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')).collect();
    assert!(lines.len() > 2, "no table in:\n{text}");
    lines[2..]
        .iter()
        .map(|line| {
            let mut cells = vec![String::new()];
            let mut in_code = false;
            for c in line.trim().trim_start_matches('|').trim_end_matches('|').chars() {
                match c {
                    '`' => in_code = !in_code,
                    '|' if !in_code => {
                        cells.push(String::new());
                        continue;
                    }
                    _ => {}
                }
                cells.last_mut().unwrap().push(c);
            }
            cells.iter().map(|c| c.trim().to_string()).collect()
        })
        .collect()
}

/// The code spans of `text`, in order.
fn code_spans(text: &str) -> Vec<String> {
    text.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// `--name` of every flag named in `text`'s code spans.
fn flags_in(text: &str) -> Vec<String> {
    code_spans(text)
        .into_iter()
        .filter_map(|s| {
            let name = s.strip_prefix("--")?;
            let name: String = name.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            (!name.is_empty()).then(|| format!("--{name}"))
        })
        .collect()
}

/// The daemon's flags as `tcpx-rxdm --help` lists them, with the default it
/// shows (`None` where it shows none). clap's own `--help` and `--version`
/// are not daemon flags; subcommands (lines without `--`) are skipped.
fn help_flags() -> BTreeMap<String, Option<String>> {
    let (code, out, err) = run_bin(&["--help"]);
    assert_eq!(code, 0, "tcpx-rxdm --help failed:\n{err}");
    let mut flags = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in out.lines() {
        let t = line.trim_start();
        // Option lines are indented 2 (`  -h, --help`) or 6 (`      --name <V>`)
        // spaces, descriptions 10.
        let indent = line.len() - t.len();
        let long = match t.as_bytes() {
            _ if !(2..=6).contains(&indent) => None,
            [b'-', b'-', ..] => Some(&t[2..]),
            [b'-', c, b',', b' ', b'-', b'-', ..] if c.is_ascii_alphanumeric() => Some(&t[6..]),
            _ => None,
        };
        let opt = long
            .map(|l| l.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>());
        if let Some(name) = opt.filter(|n| !n.is_empty()) {
            current = (!["help", "version"].contains(&name.as_str())).then(|| format!("--{name}"));
            if let Some(f) = &current {
                flags.insert(f.clone(), None);
            }
        } else if let (Some(f), Some(d)) = (&current, t.strip_prefix("[default: ")) {
            let d = d.strip_suffix(']').unwrap_or(d);
            let d = d.strip_prefix('"').and_then(|d| d.strip_suffix('"')).unwrap_or(d);
            flags.insert(f.clone(), Some(d.to_string()));
        }
    }
    assert!(flags.len() > 20, "too few flags parsed from --help:\n{out}");
    flags
}

/// What a table cell says the default is: a cell that is one code span is a
/// value, an empty cell none, anything else prose (checked by hand).
#[derive(PartialEq)]
enum Default {
    Value(String),
    None,
    Prose,
}

fn cell_default(cell: &str) -> Default {
    let spans = code_spans(cell);
    match spans.as_slice() {
        [] if cell.is_empty() => Default::None,
        [v] if cell == format!("`{v}`") => Default::Value(v.clone()),
        _ => Default::Prose,
    }
}

#[test]
fn readme_flag_table_matches_help() {
    let help = help_flags();
    let readme = read("README.md");
    let mut table: BTreeMap<String, Default> = BTreeMap::new();
    for row in table_rows(section(&readme, "Flags")) {
        let names = flags_in(&row[0]);
        assert!(!names.is_empty(), "README flag table: a row without a flag: {row:?}");
        for name in names {
            table.insert(name, cell_default(&row[1]));
        }
    }
    let mut problems = Vec::new();
    for (flag, default) in &help {
        match (table.get(flag), default) {
            (None, _) => problems.push(format!("{flag} is in --help but not in README's flag table")),
            (Some(Default::Value(ours)), Some(theirs)) if ours != theirs => {
                problems.push(format!("{flag}: README says default `{ours}`, --help says `{theirs}`"))
            }
            (Some(Default::Value(_)), Some(_)) => {}
            (Some(d), Some(theirs)) => problems.push(format!(
                "{flag}: --help says default `{theirs}`, README's table gives {}",
                if *d == Default::None { "none" } else { "prose, not the value as one code span" }
            )),
            (Some(Default::Value(ours)), None) => {
                problems.push(format!("{flag}: README says default `{ours}`, --help shows none"))
            }
            (Some(_), None) => {}
        }
    }
    for flag in table.keys().filter(|f| !help.contains_key(*f)) {
        problems.push(format!("{flag} is in README's flag table but not a daemon flag in --help"));
    }
    assert!(problems.is_empty(), "README.md, section Flags:\n{}", problems.join("\n"));
}

/// README's table that starts with the header row `header`, as rows of cells.
fn table_after(doc: &str, header: &str) -> Vec<Vec<String>> {
    let at = doc.find(header).unwrap_or_else(|| panic!("no table with header {header:?}"));
    table_rows(&doc[at..])
}

#[test]
fn readme_states_the_exit_status_and_signals_that_help_and_the_man_page_do() {
    use tcpx_rxdm::cli::pages::{EXIT_STATUS, SIGNALS};
    let readme = read("README.md");
    let flags = section(&readme, "Flags");
    for (header, rows) in
        [("| signal | what the daemon does |", &SIGNALS[..]), ("| code | when |", &EXIT_STATUS[..])]
    {
        let want: Vec<Vec<String>> = rows.iter().map(|(a, b)| vec![a.to_string(), b.to_string()]).collect();
        assert_eq!(table_after(flags, header), want, "README.md, section Flags, the table {header}");
    }
    let (code, help, _) = run_bin(&["--help"]);
    let (_, man, _) = run_bin(&["man"]);
    assert_eq!(code, 0);
    for (term, text) in SIGNALS.iter().chain(&EXIT_STATUS) {
        assert!(help.contains(text), "--help lacks {term}: {text}");
        assert!(man.contains(&format!("\\fB{}\\fR", term.replace('-', "\\-"))), "the man page lacks {term}");
    }
    assert!(man.contains(".SH \"EXIT STATUS\"") && man.contains(".SH \"SIGNALS\""), "{man}");
}

#[test]
fn migrating_lists_every_daemon_flag() {
    let help = help_flags();
    let doc = read("docs/MIGRATING.md");
    let flags = section(&doc, "Flags");
    // The reference's flags: the table; flags it does not accept say so.
    let mut listed = BTreeSet::new();
    let mut refused = BTreeSet::new();
    for row in table_rows(flags) {
        for f in flags_in(&row[0]) {
            if row[1].contains("not accepted") {
                refused.insert(f);
            } else {
                listed.insert(f);
            }
        }
    }
    let new_list = flags
        .split("\n\n")
        .find(|p| p.starts_with("New flags"))
        .expect("docs/MIGRATING.md: no paragraph starting `New flags` in section Flags");
    let new: BTreeSet<String> = flags_in(new_list).into_iter().collect();
    let mut problems = Vec::new();
    for f in listed.intersection(&new) {
        problems.push(format!("{f} is both a reference flag and a new one"));
    }
    for f in help.keys() {
        if !listed.contains(f) && !new.contains(f) {
            problems.push(format!("{f} (in --help) is missing from the reference table and the new flags"));
        }
    }
    for f in listed.iter().chain(&new).filter(|f| !help.contains_key(*f)) {
        problems.push(format!("{f} is listed as accepted but is not a daemon flag in --help"));
    }
    for f in refused.iter().filter(|f| help.contains_key(*f)) {
        problems.push(format!("{f} is listed as not accepted but --help has it"));
    }
    // Those the daemon refuses with a way forward (`config::retired`) are the ones listed.
    let retired: BTreeSet<String> =
        tcpx_rxdm::config::retired::RETIRED.iter().map(|(n, _)| format!("--{n}")).collect();
    for f in refused.symmetric_difference(&retired) {
        problems
            .push(format!("{f}: listed as not accepted, or refused with advice (config::retired), not both"));
    }
    assert!(problems.is_empty(), "docs/MIGRATING.md, section Flags:\n{}", problems.join("\n"));
}

/// One row of README's metric table.
struct MetricRow {
    name: String,
    kind: String,
    /// Label name → the values the table lists, `None` where the list is
    /// open (`...`), prose, or absent.
    labels: BTreeMap<String, Option<BTreeSet<String>>>,
}

/// Parses a labels cell: `` `op` (`install`, `uninstall`), `code` (`OK`, ...) ``.
fn labels_cell(cell: &str) -> BTreeMap<String, Option<BTreeSet<String>>> {
    let mut out = BTreeMap::new();
    let mut rest = cell;
    while let Some(i) = rest.find('`') {
        let tail = &rest[i + 1..];
        let end = tail.find('`').expect("closed code span");
        let name = tail[..end].to_string();
        rest = tail[end + 1..].trim_start();
        let mut values = None;
        if let Some(inner) = rest.strip_prefix('(') {
            let close = inner.find(')').expect("closed parenthesis");
            let list = &inner[..close];
            let prose = list.split('`').step_by(2).any(|t| !t.chars().all(|c| c == ',' || c == ' '));
            if !prose && !list.contains("...") {
                values = Some(code_spans(list).into_iter().collect());
            }
            rest = &inner[close + 1..];
        }
        rest = rest.trim_start_matches([',', ' ']);
        out.insert(name, values);
    }
    out
}

fn metric_table() -> Vec<MetricRow> {
    let readme = read("README.md");
    table_rows(section(&readme, "Metrics"))
        .into_iter()
        .map(|row| MetricRow {
            name: code_spans(&row[0]).first().cloned().unwrap_or_else(|| panic!("metric row {row:?}")),
            kind: row[1].clone(),
            labels: labels_cell(&row[2]),
        })
        .collect()
}

/// A scrape: family → its `# TYPE`, and family → label → values seen.
struct Scrape {
    types: BTreeMap<String, String>,
    labels: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

fn scrape(body: &str) -> Scrape {
    let mut types = BTreeMap::new();
    let mut labels: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for line in body.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let (name, kind) = t.split_once(' ').expect("# TYPE name kind");
            types.insert(name.to_string(), kind.to_string());
            labels.entry(name.to_string()).or_default();
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name = line.split(['{', ' ']).next().unwrap();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| types.get(*f).is_some_and(|t| t == "histogram")))
            .unwrap_or(name);
        let seen = labels.entry(family.to_string()).or_default();
        if let Some((_, rest)) = line.split_once('{') {
            let inner = &rest[..rest.rfind('}').expect("closed label set")];
            for pair in inner.split("\",").map(|p| p.trim_end_matches('"')) {
                let (k, v) = pair.split_once("=\"").unwrap_or_else(|| panic!("label pair in {line}"));
                if k != "le" {
                    seen.entry(k.to_string()).or_default().insert(v.to_string());
                }
            }
        }
    }
    Scrape { types, labels }
}

#[test]
fn readme_metric_table_matches_a_scrape() {
    let table = metric_table();
    let d = Daemon::start(&[]);
    let (status, body) = d.http_get("/metrics");
    assert_eq!(status, 200, "{body}");
    let got = scrape(&body);
    let mut problems = Vec::new();
    for row in &table {
        if let Some(prefix) = row.name.strip_suffix('*') {
            if !got.types.keys().any(|f| f.starts_with(prefix)) {
                problems.push(format!("{}: no such family in /metrics", row.name));
            }
            continue;
        }
        let Some(kind) = got.types.get(&row.name) else {
            problems.push(format!("{}: in README's table, not in /metrics", row.name));
            continue;
        };
        if *kind != row.kind {
            problems.push(format!("{}: README says {}, /metrics says {kind}", row.name, row.kind));
        }
        let seen = &got.labels[&row.name];
        for label in seen.keys().filter(|l| !row.labels.contains_key(*l)) {
            problems.push(format!("{}: label `{label}` is in /metrics but not in README's table", row.name));
        }
        for (label, values) in &row.labels {
            let Some(seen_values) = seen.get(label) else {
                problems.push(format!("{}: README names label `{label}`, /metrics has none", row.name));
                continue;
            };
            for v in values.iter().flat_map(|vs| seen_values.difference(vs)) {
                problems.push(format!(
                    "{}: `{label}` takes `{v}` in /metrics, which README's list does not name",
                    row.name
                ));
            }
        }
    }
    for family in got.types.keys() {
        let documented = table.iter().any(|r| match r.name.strip_suffix('*') {
            Some(prefix) => family.starts_with(prefix),
            None => r.name == *family,
        });
        if !documented {
            problems.push(format!("{family}: in /metrics, not in README's metric table"));
        }
    }
    assert!(problems.is_empty(), "README.md, section Metrics:\n{}", problems.join("\n"));
}

/// The `CAP_…` names in `text`.
fn capabilities(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("CAP_") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_uppercase() || c == '_')).unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// The paragraph of `doc` that starts with `start`.
fn paragraph<'a>(doc: &'a str, start: &str) -> &'a str {
    doc.split("\n\n")
        .map(str::trim_start)
        .find(|p| p.starts_with(start))
        .unwrap_or_else(|| panic!("no paragraph starting {start:?}"))
}

#[test]
fn systemd_capabilities_in_the_docs_match_the_unit() {
    let unit = read("deploy/systemd/tcpx-rxdm.service");
    let bounding = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit sets CapabilityBoundingSet=");
    let unit_caps: BTreeSet<String> = bounding.split_whitespace().map(str::to_string).collect();
    assert!(!unit_caps.is_empty(), "empty bounding set");
    let readme = read("README.md");
    let deploy = read("deploy/README.md");
    let hardening = deploy
        .split("\n- ")
        .find(|b| b.starts_with("Hardening:"))
        .expect("deploy/README.md: no `Hardening:` item in the systemd section");
    for (doc, text) in [
        ("README.md, the systemd paragraph", paragraph(&readme, "**systemd**")),
        ("deploy/README.md", hardening),
    ] {
        let said = capabilities(text);
        let list = |s: Vec<&String>| s.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(" ");
        let missing = list(unit_caps.difference(&said).collect());
        let extra = list(said.difference(&unit_caps).collect());
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{doc}: the unit keeps {bounding}; the doc leaves out [{missing}] and names [{extra}], which the unit drops"
        );
    }
}

#[test]
fn the_first_daemon_run_says_every_way_it_ends() {
    let readme = read("README.md");
    let setup = section(&readme, "Set up");
    let block = setup.split("```sh daemon\n").nth(1).expect("a `sh daemon` block in Set up");
    let (command, after) = block.split_once("\n```\n").expect("the block ends");
    let argv = command.trim().strip_prefix("cargo run -- ").expect("the block runs `cargo run --`");
    let words = std::iter::once("tcpx-rxdm").chain(argv.split_whitespace()).map(String::from);
    let flags =
        tcpx_rxdm::config::flags::Flags::parse_args(words).expect("the daemon takes the block's flags");
    let text = after.trim_start().split("\n\n").next().unwrap();
    // Each way this command line ends the daemon is named, and no other.
    assert!(text.contains("Ctrl-C"), "{text}");
    let ends = [
        ("--monitor_shutdown", flags.monitor_shutdown),
        ("--shutdown_file", flags.shutdown_file().is_some()),
        ("--shutdown_when_all_clients_exited", flags.shutdown_when_all_clients_exited),
    ];
    for (flag, on) in ends {
        assert_eq!(text.contains(flag), on, "README, Set up: {flag} is {on} for `{argv}`, yet:\n{text}");
    }
}
