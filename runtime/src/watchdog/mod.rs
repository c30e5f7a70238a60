//! Runtime stall watchdog.
//!
//! A probe task asks to wake every [`PROBE_INTERVAL`]. When it wakes late by
//! [`STALL_THRESHOLD`] or more, the async runtime did not run a runnable
//! task for that long: the probe logs a warning and counts the stall in
//! `agentmesh_runtime_stalls_total{cause}` and
//! `agentmesh_runtime_stall_seconds`. One probe per process, pinned by
//! nothing but the scheduler; with work-stealing a stall of one worker is
//! seen when the probe happened to be queued on it (or when every worker
//! was held), which is what the counter then reports: stalls that delayed
//! runnable tasks.
//!
//! # Why the probe was late
//!
//! A late wake-up alone does not say whether our code held a worker thread
//! or the machine did not run the process. At every wake the probe reads
//! two per-process kernel counters with one system call each (no file I/O
//! on the runtime): the CPU time of all the process's threads
//! (`clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`) and their context switches
//! (`getrusage(RUSAGE_SELF)`: involuntary — taken off a CPU while still
//! runnable — and voluntary — gave it up to wait). A stall is classified
//! over the window since the previous wake (≈ the stall plus one interval)
//! by [`classify`], first match wins:
//!
//! 1. [`StallCause::Busy`]: the process used at least
//!    [`BUSY_MIN_CPU_SHARE`] of one core over the window. It had CPU, so
//!    its own work is what the probe queued behind: a long poll (a loop or
//!    a slow hash without an await) or more runnable work than workers.
//!    Checked first: when the process had that much CPU, fixing our work
//!    removes the stall even if the machine was busy as well.
//! 2. [`StallCause::Starved`]: less CPU than that, and at least
//!    [`STARVED_MIN_INVOLUNTARY_PER_SEC`] involuntary context switches per
//!    second of window: threads were runnable but the kernel kept taking
//!    them off the CPU. The machine's CPUs were saturated by other
//!    processes, or a cgroup CPU limit throttled the process (CFS quota
//!    takes every running thread off the CPU when the quota of a 100 ms
//!    period is spent).
//! 3. [`StallCause::Blocked`]: little CPU and few involuntary switches: the
//!    process was neither running nor waiting for a CPU. A thread waited
//!    inside a blocking call on a worker (`std::thread::sleep`, sync file
//!    or database I/O, a contended lock). The kernel cannot tell this from
//!    a process that was stopped (SIGSTOP, a debugger, the cgroup freezer)
//!    or a virtual machine its host did not run: those read as blocked too.
//!
//! [`StallCause::Unknown`] only if the counters could not be read.
//!
//! The thresholds come from producing each situation on a 2-core VM
//! shared with other builds (`cargo run -p agentmesh-runtime --example
//! stall_causes`; the module tests use these numbers):
//!
//! | situation (stall ≈ 1.3 s) | CPU in window | involuntary switches |
//! |---|---|---|
//! | `std::thread::sleep` on the only worker, or on both of two | 0 ms (0 core) | 0–2 |
//! | a 1.3 s spin on one worker | 1,288–1,298 ms in 1.4 s (0.9 core) | 24–108 |
//! | a 1.3 s spin on each of two workers | 1,251–2,543 ms in 1.3–1.4 s (0.9–1.9 cores) | 345–1,449 |
//! | 300 ms of CPU work, core shared with 4 equal-priority spinners | 300 ms in 1.6 s (0.19 core) | 206–210 (≈ 130/s) |
//! | 60 ms of CPU work at the lowest priority (`SCHED_IDLE`) behind 1 spinner | 60 ms in 2.3 s (0.03 core) | 42 (18/s) |
//!
//! A busy process is preempted often on a shared machine too, which is why
//! CPU share decides first. Half a core is the line because a process that
//! got at least half of the window on CPU would still have stalled for at
//! least half as long with a whole core to itself. CFS throttling was not
//! reproduced (no cgroup control where this was measured): a thread running
//! when its cgroup's quota is spent is taken off the CPU still runnable,
//! one involuntary switch per thread per throttled 100 ms period, so a
//! process throttled through a stall shows at least 10 per second, twice
//! the starved line. A CPU limit of half a core or more that the process
//! used up reads as busy.
//! A thread that only waited for a CPU after waking from idle, without
//! being preempted, would read as blocked; in the measurements a timer
//! wake-up at the lowest priority behind a spinner was never that late.
//!
//! # What ran
//!
//! While a stall lasts, the watchdog's own OS thread reads the stacks of
//! the runtime's threads (a signal asks each for its stack; [`stacks`] and
//! [`monitor`] say how) and, once the stall is over, logs the ones that were
//! running something other than the runtime's idle loop, with source lines:
//! `ran = "thread 123 (tokio-rt-worker): [in clock_nanosleep] load
//! (controlplane/src/store/sqlite.rs:88) <- …"`.
//! `agentmesh_runtime_stall_samples_total{result}` counts the reads. A stall
//! that never ends is still logged (at 10 s, then every minute). The
//! watchdog threads' own CPU time and context switches are taken out of the
//! process counters above, so reading stacks never changes a stall's cause.
//!
//! In a multi-thread runtime the counters are the whole process's: a stall
//! caused by one blocked worker while the others were busy reads as busy
//! (the probe also waited behind their work), and the log line's alive
//! tasks and global queue depth say how much work was waiting.

