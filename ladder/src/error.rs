//! The ladder's error type.

use std::path::PathBuf;

/// Everything that can stop a ladder run, with the context needed to act on it.
#[derive(Debug, thiserror::Error)]
pub enum LadderError {
    /// An I/O operation failed; `context` says which one.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A program the ladder starts is not next to the ladder's executable.
    #[error("binary {name} not found at {path}: run `{build}` first")]
    MissingBinary {
        /// The binary's name.
        name: String,
        /// Where it was looked for.
        path: PathBuf,
        /// The cargo command that builds it in the right profile.
        build: String,
    },
    /// A child program did not become ready, exited, or answered badly.
    #[error("{0}")]
    Process(String),
    /// A worker broke the coordinator protocol or went away.
    #[error("worker {worker}: {message}")]
    Worker {
        /// The worker's index.
        worker: usize,
        /// What went wrong.
        message: String,
    },
    /// An HTTP exchange with a child failed.
    #[error("GET {target}: {message}")]
    Http {
        /// Address and path.
        target: String,
        /// What went wrong.
        message: String,
    },
    /// A gRPC call to the control plane failed.
    #[error("control plane {call}: {status}")]
    Grpc {
        /// The call.
        call: &'static str,
        /// The status returned.
        status: String,
    },
    /// The arguments do not make a runnable ladder.
    #[error("invalid arguments: {0}")]
    Args(String),
}

impl LadderError {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

/// Result with [`LadderError`].
pub type Result<T, E = LadderError> = std::result::Result<T, E>;
