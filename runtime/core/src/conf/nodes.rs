//! The `DVMNodes` parser: the single implementation that turns a node-list expression into the
//! ordered list of member hosts, for the daemon side and the controller side alike.
//!
//! Accepted forms, combinable in one comma-separated list:
//! - plain host names and IP literals (`n01`, `10.200.0.5`, `fd00:200::5`, `[fd00:200::5]`);
//! - ranges `base[W:ranges]suffix`, `W` the zero-pad width (`linux[2:2-10]`,
//!   `rack[3:1-2,7]-ib`); without `W:` the width is that of the first number as written;
//! - `file:PATH`, a file with one entry per line (blank and `#` lines skipped), relative paths
//!   taken from the directory of the configuration file;
//! - a PMIx native regular expression `pmix[...]` wrapping any of the above.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::diag::{Diagnostic, Kind, Origin};
use crate::hostname;

// The bound on how many nodes one expression may expand to, so a typo such as
// `n[1:1-99999999999]` is a diagnostic rather than an out-of-memory.
use dvmlab_proto::limits::MAX_NODES;

/// How deeply `pmix[...]` may nest: one level is all PMIx produces; a few more are tolerated.
const MAX_NESTING: usize = 4;

/// One member host and where it was named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEntry {
    pub name: String,
    pub origin: Origin,
}

/// Reads a `file:` node list; the indirection keeps this parser free of IO.
pub type ReadFile<'a> = &'a dyn Fn(&Path) -> io::Result<String>;

/// Expands `expr` (the value of `DVMNodes` found at `origin`) into the ordered node list and
/// rejects duplicates under the `keep_fqdn` matching rule.
pub fn parse(
    expr: &str,
    origin: &Origin,
    base_dir: &Path,
    read: ReadFile<'_>,
    keep_fqdn: bool,
) -> Result<Vec<NodeEntry>, Diagnostic> {
    let mut out = Vec::new();
    expand_list(expr, origin, base_dir, read, Nesting::default(), &mut out)?;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, n) in out.iter().enumerate() {
        if let Some(first) = seen.insert(hostname::match_key(&n.name, keep_fqdn), i) {
            return Err(Diagnostic::new(
                Kind::DuplicateNode,
                n.origin.clone(),
                format!(
                    "node listed twice in DVMNodes (entries {} and {})",
                    first + 1,
                    i + 1
                ),
                n.name.clone(),
            ));
        }
    }
    Ok(out)
}

fn bad(origin: &Origin, message: impl Into<String>, text: &str) -> Diagnostic {
    Diagnostic::new(Kind::BadNodeList, origin.clone(), message, text)
}

/// Splits at commas that are not inside brackets.
fn split_top(expr: &str, origin: &Origin) -> Result<Vec<String>, Diagnostic> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut cur = String::new();
    for c in expr.chars() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| bad(origin, "unbalanced ']'", expr))?
            }
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if depth != 0 {
        return Err(bad(origin, "unbalanced '['", expr));
    }
    parts.push(cur);
    Ok(parts)
}

/// Where in the expansion we are: inside a node file, and how deep in `pmix[...]`.
#[derive(Debug, Clone, Copy, Default)]
struct Nesting {
    in_file: bool,
    pmix: usize,
}

fn expand_list(
    expr: &str,
    origin: &Origin,
    base_dir: &Path,
    read: ReadFile<'_>,
    nesting: Nesting,
    out: &mut Vec<NodeEntry>,
) -> Result<(), Diagnostic> {
    for token in split_top(expr, origin)? {
        let token = token.trim();
        if token.is_empty() {
            return Err(bad(origin, "empty entry in node list", expr));
        }
        if let Some(path) = token.strip_prefix("file:") {
            if nesting.in_file {
                return Err(bad(origin, "file: inside a node file", token));
            }
            expand_file(path.trim(), origin, base_dir, read, out)?;
        } else if let Some(inner) = token
            .strip_prefix("pmix[")
            .and_then(|s| s.strip_suffix(']'))
        {
            if nesting.pmix >= MAX_NESTING {
                return Err(bad(origin, "pmix[...] nested too deeply", token));
            }
            let deeper = Nesting {
                pmix: nesting.pmix + 1,
                ..nesting
            };
            expand_list(inner, origin, base_dir, read, deeper, out)?;
        } else {
            let room = MAX_NODES - out.len();
            for name in expand_pattern(token, origin, room)? {
                out.push(NodeEntry {
                    name,
                    origin: origin.clone(),
                });
            }
        }
    }
    Ok(())
}