mod monitor;
mod stacks;

pub(crate) use monitor::{register_thread, unregister_thread};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How often the probe asks to run.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// A wake-up this late is a stall.
pub const STALL_THRESHOLD: Duration = Duration::from_secs(1);
/// A stall is [`StallCause::Busy`] when the process used at least this
/// share of one core (CPU seconds per wall second, all threads) over the
/// window: 0.5.
pub const BUSY_MIN_CPU_SHARE: f64 = 0.5;
/// A stall that is not busy is [`StallCause::Starved`] with at least this
/// many involuntary context switches per wall second of the window: 5
/// (half of one per 100 ms CFS period).
pub const STARVED_MIN_INVOLUNTARY_PER_SEC: f64 = 5.0;

/// Why the probe woke late, from the process's CPU time and context
/// switches over the window (see the [module docs](self) for the rule).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallCause {
    /// The process was on CPU: our own work delayed the probe.
    Busy,
    /// Runnable but not run: the machine's CPUs or a CPU limit.
    Starved,
    /// Neither on CPU nor waiting for it: a blocking call (or a stopped process).
    Blocked,
    /// The process counters could not be read.
    Unknown,
}

impl StallCause {
    /// Every cause, in label order.
    pub const ALL: [StallCause; 4] = [
        StallCause::Busy,
        StallCause::Starved,
        StallCause::Blocked,
        StallCause::Unknown,
    ];

    /// The `cause` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            StallCause::Busy => "busy",
            StallCause::Starved => "starved",
            StallCause::Blocked => "blocked",
            StallCause::Unknown => "unknown",
        }
    }

    /// What the counters showed, for the log line.
    fn reading(self) -> &'static str {
        match self {
            StallCause::Busy => {
                "the process was on CPU: a long poll or more runnable work than workers"
            }
            StallCause::Starved => {
                "the process was runnable but not run: CPUs saturated or a CPU limit throttled it"
            }
            StallCause::Blocked => {
                "the process was neither on CPU nor waiting for one: a thread waited in a blocking call (or the process or VM was paused)"
            }
            StallCause::Unknown => "the process counters could not be read",
        }
    }
}

/// What the process did between two probe wake-ups.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StallWindow {
    /// Wall time from the previous wake-up to this one.
    pub wall: Duration,
    /// CPU time used by all the process's threads in it.
    pub cpu: Duration,
    /// Involuntary context switches in it (taken off a CPU while runnable).
    pub involuntary_switches: u64,
    /// Voluntary context switches in it (gave the CPU up to wait).
    pub voluntary_switches: u64,
}

