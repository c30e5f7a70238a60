//! Produces runtime stalls of each cause and prints the watchdog's warnings
//! and counters: how the thresholds in `watchdog`'s module docs were
//! measured. Not a test: what it prints depends on the machine's load.
//!
//! ```sh
//! cargo run -p agentmesh-runtime --example stall_causes -- blocked   # std::thread::sleep(1.3 s)
//! cargo run -p agentmesh-runtime --example stall_causes -- busy      # a 1.3 s spin
//! cargo run -p agentmesh-runtime --example stall_causes -- busy2     # a 1.3 s spin on each of 2 workers
//! cargo run -p agentmesh-runtime --example stall_causes -- blocked2  # a sleep on each of 2 workers
//! # starved: CPU work on a core shared with other runnable processes, e.g.
//! for i in 1 2 3 4; do taskset -c 0 nice -n 10 timeout 12 sh -c 'while :; do :; done' & done
//! WORK_MS=300 nice -n 10 taskset -c 0 target/debug/examples/stall_causes work
//! ```
//!
//! `REPS` (default 2) stalls are produced, 300 ms apart.
#![allow(missing_docs)]

use std::time::Duration;

use agentmesh_runtime::watchdog;
use tokio::time::Instant;

const STALL: Duration = Duration::from_millis(1300);

fn spin_for(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::black_box(0u64);
    }
}

/// Spins until this thread has used `d` of CPU, however long that takes.
#[allow(unsafe_code)]
fn spin_cpu(d: Duration) {
    let now = || {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the call's duration.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    };
    let start = now();
    while now() - start < d {
        std::hint::black_box(0u64);
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    tracing_subscriber::fmt().with_target(false).init();
    let what = std::env::args().nth(1).unwrap_or_default();
    let two_workers = what.ends_with('2');
    let rt = if two_workers {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
    .expect("runtime");
    rt.block_on(async move {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = watchdog::StallMetrics::register(&mut registry);
        let probe = watchdog::spawn(metrics);
        let work: fn() = match what.as_str() {
            "blocked" | "blocked2" => || std::thread::sleep(STALL),
            "busy" | "busy2" => || spin_for(STALL),
            "work" => || {
                let start = Instant::now();
                spin_cpu(Duration::from_millis(env_u64("WORK_MS", 300)));
                eprintln!("work took {:?}", start.elapsed());
            },
            other => panic!("unknown situation {other:?}: blocked, busy, blocked2, busy2 or work"),
        };
        for _ in 0..env_u64("REPS", 2) {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let held = if two_workers { 2 } else { 1 };
            let tasks: Vec<_> = (0..held)
                .map(|_| tokio::spawn(async move { work() }))
                .collect();
            for t in tasks {
                t.await.expect("join");
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        probe.abort();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for line in text
            .lines()
            .filter(|l| l.starts_with("agentmesh_runtime_stall"))
        {
            println!("{line}");
        }
    });
}