fn too_many(origin: &Origin, text: &str) -> Diagnostic {
    bad(
        origin,
        format!("node list expands past {MAX_NODES} nodes"),
        text,
    )
}

fn expand_file(
    path: &str,
    origin: &Origin,
    base_dir: &Path,
    read: ReadFile<'_>,
    out: &mut Vec<NodeEntry>,
) -> Result<(), Diagnostic> {
    if path.is_empty() {
        return Err(bad(origin, "file: names no file", "file:"));
    }
    let full: PathBuf = base_dir.join(path);
    let text = read(&full).map_err(|e| {
        bad(
            origin,
            format!("cannot read node file {}: {e}", full.display()),
            path,
        )
    })?;
    for (idx, line) in text.lines().enumerate() {
        let line_s = line.trim();
        if line_s.is_empty() || line_s.starts_with('#') {
            continue;
        }
        let at = Origin::file_line(&full, idx + 1);
        let in_file = Nesting {
            in_file: true,
            pmix: 0,
        };
        expand_list(line_s, &at, base_dir, read, in_file, out)?;
    }
    Ok(())
}

/// Expands one host pattern with zero or more bracket groups into at most `room` names.
fn expand_pattern(token: &str, origin: &Origin, room: usize) -> Result<Vec<String>, Diagnostic> {
    if hostname::ip_literal(token).is_some() {
        return Ok(vec![token.to_string()]);
    }
    let mut names = vec![String::new()];
    let mut rest = token;
    while let Some(open) = rest.find('[') {
        let close = rest[open..]
            .find(']')
            .map(|c| open + c)
            .ok_or_else(|| bad(origin, "unbalanced '['", token))?;
        let prefix = &rest[..open];
        let values = expand_group(&rest[open + 1..close], origin, token, room)?;
        let count = names
            .len()
            .checked_mul(values.len())
            .filter(|&c| c <= room)
            .ok_or_else(|| too_many(origin, token))?;
        let mut next = Vec::with_capacity(count);
        for n in &names {
            for v in &values {
                next.push(format!("{n}{prefix}{v}"));
            }
        }
        names = next;
        rest = &rest[close + 1..];
    }
    if rest.contains(']') {
        return Err(bad(origin, "unbalanced ']'", token));
    }
    if names.len() > room {
        return Err(too_many(origin, token));
    }
    for n in &mut names {
        n.push_str(rest);
        if !hostname::is_valid(n) {
            return Err(bad(origin, "not a valid host name", n));
        }
    }
    Ok(names)
}

