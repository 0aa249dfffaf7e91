//! Host-name rules shared by every consumer: what counts as an IP literal, and the key two
//! names are compared by under the `KeepFQDNHostnames` rule.

use std::net::IpAddr;

/// Parses an IP literal, accepting an IPv6 literal in brackets (`[fd00::1]`).
pub fn ip_literal(name: &str) -> Option<IpAddr> {
    let bare = name
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(name);
    bare.parse().ok()
}

/// The short form of a host name: everything before the first dot. IP literals are returned
/// unchanged (their dots are not domain separators).
pub fn short(name: &str) -> &str {
    if ip_literal(name).is_some() {
        return name;
    }
    name.split('.').next().unwrap_or(name)
}

/// The key under which two host names are equal: IP literals by address, names
/// case-insensitively, shortened unless `keep_fqdn`.
pub fn match_key(name: &str, keep_fqdn: bool) -> String {
    if let Some(ip) = ip_literal(name) {
        return ip.to_string();
    }
    let n = if keep_fqdn { name } else { short(name) };
    n.to_ascii_lowercase()
}

/// Whether `name` is usable as a host name (letters, digits, `-`, `_`, `.`; not starting
/// or ending with a dot or dash) or is an IP literal.
pub fn is_valid(name: &str) -> bool {
    if ip_literal(name).is_some() {
        return true;
    }
    !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with(['.', '-'])
        && !name.ends_with(['.', '-'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_and_keys() {
        assert_eq!(short("n01.cluster.example"), "n01");
        assert_eq!(short("10.200.0.3"), "10.200.0.3");
        assert_eq!(match_key("N01.Cluster", false), "n01");
        assert_eq!(match_key("N01.Cluster", true), "n01.cluster");
        assert_eq!(match_key("[fd00:200::0003]", false), "fd00:200::3");
    }

    #[test]
    fn validity() {
        assert!(is_valid("rack001-ib"));
        assert!(is_valid("fd00::1"));
        assert!(!is_valid("a b"));
        assert!(!is_valid("-a"));
        assert!(!is_valid(""));
    }
}
