//! Configuration diagnostics: the one error type every bootstrap failure is reported as.
//!
//! A diagnostic names its kind (a stable kebab-case identifier tests and vendors can match on),
//! where the offending value came from (file and line, a command-line parameter, or an
//! environment variable), and the offending text or host.

use std::fmt;
use std::path::PathBuf;

/// What class of configuration problem was found. The `as_str` names are a documented contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Unreadable,
    NoEquals,
    EmptyKey,
    EmptyValue,
    MissingKey,
    BadValue,
    BadNodeList,
    DuplicateNode,
    NotAMember,
    AmbiguousIdentity,
    UnresolvedHost,
    AmbiguousAddress,
    NoMatchingAddress,
    Ipv6Unavailable,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Unreadable => "unreadable-file",
            Kind::NoEquals => "no-equals",
            Kind::EmptyKey => "empty-key",
            Kind::EmptyValue => "empty-value",
            Kind::MissingKey => "missing-key",
            Kind::BadValue => "bad-value",
            Kind::BadNodeList => "bad-node-list",
            Kind::DuplicateNode => "duplicate-node",
            Kind::NotAMember => "not-a-member",
            Kind::AmbiguousIdentity => "ambiguous-identity",
            Kind::UnresolvedHost => "unresolved-host",
            Kind::AmbiguousAddress => "ambiguous-address",
            Kind::NoMatchingAddress => "no-matching-address",
            Kind::Ipv6Unavailable => "ipv6-unavailable",
        }
    }
}

/// Where a configuration value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A line of a file (prte.conf, or a `file:` node list). `line` is 1-based; `None` means
    /// the file as a whole (e.g. a key that is missing from it).
    File { path: PathBuf, line: Option<usize> },
    /// `--prtemca NAME VALUE` on the command line.
    CommandLine { name: String },
    /// `PRTE_MCA_<name>` in the environment.
    Environment { var: String },
    /// Found at run time on this host (name resolution, interfaces).
    Host,
}

impl Origin {
    pub fn file_line(path: impl Into<PathBuf>, line: usize) -> Origin {
        Origin::File {
            path: path.into(),
            line: Some(line),
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File {
                path,
                line: Some(l),
            } => write!(f, "{}:{}", path.display(), l),
            Origin::File { path, line: None } => write!(f, "{}", path.display()),
            Origin::CommandLine { name } => write!(f, "command line --prtemca {name}"),
            Origin::Environment { var } => write!(f, "environment {var}"),
            Origin::Host => write!(f, "this host"),
        }
    }
}

/// One fatal bootstrap diagnostic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub kind: Kind,
    pub origin: Origin,
    /// What is wrong, in words.
    pub message: String,
    /// The offending text, key or host, quoted in the rendering.
    pub offending: String,
}

impl Diagnostic {
    pub fn new(
        kind: Kind,
        origin: Origin,
        message: impl Into<String>,
        offending: impl Into<String>,
    ) -> Self {
        Diagnostic {
            kind,
            origin,
            message: message.into(),
            offending: offending.into(),
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bootstrap error [{}] {}: {}: {:?}",
            self.kind.as_str(),
            self.origin,
            self.message,
            self.offending
        )
    }
}

impl std::error::Error for Diagnostic {}