impl StallWindow {
    /// CPU seconds per wall second (1.0 = one core all the time).
    pub fn cpu_share(&self) -> f64 {
        let wall = self.wall.as_secs_f64();
        if wall > 0.0 {
            self.cpu.as_secs_f64() / wall
        } else {
            0.0
        }
    }
}

/// Classifies a stall by what the process did in its window (module docs).
pub fn classify(w: &StallWindow) -> StallCause {
    if w.cpu_share() >= BUSY_MIN_CPU_SHARE {
        return StallCause::Busy;
    }
    let involuntary_per_sec = w.involuntary_switches as f64 / w.wall.as_secs_f64().max(1e-9);
    if involuntary_per_sec >= STARVED_MIN_INVOLUNTARY_PER_SEC {
        StallCause::Starved
    } else {
        StallCause::Blocked
    }
}

/// The watchdog's metrics.
#[derive(Clone, Debug)]
pub struct StallMetrics {
    /// `agentmesh_runtime_stalls_total{cause}`: every [`StallCause`]
    /// created at 0.
    pub stalls: Family<[(&'static str, &'static str); 1], Counter>,
    /// `agentmesh_runtime_stall_seconds`: length of each stall seen.
    pub stall_seconds: Histogram,
    /// `agentmesh_runtime_stall_samples_total{result}`: reads of the
    /// runtime threads' stacks during a stall (`named`: some thread was
    /// running our work and the log names it; `all_idle`: none was, the
    /// process was not run; `unavailable`: stacks cannot be read here).
    pub stall_samples: Family<[(&'static str, &'static str); 1], Counter>,
    last_stacks: Arc<Mutex<Option<String>>>,
}

impl StallMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            stalls: Family::default(),
            stall_seconds: Histogram::new([1.0, 2.0, 5.0, 10.0, 30.0]),
            stall_samples: Family::default(),
            last_stacks: Arc::default(),
        };
        for cause in StallCause::ALL {
            let _ = m.stalls.get_or_create(&[("cause", cause.as_str())]);
        }
        for result in monitor::RESULTS {
            let _ = m.stall_samples.get_or_create(&[("result", result)]);
        }
        registry.register(
            "agentmesh_runtime_stalls",
            "Times the async runtime could not run a probe task for 1 s or more, by cause \
             (busy: the process was on CPU; starved: runnable but not run; blocked: neither; unknown: counters unreadable)",
            m.stalls.clone(),
        );
        registry.register(
            "agentmesh_runtime_stall_seconds",
            "Length of each runtime stall seen by the watchdog",
            m.stall_seconds.clone(),
        );
        registry.register(
            "agentmesh_runtime_stall_samples",
            "Reads of the runtime threads' stacks while a stall lasted, by result \
             (named: the log says what ran; all_idle: no thread ran our work; unavailable: stacks unreadable)",
            m.stall_samples.clone(),
        );
        m
    }

    /// What the runtime threads were running at the last stall sample
    /// (the `ran` of the watchdog's warnings), if there was one.
    pub fn last_stacks(&self) -> Option<String> {
        self.last_stacks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stalls counted with `cause` so far.
    pub fn stalls_with(&self, cause: StallCause) -> u64 {
        self.stalls
            .get_or_create(&[("cause", cause.as_str())])
            .get()
    }
}

