//! The watchdog's OS thread: it sees a stall while it lasts and reads what
//! the runtime threads are running ([`super::stacks`]).
//!
//! The probe task writes a heartbeat at every wake. This thread, off the
//! runtime, checks it every [`CHECK_EVERY`]; once it is [`super::STALL_THRESHOLD`]
//! overdue it reads the stacks of the runtime's threads (the ones
//! [`crate::runtime_builder`] registers, plus the thread that last ran the
//! probe) and logs the ones that were not idle. A stall that never ends (a
//! deadlock) is logged too, though the probe never wakes to report it: again
//! at 10 s overdue, then every minute.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::stacks::{self, CaptureError};

/// How often the thread looks at the heartbeat.
const CHECK_EVERY: Duration = Duration::from_millis(200);
/// How long one thread gets to answer.
const ANSWER_WITHIN: Duration = Duration::from_millis(200);
/// Threads read per sample at most (the rest are not read).
const MAX_THREADS: usize = 64;

/// Runtime threads of this process ([`register_thread`]).
static THREADS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Adds the calling thread to the threads a stall sample reads
/// ([`crate::runtime_builder`]'s `on_thread_start`).
pub(crate) fn register_thread() {
    let tid = stacks::current_tid();
    let mut t = THREADS.lock().unwrap_or_else(|p| p.into_inner());
    if !t.contains(&tid) {
        t.push(tid);
    }
}

/// Removes the calling thread (`on_thread_stop`).
pub(crate) fn unregister_thread() {
    let tid = stacks::current_tid();
    THREADS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|t| *t != tid);
}

