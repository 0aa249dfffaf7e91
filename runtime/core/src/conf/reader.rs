//! The `Key=Value` reader for `prte.conf`: the single implementation both the daemon-side
//! identity derivation and the controller-side node pool read the file through.

use std::path::{Path, PathBuf};

use crate::diag::{Diagnostic, Kind, Origin};

/// One `Key=Value` line as found in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: String,
    /// 1-based line number.
    pub line: usize,
}

/// A parsed configuration file: its path and its entries in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfFile {
    pub path: PathBuf,
    pub entries: Vec<Entry>,
}

impl ConfFile {
    /// Parses the text of a configuration file. `path` is only used to name the file in
    /// diagnostics. Empty lines and lines starting with `#` (after leading blanks) are skipped;
    /// any other line must be `Key=Value` with a non-empty key and value, both trimmed.
    pub fn parse(text: &str, path: &Path) -> Result<ConfFile, Diagnostic> {
        let mut entries = Vec::new();
        for (idx, raw) in text.lines().enumerate() {
            let line = idx + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let origin = || Origin::file_line(path, line);
            let Some((key, value)) = trimmed.split_once('=') else {
                return Err(Diagnostic::new(
                    Kind::NoEquals,
                    origin(),
                    "line is not Key=Value (no '=')",
                    trimmed,
                ));
            };
            let (key, value) = (key.trim(), value.trim());
            if key.is_empty() {
                return Err(Diagnostic::new(
                    Kind::EmptyKey,
                    origin(),
                    "line has an empty key",
                    trimmed,
                ));
            }
            if value.is_empty() {
                return Err(Diagnostic::new(
                    Kind::EmptyValue,
                    origin(),
                    format!("key {key} has an empty value"),
                    trimmed,
                ));
            }
            entries.push(Entry {
                key: key.to_string(),
                value: value.to_string(),
                line,
            });
        }
        Ok(ConfFile {
            path: path.to_path_buf(),
            entries,
        })
    }

    /// The last entry for `key` (keys are case-sensitive, as in PRRTE). A later line overrides
    /// an earlier one, so an operator can append an override to a distributed file.
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.iter().rev().find(|e| e.key == key)
    }

    /// The origin of an entry, for diagnostics about its value.
    pub fn origin_of(&self, entry: &Entry) -> Origin {
        Origin::file_line(&self.path, entry.line)
    }

    /// The origin naming the whole file (for a key that is missing from it).
    pub fn origin(&self) -> Origin {
        Origin::File {
            path: self.path.clone(),
            line: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConfFile, Diagnostic> {
        ConfFile::parse(text, Path::new("/etc/prte.conf"))
    }

    #[test]
    fn comments_blank_lines_and_whitespace_are_skipped_and_trimmed() {
        let c = parse("# head\n\n  DVMNodes = a,b \n#x=y\nClusterName=c=d\n").unwrap();
        assert_eq!(c.entries.len(), 2);
        assert_eq!(c.get("DVMNodes").unwrap().value, "a,b");
        assert_eq!(c.get("DVMNodes").unwrap().line, 3);
        assert_eq!(c.get("ClusterName").unwrap().value, "c=d");
    }

    #[test]
    fn line_without_equals_is_fatal_and_names_file_and_line() {
        let e = parse("DVMPort=1\nDVMNodes a,b\n").unwrap_err();
        assert_eq!(e.kind, Kind::NoEquals);
        assert_eq!(e.origin, Origin::file_line("/etc/prte.conf", 2));
        assert!(e.to_string().contains("/etc/prte.conf:2"), "{e}");
        assert!(e.to_string().contains("DVMNodes a,b"), "{e}");
    }

    #[test]
    fn empty_key_and_empty_value_are_fatal() {
        assert_eq!(parse("=x\n").unwrap_err().kind, Kind::EmptyKey);
        assert_eq!(parse("DVMPort=\n").unwrap_err().kind, Kind::EmptyValue);
        assert_eq!(parse("DVMPort=   \n").unwrap_err().kind, Kind::EmptyValue);
    }

    #[test]
    fn later_entry_overrides_earlier() {
        let c = parse("DVMPort=1\nDVMPort=2\n").unwrap();
        assert_eq!(c.get("DVMPort").unwrap().value, "2");
    }
}
