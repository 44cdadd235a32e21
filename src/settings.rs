//! The `FERROLOADER_*` environment settings, each parsed and checked here
//! and nowhere else: the engine's readers take their values from these
//! parsers, and `iter()` runs [`check`] before any worker starts, so a bad
//! value is one error naming the variable, whichever side reads it.
//!
//! | variable | value |
//! | --- | --- |
//! | `FERROLOADER_SHM_LIMIT` | bytes the workers' arenas may use together (`512M`, `8G`) |
//! | `FERROLOADER_SPIN_US` | microseconds a waiter spins before sleeping |
//! | `FERROLOADER_WARN_WAITING` | a share in (0, 1): warn when the loop waits more |
//! | `FERROLOADER_DISABLE` | facilities to act as if missing ([`DISABLE_NAMES`]) |

/// The names `FERROLOADER_DISABLE` takes: the engine's facilities and the
/// pinning's registration with CUDA.
pub const DISABLE_NAMES: [&str; 3] = ["memfd", "pidfd", "cuda-register"];

/// The largest `FERROLOADER_SHM_LIMIT`: a larger one cannot be a size of
/// memory (and would overflow the arenas' arithmetic).
const MAX_SHM: f64 = (1u64 << 60) as f64;

/// The longest `FERROLOADER_SPIN_US`.
const MAX_SPIN_US: u64 = 10_000_000;

/// A string as Python's `repr` writes it, so the messages read as Python's.
fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