/// Milliseconds since a process-wide start, for the heartbeat.
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    u64::try_from(START.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// What the probe and the thread share.
#[derive(Debug, Default)]
pub(super) struct Heartbeat {
    /// [`now_ms`] at the probe's last wake.
    beat_ms: AtomicU64,
    /// The thread that ran the probe last.
    probe_tid: AtomicI32,
}

impl Heartbeat {
    /// The probe woke, on the calling thread (after reading its counters:
    /// a moved beat tells the thread the probe's window is closed).
    pub(super) fn beat(&self) {
        self.probe_tid
            .store(stacks::current_tid(), Ordering::Relaxed);
        self.beat_ms.store(now_ms(), Ordering::Release);
    }
}

/// `agentmesh_runtime_stall_samples_total{result}` label values.
pub(super) const RESULTS: [&str; 3] = ["named", "all_idle", "unavailable"];

/// CPU time and context switches of every watchdog thread so far: the
/// probe takes them out of the process's counters, so reading stacks and
/// symbolizing them never changes the cause a stall is given.
static OWN_CPU_NS: AtomicU64 = AtomicU64::new(0);
static OWN_INVOLUNTARY: AtomicU64 = AtomicU64::new(0);
static OWN_VOLUNTARY: AtomicU64 = AtomicU64::new(0);

/// The watchdog threads' own CPU time and (involuntary, voluntary) switches.
pub(super) fn own_usage() -> (Duration, u64, u64) {
    (
        Duration::from_nanos(OWN_CPU_NS.load(Ordering::Acquire)),
        OWN_INVOLUNTARY.load(Ordering::Acquire),
        OWN_VOLUNTARY.load(Ordering::Acquire),
    )
}

/// The calling thread's CPU time (ns) and (involuntary, voluntary) switches.
fn thread_usage() -> Option<(u64, u64, u64)> {
    let (cpu, involuntary, voluntary) =
        super::usage(libc::CLOCK_THREAD_CPUTIME_ID, libc::RUSAGE_THREAD)?;
    Some((
        u64::try_from(cpu.as_nanos()).unwrap_or(u64::MAX),
        involuntary,
        voluntary,
    ))
}

/// Adds what this thread used since `prev` to the shared totals.
fn account(prev: &mut (u64, u64, u64)) {
    if let Some(now) = thread_usage() {
        OWN_CPU_NS.fetch_add(now.0.saturating_sub(prev.0), Ordering::AcqRel);
        OWN_INVOLUNTARY.fetch_add(now.1.saturating_sub(prev.1), Ordering::AcqRel);
        OWN_VOLUNTARY.fetch_add(now.2.saturating_sub(prev.2), Ordering::AcqRel);
        *prev = now;
    }
}

/// Starts the thread; it ends when `beat` is dropped (the probe stopped).
pub(super) fn spawn(
    beat: &Arc<Heartbeat>,
    samples: Family<[(&'static str, &'static str); 1], Counter>,
    last: Arc<Mutex<Option<String>>>,
) {
    let weak = Arc::downgrade(beat);
    let started = std::thread::Builder::new()
        .name("agentmesh-watchdog".into())
        .spawn(move || watch(&weak, &samples, &last));
    if let Err(e) = started {
        tracing::warn!(error = %e, "the stall watchdog cannot start its thread: stalls will not say what ran");
    }
}

/// Stacks read during a stall, not yet symbolized.
struct Captured {
    /// The heartbeat the stall is late against.
    beat: u64,
    /// How late the probe was when they were read.
    late: Duration,
    /// (thread id, thread name, instruction pointers) per thread that answered.
    stacks: Vec<(i32, String, Vec<usize>)>,
    /// Threads that did not answer.
    silent: usize,
}

fn watch(
    weak: &Weak<Heartbeat>,
    samples: &Family<[(&'static str, &'static str); 1], Counter>,
    last: &Mutex<Option<String>>,
) {
    let mut usage = thread_usage().unwrap_or_default();
    // (heartbeat sampled against, lateness at that sample)
    let mut sampled: Option<(u64, Duration)> = None;
    let mut pending: Option<Captured> = None;
    loop {
        std::thread::sleep(CHECK_EVERY);
        account(&mut usage);
        let Some(hb) = weak.upgrade() else { return };
        let beat = hb.beat_ms.load(Ordering::Acquire);
        let overdue = Duration::from_millis(now_ms().saturating_sub(beat));
        // The probe asks to wake every PROBE_INTERVAL; overdue beyond that is late.
        let late = overdue.saturating_sub(super::PROBE_INTERVAL);
        if late >= super::STALL_THRESHOLD && due(sampled, beat, late) && pending.is_none() {
            // Reading stacks takes microseconds per thread: do it while
            // the stall lasts, symbolize later.
            match capture_all(hb.probe_tid.load(Ordering::Relaxed)) {
                Some((stacks, silent)) => {
                    pending = Some(Captured {
                        beat,
                        late,
                        stacks,
                        silent,
                    });
                }
                None => report(
                    samples,
                    last,
                    late,
                    "unavailable",
                    "stacks cannot be read in this process".into(),
                ),
            }
            sampled = Some((beat, late));
            account(&mut usage);
        }
        // Symbolizing is CPU work: once the probe has closed its window
        // (the beat moved), or when the stall has lasted 10 s and may not end.
        let ready = pending
            .as_ref()
            .is_some_and(|p| p.beat != beat || late >= Duration::from_secs(10));
        if ready && let Some(p) = pending.take() {
            let (result, ran) = summarize_all(&p);
            report(samples, last, p.late, result, ran);
            account(&mut usage);
        }
    }
}

fn report(
    samples: &Family<[(&'static str, &'static str); 1], Counter>,
    last: &Mutex<Option<String>>,
    late: Duration,
    result: &'static str,
    ran: String,
) {
    samples.get_or_create(&[("result", result)]).inc();
    tracing::warn!(
        stalled_ms = late.as_millis() as u64,
        result,
        ran = %ran,
        "async runtime stall: what its threads were running while it lasted"
    );
    *last.lock().unwrap_or_else(|p| p.into_inner()) = Some(ran);
}

/// Whether a stall `late` past its heartbeat `beat` is sampled now: first at
/// the threshold, again at 10 s, then every minute.
fn due(sampled: Option<(u64, Duration)>, beat: u64, late: Duration) -> bool {
    match sampled {
        Some((b, at)) if b == beat => {
            let next = if at < Duration::from_secs(10) {
                Duration::from_secs(10)
            } else {
                at + Duration::from_secs(60)
            };
            late >= next
        }
        _ => true,
    }
}

/// Reads every runtime thread's stack; `None` if stacks cannot be read here.
#[allow(clippy::type_complexity)]
fn capture_all(probe_tid: i32) -> Option<(Vec<(i32, String, Vec<usize>)>, usize)> {
    let mut tids = THREADS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if probe_tid != 0 && !tids.contains(&probe_tid) {
        tids.push(probe_tid);
    }
    tids.truncate(MAX_THREADS);
    let (mut stacks, mut silent) = (Vec::new(), 0usize);
    for tid in tids {
        match stacks::capture(tid, ANSWER_WITHIN) {
            Ok(ips) => stacks.push((tid, thread_name(tid), ips)),
            Err(CaptureError::NoAnswer) => silent += 1,
            Err(CaptureError::Unavailable) => return None,
        }
    }
    Some((stacks, silent))
}

/// The `result` label and the text for stacks read in a stall.
fn summarize_all(p: &Captured) -> (&'static str, String) {
    let mut busy = Vec::new();
    let mut idle = 0usize;
    for (tid, name, ips) in &p.stacks {
        match stacks::summarize(&stacks::symbolize(ips)) {
            Some(s) => busy.push(format!("thread {tid} ({name}): {s}")),
            None => idle += 1,
        }
    }
    // The cache holds the binary's parsed debug info: kept across the
    // sample's threads, not worth its RSS between stalls.
    backtrace::clear_symbol_cache();
    let tail = format!("{idle} idle, {} did not answer", p.silent);
    if busy.is_empty() {
        (
            "all_idle",
            format!("no runtime thread was running our work ({tail})"),
        )
    } else {
        ("named", format!("{}; {tail}", busy.join("; ")))
    }
}

/// The thread's name (`/proc/self/task/TID/comm`), read on this OS thread.
fn thread_name(tid: i32) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_stall_is_sampled_at_the_threshold_at_10_s_then_every_minute() {
        let s = |secs| Duration::from_secs(secs);
        assert!(due(None, 7, s(1)));
        assert!(!due(Some((7, s(1))), 7, s(9)));
        assert!(due(Some((7, s(1))), 7, s(10)));
        assert!(!due(Some((7, s(10))), 7, s(69)));
        assert!(due(Some((7, s(10))), 7, s(70)));
        // A new stall (another heartbeat) is sampled at once.
        assert!(due(Some((7, s(70))), 9, s(1)));
    }
}