/// Starts the probe on the current runtime, and the OS thread that reads
/// what ran while a stall lasts; abort the handle to stop both.
pub fn spawn(metrics: StallMetrics) -> JoinHandle<()> {
    let heartbeat = Arc::new(monitor::Heartbeat::default());
    heartbeat.beat();
    monitor::spawn(
        &heartbeat,
        metrics.stall_samples.clone(),
        metrics.last_stacks.clone(),
    );
    tokio::spawn(async move {
        let runtime = tokio::runtime::Handle::current().metrics();
        let mut last = (Instant::now(), ProcessCounters::read());
        let mut expected = last.0 + PROBE_INTERVAL;
        loop {
            tokio::time::sleep_until(expected).await;
            let now = (Instant::now(), ProcessCounters::read());
            heartbeat.beat();
            let late = now.0.saturating_duration_since(expected);
            if late >= STALL_THRESHOLD {
                let window = match (last.1, now.1) {
                    (Some(a), Some(b)) => Some(b.since(&a, now.0.duration_since(last.0))),
                    _ => None,
                };
                let cause = record(&metrics, late, window.as_ref());
                let w = window.unwrap_or_default();
                tracing::warn!(
                    cause = cause.as_str(),
                    stall_ms = late.as_millis() as u64,
                    window_ms = w.wall.as_millis() as u64,
                    cpu_ms = w.cpu.as_millis() as u64,
                    involuntary_switches = w.involuntary_switches,
                    voluntary_switches = w.voluntary_switches,
                    alive_tasks = runtime.num_alive_tasks(),
                    global_queue_depth = runtime.global_queue_depth(),
                    workers = runtime.num_workers(),
                    reading = cause.reading(),
                    "async runtime stall: the watchdog probe woke late"
                );
            }
            last = now;
            expected = last.0 + PROBE_INTERVAL;
        }
    })
}

/// Counts a stall of length `late` (at least [`STALL_THRESHOLD`]) with the
/// cause its window shows ([`StallCause::Unknown`] without one).
fn record(metrics: &StallMetrics, late: Duration, window: Option<&StallWindow>) -> StallCause {
    let cause = window.map_or(StallCause::Unknown, classify);
    metrics
        .stalls
        .get_or_create(&[("cause", cause.as_str())])
        .inc();
    metrics.stall_seconds.observe(late.as_secs_f64());
    cause
}

/// The process's cumulative CPU time and context switches, all threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ProcessCounters {
    cpu: Duration,
    involuntary: u64,
    voluntary: u64,
}

impl ProcessCounters {
    /// Reads the counters: two system calls, no file I/O. `None` if either fails.
    fn read() -> Option<Self> {
        let (cpu, involuntary, voluntary) =
            usage(libc::CLOCK_PROCESS_CPUTIME_ID, libc::RUSAGE_SELF)?;
        // Without the watchdog threads' own work (reading and symbolizing
        // stacks), which is not what the runtime waited for.
        let (own_cpu, own_involuntary, own_voluntary) = monitor::own_usage();
        Some(Self {
            cpu: cpu.saturating_sub(own_cpu),
            involuntary: involuntary.saturating_sub(own_involuntary),
            voluntary: voluntary.saturating_sub(own_voluntary),
        })
    }

    /// The window from `earlier` to `self`, `wall` long.
    fn since(&self, earlier: &Self, wall: Duration) -> StallWindow {
        StallWindow {
            wall,
            cpu: self.cpu.saturating_sub(earlier.cpu),
            involuntary_switches: self.involuntary.saturating_sub(earlier.involuntary),
            voluntary_switches: self.voluntary.saturating_sub(earlier.voluntary),
        }
    }
}

