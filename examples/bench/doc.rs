//! Rewriting the generated section of docs/PERFORMANCE.md, and the date stamp.

pub const BEGIN: &str = "<!-- bench:begin -->";
pub const END: &str = "<!-- bench:end -->";

/// `doc` with the lines between the `BEGIN` and `END` marker lines replaced by
/// `body`; everything else, the markers included, is kept byte for byte. Each
/// marker must stand alone on its line, once, begin before end.
pub fn replace_section(doc: &str, body: &str) -> Result<String, String> {
    let find = |marker: &str| -> Result<usize, String> {
        let mut at = None;
        let mut pos = 0;
        for line in doc.split_inclusive('\n') {
            if line.trim_end() == marker {
                if at.is_some() {
                    return Err(format!("marker {marker} appears more than once"));
                }
                at = Some(pos);
            }
            pos += line.len();
        }
        at.ok_or_else(|| format!("marker {marker} not found on a line of its own"))
    };
    let (b, e) = (find(BEGIN)?, find(END)?);
    if e < b {
        return Err(format!("{END} comes before {BEGIN}"));
    }
    let after_begin = b + doc[b..].find('\n').map(|i| i + 1).unwrap_or(doc.len() - b);
    let mut out = String::with_capacity(doc.len() + body.len());
    out.push_str(&doc[..after_begin]);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(body);
    if !body.is_empty() && !body.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&doc[e..]);
    Ok(out)
}

/// `YYYY-MM-DD HH:MM UTC` for seconds since the Unix epoch.
pub fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days to civil date (proleptic Gregorian), counting eras of 400 years from 0000-03-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", rem / 3600, rem % 3600 / 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "# Title\n\nintro\n<!-- bench:begin -->\nold 1\nold 2\n<!-- bench:end -->\ntail\n";

    #[test]
    fn replaces_only_between_the_markers() {
        let out = replace_section(DOC, "new table\n").unwrap();
        assert_eq!(out, "# Title\n\nintro\n<!-- bench:begin -->\nnew table\n<!-- bench:end -->\ntail\n");
        // A body without a final newline still leaves the end marker on its own line.
        let out2 = replace_section(DOC, "x").unwrap();
        assert_eq!(out2, "# Title\n\nintro\n<!-- bench:begin -->\nx\n<!-- bench:end -->\ntail\n");
        // Rewriting again with the same body changes nothing.
        assert_eq!(replace_section(&out, "new table\n").unwrap(), out);
        // An empty section can be filled.
        let empty = "<!-- bench:begin -->\n<!-- bench:end -->\n";
        assert_eq!(replace_section(empty, "a\n").unwrap(), "<!-- bench:begin -->\na\n<!-- bench:end -->\n");
    }

    #[test]
    fn refuses_missing_duplicate_or_reversed_markers() {
        let e = replace_section("no markers\n", "x").unwrap_err();
        assert!(e.contains("not found"), "{e}");
        let e = replace_section("<!-- bench:begin -->\n", "x").unwrap_err();
        assert!(e.contains(END), "{e}");
        let dup = format!("{DOC}{BEGIN}\n");
        assert!(replace_section(&dup, "x").unwrap_err().contains("more than once"));
        let rev = "<!-- bench:end -->\nmid\n<!-- bench:begin -->\n";
        assert!(replace_section(rev, "x").unwrap_err().contains("before"));
        // A marker quoted inside a line is not a marker.
        let quoted = "see `<!-- bench:begin -->` here\n<!-- bench:end -->\n";
        assert!(replace_section(quoted, "x").unwrap_err().contains("not found"));
    }

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_stamp(1_795_305_600 + 6 * 3600 + 59 * 60 + 59), "2026-11-22 06:59 UTC");
        assert_eq!(utc_stamp(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(utc_stamp(951_868_800), "2000-03-01 00:00 UTC");
    }
}
