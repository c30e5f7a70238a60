//! How every program writes its log: to stderr, one event a line, in the
//! format `--log-format` names, at the level `RUST_LOG` sets.
//!
//! Colours (ANSI escape codes) only when stderr is a terminal and
//! `NO_COLOR` is unset: a log read from a pipe, a file or a container
//! runtime must not carry escape codes, which log collectors store as text.
//! `json` writes one JSON object a line (`timestamp`, `level`, `target`,
//! `fields`, with `fields.message`), for collectors that parse.

use std::io::IsTerminal as _;

use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The environment variable that sets the log filter (tracing's
/// `EnvFilter` syntax: `info`, `warn,agentmesh_router=debug`, …).
pub const FILTER_ENV: &str = "RUST_LOG";

/// What one log line looks like.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Whether the log may carry colour codes: stderr is a terminal and
/// `NO_COLOR` is not set (<https://no-color.org>).
pub fn colour() -> bool {
    std::env::var_os("NO_COLOR").is_none() && std::io::stderr().is_terminal()
}

/// The program's log layer over stderr, filtered by `RUST_LOG` or, when it
/// is unset or invalid, by `default_filter`.
pub fn layer<S>(format: LogFormat, default_filter: &str) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let filter = tracing_subscriber::EnvFilter::try_from_env(FILTER_ENV)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // A closed log pipe must not take the program down.
        .log_internal_errors(false);
    match format {
        LogFormat::Text => fmt.with_ansi(colour()).with_filter(filter).boxed(),
        LogFormat::Json => fmt
            .json()
            .flatten_event(false)
            .with_ansi(false)
            .with_filter(filter)
            .boxed(),
    }
}

/// Installs [`layer`] as the process's only subscriber. Call once, first.
pub fn init(format: LogFormat, default_filter: &str) {
    tracing_subscriber::registry()
        .with(layer(format, default_filter))
        .init();
}
