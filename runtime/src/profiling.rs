//! CPU and heap profiles over HTTP (`--pprof-addr`), behind the `pprof`
//! cargo feature so a program built without it carries no profiler. CI
//! builds it through tests/e2e, whose `pprof` test fetches and decodes both
//! profiles from each program.
//!
//! - `GET /debug/pprof/profile?seconds=N` (default 30, at most 300): a CPU
//!   profile in pprof protobuf, sampled at 99 Hz. Costs memory for the rest
//!   of the process's life: the profiler keeps its sample table once it has
//!   run (≈ 80 MiB measured in a release router). Symbolizing the report
//!   parses the binary's debug info into a cache (≈ 140 MiB more with
//!   debuginfo); that cache is cleared after each report.
//! - `GET /debug/pprof/heap`: a jemalloc heap profile in pprof protobuf
//!   (needs `_RJEM_MALLOC_CONF=prof:true,prof_active:true` in the
//!   environment when the process starts — jemalloc here is built with the
//!   `_rjem_` prefix, so plain `MALLOC_CONF` is ignored; otherwise it
//!   answers 503 saying so).
//!
//! Both reports are built on tokio's blocking threads (symbolization and
//! the heap dump's file I/O), never on a runtime worker.
//!
//! Without the feature, [`serve`] refuses to start with a clear error.

use std::net::SocketAddr;

/// Why the profiling listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProfilingError {
    /// Built without the `pprof` feature.
    #[error(
        "this binary was built without profiling: rebuild with `--features pprof` to use --pprof-addr"
    )]
    NotBuilt,
    /// The address could not be bound.
    #[error("binding --pprof-addr {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

/// Starts the profiling listener on `addr`; returns the bound address.
#[cfg(not(feature = "pprof"))]
pub async fn serve(addr: SocketAddr) -> Result<SocketAddr, ProfilingError> {
    let _ = addr;
    Err(ProfilingError::NotBuilt)
}

/// Starts the profiling listener on `addr`; returns the bound address.
#[cfg(feature = "pprof")]
pub async fn serve(addr: SocketAddr) -> Result<SocketAddr, ProfilingError> {
    imp::serve(addr).await
}

#[cfg(feature = "pprof")]
mod imp {
    use std::net::SocketAddr;
    use std::time::Duration;

    use axum::Router;
    use axum::extract::Query;
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};
    use axum::routing::get;
    use pprof::protos::Message as _;

    use super::ProfilingError;

    const DEFAULT_SECONDS: u64 = 30;
    const MAX_SECONDS: u64 = 300;
    const FREQUENCY_HZ: i32 = 99;

    #[derive(serde::Deserialize)]
    struct ProfileQuery {
        seconds: Option<u64>,
    }

    pub(super) async fn serve(addr: SocketAddr) -> Result<SocketAddr, ProfilingError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ProfilingError::Bind { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| ProfilingError::Bind { addr, source })?;
        let app = Router::new()
            .route("/debug/pprof/profile", get(cpu))
            .route("/debug/pprof/heap", get(heap));
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "pprof listener stopped");
            }
        });
        Ok(bound)
    }

    async fn cpu(Query(q): Query<ProfileQuery>) -> Response {
        let secs = q.seconds.unwrap_or(DEFAULT_SECONDS).clamp(1, MAX_SECONDS);
        let guard = match pprof::ProfilerGuardBuilder::default()
            .frequency(FREQUENCY_HZ)
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
        {
            Ok(g) => g,
            Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
        };
        tokio::time::sleep(Duration::from_secs(secs)).await;
        // Symbolizing parses the binary's debug info (CPU-bound for a while,
        // and file reads): on a blocking thread, so no runtime worker stalls
        // under it and the program keeps being served meanwhile.
        let built = tokio::task::spawn_blocking(move || {
            let profile = guard.report().build().and_then(|r| r.pprof());
            // The symbol cache is only needed while the report is built;
            // kept, it stays in RSS for the life of the process.
            backtrace::clear_symbol_cache();
            drop(guard);
            profile
                .map_err(|e| e.to_string())?
                .write_to_bytes()
                .map_err(|e| e.to_string())
        })
        .await;
        answer(built)
    }

    /// The response for a report built on a blocking thread.
    fn answer(built: Result<Result<Vec<u8>, String>, tokio::task::JoinError>) -> Response {
        match built {
            Ok(Ok(bytes)) => bytes.into_response(),
            Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        }
    }

    async fn heap() -> Response {
        let Some(ctl) = jemalloc_pprof::PROF_CTL.as_ref() else {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "jemalloc profiling unavailable",
            )
                .into_response();
        };
        let mut ctl = ctl.clone().lock_owned().await;
        if !ctl.activated() {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "start the process with _RJEM_MALLOC_CONF=prof:true,prof_active:true for heap profiles",
            )
                .into_response();
        }
        // The dump writes jemalloc's profile to a temp file and parses it
        // back: file I/O, on a blocking thread (the lock goes with it).
        let built =
            tokio::task::spawn_blocking(move || ctl.dump_pprof().map_err(|e| e.to_string())).await;
        answer(built)
    }
}
