//! The values of inject's own options, checked as Kubernetes would check
//! them where they land: the daemon's image, and its CPU and memory
//! requests (Kubernetes quantities). Each error says what was expected and,
//! for the usual slips (`1GB`, `2g`), what was meant.

/// A Kubernetes quantity, as the API server parses one: a number (sign,
/// digits, a fraction) and one suffix: binary (`Ki` … `Ei`), decimal (`m`,
/// `k`, `M` … `E`) or an exponent (`e3`, `E-2`). `None`: not one.
pub fn quantity(text: &str) -> Option<f64> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'));
    let (number, suffix) = text.split_at(split.unwrap_or(text.len()));
    let digits = number.strip_prefix(['+', '-']).unwrap_or(number);
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.len() + fraction.len() == 0 || !all_digits(whole) || !all_digits(fraction) {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024.0_f64.powi(2),
        "Gi" => 1024.0_f64.powi(3),
        "Ti" => 1024.0_f64.powi(4),
        "Pi" => 1024.0_f64.powi(5),
        "Ei" => 1024.0_f64.powi(6),
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        exp => {
            let e = exp.strip_prefix(['e', 'E'])?;
            let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            if digits.is_empty() || !all_digits(digits) {
                return None;
            }
            10f64.powi(e.parse().ok()?)
        }
    };
    Some(value * factor).filter(|v| v.is_finite())
}

/// What a slip with units most likely meant: `1GB` → `1Gi or 1G`.
fn meant(text: &str) -> Option<String> {
    let t = text.strip_suffix(['B', 'b']).unwrap_or(text);
    let t = t.strip_suffix('i').unwrap_or(t);
    let (number, unit) = t.split_at(t.find(|c: char| c.is_ascii_alphabetic())?);
    let unit = unit.to_ascii_uppercase();
    if quantity(number).is_none() || !["K", "M", "G", "T", "P", "E"].contains(&unit.as_str()) {
        return None;
    }
    let decimal = if unit == "K" { "k" } else { &unit };
    Some(format!("{number}{unit}i (binary, 1024-based) or {number}{decimal} (decimal)"))
}

/// `--daemon-cpu`: a quantity of cores, not negative.
pub fn cpu(text: &str) -> Result<String, String> {
    match quantity(text) {
        Some(v) if v >= 0.0 => Ok(text.to_string()),
        Some(_) => Err("a request is not negative".into()),
        None => Err("not a Kubernetes quantity of CPU: cores, e.g. 500m (half a core), 1 or 2".into()),
    }
}

/// `--daemon-memory`: a quantity of bytes, not negative.
pub fn memory(text: &str) -> Result<String, String> {
    match (quantity(text), meant(text)) {
        (Some(v), _) if v >= 0.0 => Ok(text.to_string()),
        (Some(_), _) => Err("a request is not negative".into()),
        (None, Some(m)) => Err(format!("not a Kubernetes quantity (bytes take no B); did you mean {m}?")),
        (None, None) => {
            Err("not a Kubernetes quantity of memory: bytes with a unit, e.g. 512Mi or 2Gi".into())
        }
    }
}

/// `--image`: an image reference as a container runtime takes it: not
/// empty, no blanks, a lowercase repository, an optional `:tag` and
/// `@digest`.
pub fn image(text: &str) -> Result<String, String> {
    let example = format!("e.g. REGISTRY/tcpx-rxdm:{}", super::VERSION);
    if text.is_empty() {
        return Err(format!("empty; name the daemon's image as your nodes pull it, {example}"));
    }
    if let Some(c) = text.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("holds {c:?}; an image reference has no blanks, {example}"));
    }
    if text.starts_with('-') {
        return Err(format!("starts with '-' (another option?); {example}"));
    }
    let name = text.split('@').next().unwrap_or_default();
    // A tag follows the last ':' after the last '/' (a registry's port is before it).
    let repo = match name.rfind(':') {
        Some(i) if !name[i..].contains('/') => &name[..i],
        _ => name,
    };
    let path = repo.split_once('/').filter(|(host, _)| host.contains(['.', ':']) || *host == "localhost");
    let path = path.map_or(repo, |(_, p)| p);
    if path.is_empty() || path.split('/').any(str::is_empty) {
        return Err(format!("no repository name; {example}"));
    }
    if let Some(c) =
        path.chars().find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/".contains(*c)))
    {
        return Err(format!(
            "the repository {path} holds {c:?}: lowercase letters, digits, '.', '_', '-' and '/' only"
        ));
    }
    Ok(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_those_the_api_server_takes() {
        for (t, v) in [("500m", 0.5), ("2", 2.0), ("1Gi", 1073741824.0), ("1e3", 1000.0), ("0.5", 0.5)] {
            assert_eq!(quantity(t), Some(v), "{t}");
        }
        assert_eq!(quantity("1.5k"), Some(1500.0));
        assert_eq!(quantity("+1E2"), Some(100.0));
        for bad in
            ["", "lots", "1GB", "1gi", "1K", "1 Gi", " 2", "1e", "1e+", ".", "Gi", "1.2.3", "1Mi2", "inf"]
        {
            assert_eq!(quantity(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_slip_with_units_says_what_was_meant() {
        let e = memory("1GB").unwrap_err();
        assert_eq!(e, "not a Kubernetes quantity (bytes take no B); did you mean 1Gi (binary, 1024-based) or 1G (decimal)?");
        assert!(memory("512mb").unwrap_err().contains("512Mi (binary, 1024-based) or 512M"), "{e}");
        assert!(memory("1KiB").unwrap_err().contains("1Ki (binary, 1024-based) or 1k (decimal)"));
        assert!(memory("lots").unwrap_err().contains("e.g. 512Mi or 2Gi"));
        assert!(cpu("lots").unwrap_err().contains("500m (half a core)"));
        assert_eq!(cpu("-1").unwrap_err(), "a request is not negative");
        assert_eq!(memory("1Gi").unwrap(), "1Gi");
        assert_eq!(cpu("500m").unwrap(), "500m");
    }

    #[test]
    fn an_image_is_a_reference_a_runtime_pulls() {
        for good in [
            "tcpx-rxdm:0.1.0",
            "us-docker.pkg.dev/my-proj/repo/tcpx-rxdm:0.1.0",
            "localhost:5000/tcpx-rxdm",
            "registry.example:5000/ml/tcpx-rxdm@sha256:0123abcd",
            "tcpx-rxdm:V1_RC",
        ] {
            assert_eq!(image(good).as_deref(), Ok(good), "{good}");
        }
        for (bad, says) in [
            ("", "empty; name the daemon's image"),
            ("my image", "holds ' '"),
            ("--mode=node", "starts with '-'"),
            ("registry.example/TCPX-rxdm:1", "the repository TCPX-rxdm holds 'T'"),
            ("registry.example/", "no repository name"),
        ] {
            let e = image(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
