//! Writing `prte.conf` files (the bootstrap spec's `Key=Value` format) for test clusters.

use std::fmt::Write;

/// A `prte.conf` under construction: keys in insertion order, plus raw lines for tests that
/// need malformed files.
#[derive(Debug, Clone, Default)]
pub struct PrteConf {
    lines: Vec<String>,
}

impl PrteConf {
    pub fn new() -> PrteConf {
        PrteConf::default()
    }

    /// Sets `key` (replacing an earlier value).
    pub fn set(mut self, key: &str, value: impl ToString) -> PrteConf {
        let prefix = format!("{key}=");
        self.lines.retain(|l| !l.starts_with(&prefix));
        self.lines.push(format!("{key}={}", value.to_string()));
        self
    }

    /// Removes `key`.
    pub fn unset(mut self, key: &str) -> PrteConf {
        let prefix = format!("{key}=");
        self.lines.retain(|l| !l.starts_with(&prefix));
        self
    }

    /// Appends a line as is.
    pub fn raw(mut self, line: &str) -> PrteConf {
        self.lines.push(line.to_string());
        self
    }

    pub fn render(&self) -> String {
        let mut s = String::from("# written by dvmlab-harness\n");
        for l in &self.lines {
            let _ = writeln!(s, "{l}");
        }
        s
    }
}
