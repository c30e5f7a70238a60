//! What every agentmesh binary shares at run time.
//!
//! - [`Allocator`]: jemalloc with background threads, so memory freed after
//!   members leave goes back to the OS instead of staying resident. Each
//!   binary declares `#[global_allocator] static A: Allocator = Allocator;`.
//! - [`allocator`]: jemalloc's allocated / resident / retained bytes as
//!   `agentmesh_runtime_allocator_*` gauges, read at each scrape.
//! - [`runtime_builder`]: the tokio runtime every binary runs on, idle
//!   workers handing jemalloc's thread caches back.
//! - [`watchdog`]: warns when the async runtime stalls for a second or more
//!   and counts it in `agentmesh_runtime_stalls_total{cause}`, the cause
//!   read from the process's CPU time and context switches over the stall
//!   (`busy`: on CPU, `starved`: runnable but not run, `blocked`: neither),
//!   and, from the runtime threads' stacks read while the stall lasts, what
//!   they were running.
//! - [`profiling`] (cargo feature `pprof`): CPU and heap profiles over HTTP
//!   on `--pprof-addr`.
//! - [`accept::AcceptBackoff`]: the growing, jittered pause every accept
//!   loop takes after a failed `accept()` (out of file descriptors).
//! - [`log_gate::LogGate`]: log lines a peer can cause, at most once a
//!   minute per peer and kind, the lines held back counted in
//!   `…_log_suppressed_total{kind}`.
//! - [`listen_queue`]: the kernel's count of connections turned away at a
//!   full listen backlog, `agentmesh_runtime_tcp_listen_{overflows,drops}_total`.
//! - [`logging`]: the log every program writes to stderr, `--log-format
//!   text|json`, colours only on a terminal, the level from `RUST_LOG`.
//! - [`signals::StopSignals`]: SIGINT and SIGTERM, registered once before
//!   a program starts anything, so an early SIGTERM still drains.
//! - [`supervise`]: what the programs' supervisors share: a stopped
//!   task's [`supervise::TaskFailure`], panic text, first failure reported.
//! - [`entropy`]: AWS-LC's random generator (libp2p's QUIC) seeded once
//!   per process before the runtime starts, so its CPU-jitter collection
//!   never runs inside a dial on a runtime thread.
//! - [`at_rest`]: the data-dir and key-file checks every program makes
//!   before it trusts what it stored (no group- or world-writable dir or
//!   file, keys tightened back to 0600), and writing a private file.
//! - [`cli`] (cargo feature `cli`): the flags the programs share, the
//!   `--version` string with the git commit, and the help-text check.

pub mod accept;
pub mod allocator;
pub mod at_rest;
#[cfg(feature = "cli")]
pub mod cli;
pub mod entropy;
pub mod listen_queue;
pub mod log_gate;
pub mod logging;
pub mod profiling;
pub mod signals;
pub mod supervise;
pub mod watchdog;

/// The allocator of the agentmesh binaries (jemalloc, background threads on).
pub use tikv_jemallocator::Jemalloc as Allocator;

/// The multi-thread tokio runtime every agentmesh binary runs on: what
/// `#[tokio::main]` builds (all drivers on), plus one hook so idle workers
/// hand jemalloc's thread caches back ([`allocator::on_thread_park`]) and
/// memory freed after members leave can be returned to the OS, and its
/// threads registered with the [`watchdog`], so a stall names what they
/// ran. Binaries
/// run their main future with [`block_on`].
pub fn runtime_builder() -> tokio::runtime::Builder {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.enable_all()
        .on_thread_park(allocator::on_thread_park)
        .on_thread_start(watchdog::register_thread)
        .on_thread_stop(watchdog::unregister_thread);
    b
}

/// Seeds the crypto generator ([`entropy`]), builds the [`runtime_builder`]
/// runtime and runs `main` on it to the end: every binary's `fn main`.
/// Fails only if the runtime cannot be built.
pub fn block_on<F: std::future::Future>(main: F) -> std::io::Result<F::Output> {
    entropy::seed();
    Ok(runtime_builder().build()?.block_on(main))
}

/// As [`block_on`], but once `main` returns, blocking tasks still running get
/// at most `grace` before the runtime is dropped without them. For a
/// program that must exit when its work is done though a blocking read
/// cannot be canceled: tokio reads stdin on a blocking thread, and a plain
/// runtime drop waits for that read, so with stdin left open the process
/// would never exit.
pub fn block_on_within<F: std::future::Future>(
    main: F,
    grace: std::time::Duration,
) -> std::io::Result<F::Output> {
    entropy::seed();
    let rt = runtime_builder().build()?;
    let out = rt.block_on(main);
    rt.shutdown_timeout(grace);
    Ok(out)
}

/// The end of a program's `main`: `Ok` exits 0; an error is printed on
/// stderr as one line, `PROGRAM: error: cause: …` (`{:#}`: anyhow's chain
/// on one line), and exits 1. Never `{:?}`: returning an `anyhow::Result`
/// from `main` prints "Caused by:" lines and, with `RUST_BACKTRACE` set,
/// a backtrace, for errors that are expected (a refused call, a bad flag
/// value, a control plane that cannot be reached).
pub fn exit_code<E: std::fmt::Display>(
    program: &str,
    result: Result<(), E>,
) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", one_line(program, &e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// `PROGRAM: ERROR` on one line (line breaks inside the error become spaces).
fn one_line(program: &str, e: &impl std::fmt::Display) -> String {
    let text = format!("{e:#}");
    format!(
        "{program}: {}",
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    )
}

// Unit tests read jemalloc's statistics: make it this test binary's
// allocator too.
#[cfg(test)]
#[global_allocator]
static TEST_ALLOC: Allocator = Allocator;

#[cfg(test)]
mod tests {
    #[test]
    fn an_error_is_one_line_naming_the_program() {
        #[derive(Debug)]
        struct Chain;
        impl std::fmt::Display for Chain {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                if f.alternate() {
                    write!(f, "call failed: refused\n  by policy")
                } else {
                    write!(f, "call failed")
                }
            }
        }
        assert_eq!(
            super::one_line("agentmesh-node", &Chain),
            "agentmesh-node: call failed: refused by policy"
        );
    }
    /// The runtime runs tasks with its timers and I/O drivers on, and its
    /// idle workers' park hook (the cache flush) runs without failing.
    #[test]
    fn the_runtime_runs_timers_io_and_spawned_tasks() {
        let rt = super::runtime_builder().build().expect("runtime");
        let got = rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = l.local_addr().expect("addr");
            let accept = tokio::spawn(async move { l.accept().await.map(|(_, peer)| peer) });
            let c = tokio::net::TcpStream::connect(addr).await.expect("connect");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            let peer = accept.await.expect("join").expect("accept");
            (peer, c.local_addr().expect("local"))
        });
        assert_eq!(got.0, got.1);
    }

    /// A blocking task that never ends does not keep `block_on_within` from
    /// returning (a plain runtime drop would wait for it for good).
    #[test]
    fn block_on_within_leaves_a_stuck_blocking_task_behind() {
        let (_keep, stuck) = std::sync::mpsc::channel::<()>();
        let out = super::block_on_within(
            async move {
                tokio::task::spawn_blocking(move || {
                    let _ = stuck.recv();
                });
                7
            },
            std::time::Duration::from_millis(10),
        )
        .expect("runtime");
        assert_eq!(out, 7);
    }
}
