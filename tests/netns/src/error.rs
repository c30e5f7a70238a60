//! The testbed's one error type.

use std::time::Duration;

/// Why a testbed operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Namespaces cannot be made here (not root, `ip` or `nft` missing);
    /// tests skip on this, and only on this.
    #[error("network namespaces are unavailable: {0}")]
    Unavailable(String),
    /// A command exited non-zero.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// A command did not finish in time (it was killed).
    #[error("`{command}` did not finish within {timeout:?}")]
    CommandTimeout {
        /// The command line.
        command: String,
        /// The deadline it missed.
        timeout: Duration,
    },
    /// An I/O operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A name does not fit the naming rules (see `names`).
    #[error("name {name:?}: {why}")]
    Name {
        /// The name.
        name: String,
        /// The rule it breaks.
        why: String,
    },
    /// The address plan has no room for another host or NAT.
    #[error("no room: {0}")]
    Exhausted(String),
    /// Something waited for did not happen within its deadline.
    #[error("{what} not within {deadline:?}{detail}")]
    Deadline {
        /// What was waited for.
        what: String,
        /// The deadline.
        deadline: Duration,
        /// More context (e.g. the last lines of a log), may be empty.
        detail: String,
    },
    /// A process exited while something was waited for.
    #[error("{what}: the process exited ({status}){detail}")]
    Exited {
        /// What was waited for.
        what: String,
        /// Its exit status.
        status: String,
        /// More context (e.g. the last lines of its log).
        detail: String,
    },
    /// An HTTP exchange failed or its answer did not parse.
    #[error("GET http://{target}: {message}")]
    Http {
        /// `addr/path`.
        target: String,
        /// What went wrong.
        message: String,
    },
}

impl Error {
    /// An [`Error::Io`] naming what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}
