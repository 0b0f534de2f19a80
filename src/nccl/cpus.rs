//! CPU lists in the kernel's `cpulist` form (`0-51,104-155`), as sysfs prints
//! them and as the plugin's binding variables take them.

use std::collections::BTreeSet;

/// Why a CPU list did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("\"{text}\" is not a CPU list like 8-21,112-125")]
pub struct CpuListError {
    pub text: String,
}

/// Parses `0-3,8,10-11` (blanks around items allowed, empty text = no CPU).
pub fn parse(text: &str) -> Result<BTreeSet<u32>, CpuListError> {
    let bad = || CpuListError { text: text.to_string() };
    let mut out = BTreeSet::new();
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Ok(out);
    }
    for item in trimmed.split(',') {
        let item = item.trim();
        let (a, b) = match item.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (item, item),
        };
        let a: u32 = a.parse().map_err(|_| bad())?;
        let b: u32 = b.parse().map_err(|_| bad())?;
        // A reversed or absurdly long range is a typo, not a request for a million CPUs.
        if a > b || b - a > 65_535 {
            return Err(bad());
        }
        out.extend(a..=b);
    }
    Ok(out)
}

/// Formats CPUs as compact ranges, lowest first: `8-21,112-125`.
pub fn format(cpus: &BTreeSet<u32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = cpus.iter().copied().peekable();
    while let Some(first) = it.next() {
        let mut last = first;
        while it.peek() == Some(&(last + 1)) {
            last += 1;
            it.next();
        }
        out.push(if first == last { first.to_string() } else { format!("{first}-{last}") });
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_the_kernel_form() {
        let set = parse("0-51,104-155\n").unwrap();
        assert_eq!(set.len(), 104);
        assert!(set.contains(&51) && !set.contains(&52) && set.contains(&104));
        assert_eq!(format(&set), "0-51,104-155");
        assert_eq!(format(&parse(" 3, 1-2 ,7").unwrap()), "1-3,7");
        assert_eq!(format(&parse("").unwrap()), "");
    }

    #[test]
    fn refuses_what_is_not_a_list() {
        for bad in ["a", "3-1", "1-", "-1", "1,,2", "0-99999999", "1;2"] {
            assert!(parse(bad).is_err(), "{bad} accepted");
        }
    }
}