/// Expands the inside of one bracket group, `W:ranges` or `ranges`, into at most `room` values.
fn expand_group(
    group: &str,
    origin: &Origin,
    token: &str,
    room: usize,
) -> Result<Vec<String>, Diagnostic> {
    let (width, ranges) = match group.split_once(':') {
        Some((w, r)) => {
            let w: usize = w
                .trim()
                .parse()
                .map_err(|_| bad(origin, "range width is not a number", token))?;
            if w == 0 || w > 18 {
                return Err(bad(origin, "range width must be 1 to 18", token));
            }
            (Some(w), r)
        }
        None => (None, group),
    };
    let mut out = Vec::new();
    for part in ranges.split(',') {
        let part = part.trim();
        let (lo_s, hi_s) = part.split_once('-').unwrap_or((part, part));
        let num = |s: &str| -> Result<u64, Diagnostic> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 18 {
                return Err(bad(
                    origin,
                    format!("range bound {s:?} is not a number"),
                    token,
                ));
            }
            s.parse()
                .map_err(|_| bad(origin, "range bound out of bounds", token))
        };
        let (lo, hi) = (num(lo_s.trim())?, num(hi_s.trim())?);
        if lo > hi {
            return Err(bad(
                origin,
                format!("range {lo}-{hi} runs backwards"),
                token,
            ));
        }
        if (hi - lo).saturating_add(1).saturating_add(out.len() as u64) > room as u64 {
            return Err(too_many(origin, token));
        }
        let w = width.unwrap_or_else(|| {
            let s = lo_s.trim();
            if s.len() > 1 && s.starts_with('0') {
                s.len()
            } else {
                0
            }
        });
        out.extend((lo..=hi).map(|v| format!("{v:0w$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(expr: &str) -> Result<Vec<String>, Diagnostic> {
        let origin = Origin::file_line("/etc/prte.conf", 3);
        let read = |p: &Path| -> io::Result<String> {
            match p.to_str() {
                Some("/etc/nodes.txt") => Ok("# nodes\nhostA\n\nhostB.example\n".into()),
                Some("/etc/bad.txt") => Ok("ok1\nbad host\n".into()),
                _ => Err(io::Error::new(io::ErrorKind::NotFound, "no such file")),
            }
        };
        parse(expr, &origin, Path::new("/etc"), &read, false)
            .map(|v| v.into_iter().map(|n| n.name).collect())
    }

    #[test]
    fn spec_examples_expand_with_zero_padding() {
        let l = names("linux[2:2-10]").unwrap();
        assert_eq!(l.first().unwrap(), "linux02");
        assert_eq!(l.last().unwrap(), "linux10");
        assert_eq!(l.len(), 9);
        assert_eq!(
            names("rack[3:1-2,7]-ib").unwrap(),
            ["rack001-ib", "rack002-ib", "rack007-ib"]
        );
        let n = names("n[1:1-9],n[2:10-32]").unwrap();
        assert_eq!(n.len(), 32);
        assert_eq!(n[0], "n1");
        assert_eq!(n[9], "n10");
        assert_eq!(n[31], "n32");
        assert_eq!(
            names("linux0,linux[2:2-3]").unwrap(),
            ["linux0", "linux02", "linux03"]
        );
    }

    #[test]
    fn widthless_ranges_take_the_written_width() {
        assert_eq!(names("n[08-10]").unwrap(), ["n08", "n09", "n10"]);
        assert_eq!(names("n[8-10]").unwrap(), ["n8", "n9", "n10"]);
    }

    #[test]
    fn ip_literals_files_and_pmix_regex() {
        assert_eq!(
            names("10.0.0.1,fd00::2,[fd00::3]").unwrap(),
            ["10.0.0.1", "fd00::2", "[fd00::3]"]
        );
        assert_eq!(
            names("c0,file:nodes.txt").unwrap(),
            ["c0", "hostA", "hostB.example"]
        );
        assert_eq!(names("pmix[n[1:1-2],x]").unwrap(), ["n1", "n2", "x"]);
    }

    #[test]
    fn node_file_errors_name_the_node_file_and_line() {
        let e = names("file:bad.txt").unwrap_err();
        assert_eq!(e.kind, Kind::BadNodeList);
        assert_eq!(e.origin, Origin::file_line("/etc/bad.txt", 2));
        let e = names("file:missing.txt").unwrap_err();
        assert!(e.message.contains("/etc/missing.txt"), "{e}");
    }

    #[test]
    fn malformed_lists_are_rejected() {
        for bad in [
            "a,,b",
            "n[1:1-",
            "n]1[",
            "n[x:1-2]",
            "n[0:1-2]",
            "n[1:5-2]",
            "n[1:a-b]",
            "n[]",
            "bad host",
            "n[1:1-99999999]",
            "a[1-999999]b[1-999999]",
            "n[1-600000,1-600000]",
            "pmix[pmix[pmix[pmix[pmix[x]]]]]",
            "file:",
            "-lead",
        ] {
            let e = names(bad).expect_err(bad);
            assert_eq!(e.kind, Kind::BadNodeList, "{bad}: {e}");
        }
    }

    proptest::proptest! {
        #[test]
        fn no_node_list_text_panics(expr in "[a-z0-9\\[\\]:,\\-.pmixfle]{0,40}") {
            let _ = names(&expr);
        }
    }

    #[test]
    fn duplicates_are_rejected_under_the_short_name_rule() {
        assert_eq!(names("a,b,a").unwrap_err().kind, Kind::DuplicateNode);
        assert_eq!(names("n[1:1-3],n2").unwrap_err().kind, Kind::DuplicateNode);
        assert_eq!(names("a.x,a.y").unwrap_err().kind, Kind::DuplicateNode);
        let origin = Origin::Host;
        let read = |_: &Path| -> io::Result<String> { Ok(String::new()) };
        assert!(parse("a.x,a.y", &origin, Path::new("/"), &read, true).is_ok());
    }
}