fn var(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// `FERROLOADER_SHM_LIMIT`: `None` when unset or empty.
pub fn shm_limit(raw: Option<&str>) -> Result<Option<u64>, String> {
    let Some(raw) = raw else { return Ok(None) };
    let upper = raw.trim().to_ascii_uppercase();
    let text = upper.strip_suffix('B').unwrap_or(&upper);
    if text.is_empty() {
        return Ok(None);
    }
    let (number, unit) = match text.chars().last() {
        Some('K') => (&text[..text.len() - 1], 1u64 << 10),
        Some('M') => (&text[..text.len() - 1], 1 << 20),
        Some('G') => (&text[..text.len() - 1], 1 << 30),
        Some('T') => (&text[..text.len() - 1], 1 << 40),
        _ => (text, 1),
    };
    let value = number
        .trim()
        .parse::<f64>()
        .map_or(f64::NAN, |v| v * unit as f64);
    // also refuses NaN and infinities
    if !(1.0..=MAX_SHM).contains(&value) {
        return Err(format!(
            "FERROLOADER_SHM_LIMIT={} is not a size from 1 byte to 1024T (e.g. 512M or 8G)",
            py_repr(raw)
        ));
    }
    Ok(Some(value as u64))
}

/// `FERROLOADER_SPIN_US`: `None` when unset or empty.
pub fn spin_us(raw: Option<&str>) -> Result<Option<u64>, String> {
    let Some(text) = raw.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    match text.parse::<u64>() {
        Ok(n) if text.bytes().all(|b| b.is_ascii_digit()) && n <= MAX_SPIN_US => Ok(Some(n)),
        _ => Err(format!(
            "FERROLOADER_SPIN_US={} is not a whole number of microseconds up to {MAX_SPIN_US} \
             (e.g. 100)",
            py_repr(text)
        )),
    }
}

/// `FERROLOADER_WARN_WAITING`: `None` when unset or empty.
pub fn warn_waiting(raw: Option<&str>) -> Result<Option<f64>, String> {
    let Some(text) = raw.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    match text.parse::<f64>() {
        Ok(share) if share > 0.0 && share < 1.0 => Ok(Some(share)),
        _ => Err(format!(
            "FERROLOADER_WARN_WAITING={} is not a share between 0 and 1 (e.g. 0.3)",
            py_repr(text)
        )),
    }
}

/// `FERROLOADER_DISABLE`: the names it lists, trimmed and lower-cased.
pub fn disable(raw: Option<&str>) -> Result<Vec<String>, String> {
    let raw = raw.unwrap_or("");
    let names: Vec<&str> = raw
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    let unknown: Vec<String> = names
        .iter()
        .filter(|n| !DISABLE_NAMES.contains(&n.to_ascii_lowercase().as_str()))
        .map(|n| py_repr(n))
        .collect();
    if !unknown.is_empty() {
        return Err(format!(
            "FERROLOADER_DISABLE={} names {}, which is not a facility ferroloader can turn off; \
             it takes a comma-separated list of {}",
            py_repr(raw),
            unknown.join(", "),
            DISABLE_NAMES.join(", ")
        ));
    }
    Ok(names.iter().map(|n| n.to_ascii_lowercase()).collect())
}

/// The environment's `FERROLOADER_SHM_LIMIT`.
pub fn shm_limit_env() -> Result<Option<u64>, String> {
    shm_limit(var("FERROLOADER_SHM_LIMIT").as_deref())
}

/// The environment's `FERROLOADER_SPIN_US`.
pub fn spin_us_env() -> Result<Option<u64>, String> {
    spin_us(var("FERROLOADER_SPIN_US").as_deref())
}

/// The environment's `FERROLOADER_WARN_WAITING`.
pub fn warn_waiting_env() -> Result<Option<f64>, String> {
    warn_waiting(var("FERROLOADER_WARN_WAITING").as_deref())
}

/// The environment's `FERROLOADER_DISABLE`.
pub fn disable_env() -> Result<Vec<String>, String> {
    disable(var("FERROLOADER_DISABLE").as_deref())
}

/// Every setting of the environment checked, in a fixed order: the first
/// bad one's message.
pub fn check() -> Result<(), String> {
    shm_limit_env()?;
    spin_us_env()?;
    disable_env()?;
    warn_waiting_env()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shm_limits_parse_with_units_and_refuse_non_sizes() {
        assert_eq!(shm_limit(None), Ok(None));
        assert_eq!(shm_limit(Some(" ")), Ok(None));
        assert_eq!(shm_limit(Some("512M")), Ok(Some(512 << 20)));
        assert_eq!(shm_limit(Some("8gb")), Ok(Some(8 << 30)));
        assert_eq!(shm_limit(Some("1e18")), Ok(Some(1_000_000_000_000_000_000)));
        assert_eq!(shm_limit(Some("64T")), Ok(Some(64 << 40)));
        for bad in ["lots", "inf", "nan", "1e30", "-5M", "0", "M"] {
            let e = shm_limit(Some(bad)).unwrap_err();
            assert!(
                e.starts_with(&format!("FERROLOADER_SHM_LIMIT='{bad}' is not a size")),
                "{e}"
            );
        }
    }

    #[test]
    fn spins_are_whole_microseconds() {
        assert_eq!(spin_us(Some(" 50 ")), Ok(Some(50)));
        assert_eq!(spin_us(Some("")), Ok(None));
        for bad in ["fast", "-1", "1e99", "+5", "10000001"] {
            assert!(spin_us(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_waiting_share_is_strictly_between_0_and_1() {
        assert_eq!(warn_waiting(Some("0.5")), Ok(Some(0.5)));
        for bad in ["often", "1.5", "0", "1", "nan"] {
            assert!(warn_waiting(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn disable_names_are_checked_and_normalised() {
        assert_eq!(
            disable(Some(" CUDA-register, ")),
            Ok(vec!["cuda-register".to_string()])
        );
        assert_eq!(disable(None), Ok(vec![]));
        let e = disable(Some("memfs")).unwrap_err();
        assert_eq!(
            e,
            "FERROLOADER_DISABLE='memfs' names 'memfs', which is not a facility ferroloader can \
             turn off; it takes a comma-separated list of memfd, pidfd, cuda-register"
        );
        assert!(disable(Some("pidfd,cuda")).is_err());
    }

    #[test]
    fn messages_quote_as_python_does() {
        assert_eq!(py_repr("a'b"), "\"a'b\"");
        assert_eq!(py_repr("x\\y"), "'x\\\\y'");
    }
}