/// CPU time on `clock` and (involuntary, voluntary) context switches of
/// `who` (`RUSAGE_SELF`: the process; `RUSAGE_THREAD`: the calling thread).
/// Two system calls, no file I/O; `None` if either fails.
#[allow(unsafe_code)]
pub(super) fn usage(clock: libc::clockid_t, who: libc::c_int) -> Option<(Duration, u64, u64)> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    // SAFETY: all-zero bytes are a valid `rusage` (integers and timevals).
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage for the call's duration.
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return None;
    }
    Some((
        Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        ),
        u64::try_from(ru.ru_nivcsw).unwrap_or(0),
        u64::try_from(ru.ru_nvcsw).unwrap_or(0),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(wall_ms: u64, cpu_ms: u64, involuntary: u64) -> StallWindow {
        StallWindow {
            wall: Duration::from_millis(wall_ms),
            cpu: Duration::from_millis(cpu_ms),
            involuntary_switches: involuntary,
            voluntary_switches: 3,
        }
    }

    #[test]
    fn measured_stalls_get_their_cause() {
        // The module docs' table: (window ms, CPU ms, involuntary switches).
        for (wall, cpu, invol, cause) in [
            (1399, 0, 0, StallCause::Blocked), // std::thread::sleep, one worker
            (1398, 0, 2, StallCause::Blocked), // std::thread::sleep, both workers
            (1399, 1288, 108, StallCause::Busy), // spin on one worker
            (1398, 1298, 24, StallCause::Busy),
            (1301, 2391, 1449, StallCause::Busy), // spin on both workers
            (1593, 300, 206, StallCause::Starved), // 1 of 5 equal spinners
            (2305, 60, 42, StallCause::Starved),  // SCHED_IDLE behind a spinner
        ] {
            assert_eq!(
                classify(&window(wall, cpu, invol)),
                cause,
                "{wall} {cpu} {invol}"
            );
        }
    }

    #[test]
    fn causes_follow_cpu_share_then_involuntary_switches() {
        // A long poll on a shared core that still got half of one: busy
        // wins over the preemptions.
        assert_eq!(classify(&window(2000, 1000, 300)), StallCause::Busy);
        // Two workers each at a quarter core (a multi-thread process).
        assert_eq!(classify(&window(1200, 600, 0)), StallCause::Busy);
        // CFS quota of 250m: one forced switch per 100 ms period.
        assert_eq!(classify(&window(1100, 275, 11)), StallCause::Starved);
        // A few preemptions of other threads are not starvation.
        assert_eq!(classify(&window(1400, 30, 6)), StallCause::Blocked);
    }

    #[test]
    fn thresholds_are_inclusive() {
        assert_eq!(classify(&window(1000, 500, 0)), StallCause::Busy);
        assert_eq!(classify(&window(1000, 499, 5)), StallCause::Starved);
        assert_eq!(classify(&window(1000, 499, 4)), StallCause::Blocked);
        assert_eq!(classify(&window(2000, 999, 9)), StallCause::Blocked);
        assert_eq!(classify(&window(2000, 999, 10)), StallCause::Starved);
    }

    #[test]
    fn an_empty_window_is_blocked_not_a_division_by_zero() {
        assert_eq!(classify(&StallWindow::default()), StallCause::Blocked);
        assert_eq!(StallWindow::default().cpu_share(), 0.0);
    }

    #[test]
    fn a_window_is_the_difference_of_two_readings() {
        let a = ProcessCounters {
            cpu: Duration::from_millis(400),
            involuntary: 10,
            voluntary: 100,
        };
        let b = ProcessCounters {
            cpu: Duration::from_millis(650),
            involuntary: 17,
            voluntary: 102,
        };
        let w = b.since(&a, Duration::from_millis(1250));
        assert_eq!(w, window_with(1250, 250, 7, 2));
        assert!((w.cpu_share() - 0.2).abs() < 1e-9);
        // Counters never run backwards, but a reading pair out of order
        // gives an empty window rather than a panic.
        assert_eq!(a.since(&b, Duration::ZERO), StallWindow::default());
    }

    fn window_with(wall_ms: u64, cpu_ms: u64, involuntary: u64, voluntary: u64) -> StallWindow {
        StallWindow {
            voluntary_switches: voluntary,
            ..window(wall_ms, cpu_ms, involuntary)
        }
    }

    #[test]
    fn the_process_counters_read_and_grow_with_cpu_work() {
        let a = ProcessCounters::read().expect("read");
        // Spin until the process's own CPU clock has moved by 20 ms.
        let mut b = a;
        while b.cpu < a.cpu + Duration::from_millis(20) {
            b = ProcessCounters::read().expect("read");
        }
        assert!(b.involuntary >= a.involuntary && b.voluntary >= a.voluntary);
        std::thread::sleep(Duration::from_millis(5));
        let c = ProcessCounters::read().expect("read");
        assert!(c.voluntary > b.voluntary, "a sleep is a voluntary switch");
    }

    #[test]
    fn every_stall_counts_once_with_its_cause_and_all_causes_start_at_zero() {
        let mut reg = Registry::default();
        let m = StallMetrics::register(&mut reg);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).expect("encode");
        for cause in StallCause::ALL {
            let line = format!(
                "agentmesh_runtime_stalls_total{{cause=\"{}\"}} 0",
                cause.as_str()
            );
            assert!(text.contains(&line), "{line} missing:\n{text}");
        }
        let late = Duration::from_millis(1500);
        assert_eq!(
            record(&m, late, Some(&window(1600, 1500, 0))),
            StallCause::Busy
        );
        assert_eq!(record(&m, late, None), StallCause::Unknown);
        assert_eq!(m.stalls_with(StallCause::Busy), 1);
        assert_eq!(m.stalls_with(StallCause::Unknown), 1);
        assert_eq!(m.stalls_with(StallCause::Blocked), 0);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).expect("encode");
        assert!(
            text.contains("agentmesh_runtime_stall_seconds_count 2"),
            "{text}"
        );
    }

    /// Holds the runtime's only worker in a blocking wait until the
    /// watchdog has read what it runs (at most 60 s). The watchdog
    /// symbolizes once the probe runs again or after 10 s of stall, so
    /// this ends after ≈ 10 s, with no timing to race.
    #[inline(never)]
    fn hold_the_worker_until_read(m: &StallMetrics) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while m.last_stacks().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_stall_names_the_function_that_held_the_worker() {
        let rt = crate::runtime_builder()
            .worker_threads(1)
            .build()
            .expect("runtime");
        let mut reg = Registry::default();
        let m = StallMetrics::register(&mut reg);
        let probe = {
            let _in = rt.enter();
            spawn(m.clone())
        };
        let held = m.clone();
        rt.block_on(async move {
            // Let the probe beat once, then take the worker away from it.
            tokio::time::sleep(Duration::from_millis(150)).await;
            tokio::spawn(async move { hold_the_worker_until_read(&held) })
                .await
                .expect("join");
        });
        probe.abort();
        let ran = m
            .last_stacks()
            .expect("the watchdog read the stacks within 60 s");
        // Bare name (optimised build, from debug info) or path (symbol table).
        assert!(
            ran.starts_with("thread ")
                && (ran.contains("] hold_the_worker_until_read (runtime/src/watchdog/mod.rs:")
                    || ran.contains(
                        "] agentmesh_runtime::watchdog::tests::hold_the_worker_until_read (runtime/src/watchdog/mod.rs:"
                    )),
            "{ran}"
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).expect("encode");
        for line in [
            "agentmesh_runtime_stall_samples_total{result=\"all_idle\"} 0",
            "agentmesh_runtime_stall_samples_total{result=\"unavailable\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        assert!(
            m.stall_samples.get_or_create(&[("result", "named")]).get() >= 1,
            "{text}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_worker_held_by_a_blocking_call_is_a_blocked_stall() {
        let mut reg = Registry::default();
        let m = StallMetrics::register(&mut reg);
        let probe = spawn(m.clone());
        // Let the probe arm its first timer, then hold the only worker thread
        // in a blocking call: no CPU, no preemption.
        tokio::time::sleep(Duration::from_millis(150)).await;
        std::thread::sleep(Duration::from_millis(1300));
        // Give the probe its chance to wake (deadline-bounded wait, no timing assert).
        let deadline = Instant::now() + Duration::from_secs(10);
        while m.stalls_with(StallCause::Blocked) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        probe.abort();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).expect("encode");
        for (cause, n) in [("blocked", 1), ("busy", 0), ("starved", 0), ("unknown", 0)] {
            let line = format!("agentmesh_runtime_stalls_total{{cause=\"{cause}\"}} {n}");
            assert!(text.contains(&line), "{line} missing:\n{text}");
        }
        assert!(
            text.contains("agentmesh_runtime_stall_seconds_count 1"),
            "{text}"
        );
    }
}
