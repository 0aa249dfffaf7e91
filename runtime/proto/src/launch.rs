//! The launch service's messages (`plaunch`): how a controller without ssh starts a daemon on
//! a host. After the DVM key handshake the caller sends one [`LaunchRequest`] and the service
//! answers with one [`LaunchReply`], each a single sealed record of JSON, then the
//! connection ends. Nothing is read from a caller that has not proved it holds the key.

use serde::{Deserialize, Serialize};

use crate::limits::MAX_LAUNCH_WORDS;

/// The launch service's TCP port unless told otherwise: the one after the DVM's default
/// `DVMPort` (7817).
pub const DEFAULT_PORT: u16 = 7818;

/// Start this command line on the service's host (no shell: the words as they are).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchRequest {
    pub argv: Vec<String>,
}

/// What the service did with a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum LaunchReply {
    /// The command runs, as this process on the service's host.
    Started { pid: u32 },
    /// Nothing was started, and why.
    Refused { reason: String },
}

impl LaunchRequest {
    /// Checks what a request must be before anything else looks at it: some words, not too
    /// many, none with a NUL (which no command line can hold).
    pub fn validate(&self) -> Result<(), String> {
        if self.argv.is_empty() {
            return Err("an empty command line".into());
        }
        if self.argv.len() > MAX_LAUNCH_WORDS {
            return Err(format!(
                "a command line of {} words (at most {MAX_LAUNCH_WORDS})",
                self.argv.len()
            ));
        }
        if let Some(i) = self.argv.iter().position(|w| w.contains('\0')) {
            return Err(format!(
                "word {} of the command line holds a NUL byte",
                i + 1
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_and_a_reply_have_one_json_form_and_strangers_fields_are_refused() {
        let r = LaunchRequest {
            argv: vec!["/bin/prted".into(), "--bootstrap".into()],
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, r#"{"argv":["/bin/prted","--bootstrap"]}"#);
        assert_eq!(serde_json::from_str::<LaunchRequest>(&text).unwrap(), r);
        let started = serde_json::to_string(&LaunchReply::Started { pid: 7 }).unwrap();
        assert_eq!(started, r#"{"started":{"pid":7}}"#);
        assert!(serde_json::from_str::<LaunchRequest>(r#"{"argv":[],"env":{}}"#).is_err());
    }

    #[test]
    fn an_empty_huge_or_nul_holding_command_line_is_refused() {
        let bad = |argv: Vec<String>| LaunchRequest { argv }.validate().unwrap_err();
        assert!(bad(vec![]).contains("empty"));
        assert!(bad(vec!["x".into(); MAX_LAUNCH_WORDS + 1]).contains("4097 words"));
        assert!(bad(vec!["a".into(), "b\0c".into()]).contains("word 2"));
        assert!(LaunchRequest {
            argv: vec!["x".into(); MAX_LAUNCH_WORDS]
        }
        .validate()
        .is_ok());
    }
}
