//! What a runtime thread is running, read from its stack while a stall
//! lasts: the watchdog's "what ran".
//!
//! A late probe only says *that* the runtime stalled; by the time it wakes
//! the stall is over and whatever held the worker has returned. So the
//! watchdog's own OS thread (see [`super::monitor`]) watches the probe's
//! heartbeat and, while it is overdue, asks each runtime thread for its
//! stack: it sends the thread [`SIGNAL`] with `tgkill`, and the handler
//! here walks the interrupted thread's stack into a fixed array of
//! instruction pointers (no allocation, no lock). Symbolizing and summing
//! up happen afterwards on the watchdog thread, never in the handler and
//! never on the runtime.
//!
//! The walk uses the unwinder in the signal handler, as sampling profilers
//! do; on glibc ≥ 2.35 with GCC ≥ 12's unwinder it finds frame tables with
//! `_dl_find_object`, which takes no lock. A handler is installed only if
//! nothing else owns [`SIGNAL`], and only one capture runs at a time.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The signal that asks a thread for its stack. `SIGURG`'s default action
/// is to ignore it, so one that arrives after the handler is gone (or in a
/// process without it) does nothing.
pub(super) const SIGNAL: libc::c_int = libc::SIGURG;

/// Frames kept per stack, innermost first (handler frames included).
const MAX_FRAMES: usize = 64;

static IPS: [AtomicUsize; MAX_FRAMES] = [const { AtomicUsize::new(0) }; MAX_FRAMES];
static LEN: AtomicUsize = AtomicUsize::new(0);
/// The thread asked for its stack (its kernel thread id).
static TARGET: AtomicI32 = AtomicI32::new(0);
static STATE: AtomicU8 = AtomicU8::new(IDLE);
const IDLE: u8 = 0;
const ASKED: u8 = 1;
const WRITING: u8 = 2;
const DONE: u8 = 3;
/// Set for good when a handler never finished: no more captures.
static POISONED: AtomicBool = AtomicBool::new(false);
/// One capture at a time in the process (several runtimes may each watch).
static CAPTURE: Mutex<()> = Mutex::new(());
static INSTALLED: OnceLock<bool> = OnceLock::new();

/// Why a stack could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CaptureError {
    /// No handler: another part of the process owns [`SIGNAL`], or a
    /// handler never returned earlier.
    Unavailable,
    /// The thread did not run its handler in time (stuck in the kernel,
    /// or already gone).
    NoAnswer,
}

/// The calling thread's kernel thread id.
#[allow(unsafe_code)]
pub(super) fn current_tid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    i32::try_from(unsafe { libc::syscall(libc::SYS_gettid) }).unwrap_or(0)
}

#[allow(unsafe_code)]
extern "C" fn on_signal(_: libc::c_int) {
    // Async-signal context: atomics and the unwinder only. errno is kept
    // for the interrupted code.
    // SAFETY: __errno_location returns this thread's errno slot.
    let errno = unsafe { *libc::__errno_location() };
    if TARGET.load(Ordering::Acquire) == current_tid()
        && STATE
            .compare_exchange(ASKED, WRITING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    {
        let mut n = 0;
        // SAFETY: the closure only stores into atomics; no allocation, no
        // lock, nothing that could re-enter code the interrupted thread
        // was in.
        unsafe {
            backtrace::trace_unsynchronized(|frame| {
                IPS[n].store(frame.ip() as usize, Ordering::Relaxed);
                n += 1;
                n < MAX_FRAMES
            });
        }
        LEN.store(n, Ordering::Relaxed);
        STATE.store(DONE, Ordering::Release);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Installs the handler once per process, unless [`SIGNAL`] already has one.
#[allow(unsafe_code)]
fn installed() -> bool {
    *INSTALLED.get_or_init(|| {
        // SAFETY: all-zero bytes are a valid `sigaction`; the calls get
        // valid pointers for their duration.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(SIGNAL, std::ptr::null(), &mut old) != 0 {
                return false;
            }
            if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN {
                tracing::warn!(
                    signal = SIGNAL,
                    "the stall watchdog cannot read stacks: the signal it uses has a handler already"
                );
                return false;
            }
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            // Interrupted system calls restart, so the threads asked lose nothing.
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(SIGNAL, &act, std::ptr::null_mut()) == 0
        }
    })
}

/// The instruction pointers of thread `tid`'s stack, innermost first;
/// waits at most `wait` for the thread to answer. Blocking: call it from
/// the watchdog's OS thread, never from the runtime.
#[allow(unsafe_code)]
pub(super) fn capture(tid: i32, wait: Duration) -> Result<Vec<usize>, CaptureError> {
    let _one = CAPTURE.lock().unwrap_or_else(|p| p.into_inner());
    if POISONED.load(Ordering::Acquire) || !installed() {
        return Err(CaptureError::Unavailable);
    }
    TARGET.store(tid, Ordering::Release);
    STATE.store(ASKED, Ordering::Release);
    // SAFETY: tgkill with this process's id, a thread id and a signal number.
    let sent = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, SIGNAL) };
    if sent != 0 {
        STATE.store(IDLE, Ordering::Release);
        return Err(CaptureError::NoAnswer);
    }
    let asked_at = Instant::now();
    loop {
        match STATE.load(Ordering::Acquire) {
            DONE => {
                let n = LEN.load(Ordering::Relaxed);
                let ips = IPS[..n]
                    .iter()
                    .map(|ip| ip.load(Ordering::Relaxed))
                    .collect();
                STATE.store(IDLE, Ordering::Release);
                return Ok(ips);
            }
            ASKED
                if asked_at.elapsed() >= wait
                    && STATE
                        .compare_exchange(ASKED, IDLE, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok() =>
            {
                return Err(CaptureError::NoAnswer);
            }
            WRITING if asked_at.elapsed() >= wait + Duration::from_secs(1) => {
                // A walk that does not end: never ask again.
                POISONED.store(true, Ordering::Release);
                return Err(CaptureError::Unavailable);
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// One frame of a stack: function name and, where debug info says, the
/// source file and line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Frame {
    /// Demangled name without hash; `?` where there is no symbol.
    pub(super) name: String,
    /// Source file, if known.
    pub(super) file: Option<String>,
    /// Line in `file`.
    pub(super) line: Option<u32>,
}

/// The frames at `ips` (innermost first; an inlined function gets a frame
/// of its own, innermost first). CPU-bound: it parses the binary's debug
/// info (cached by `backtrace` until `clear_symbol_cache`), so it runs on
/// the watchdog's thread and after the stall.
pub(super) fn symbolize(ips: &[usize]) -> Vec<Frame> {
    let mut frames = Vec::with_capacity(ips.len());
    for (i, ip) in ips.iter().enumerate() {
        // Past the first frame an address is a return address: the call
        // is the instruction before it.
        let at = if i == 0 { *ip } else { ip.saturating_sub(1) };
        let before = frames.len();
        backtrace::resolve(at as *mut std::ffi::c_void, |sym| {
            frames.push(Frame {
                name: sym
                    .name()
                    .map_or_else(|| "?".to_string(), |n| format!("{n:#}")),
                file: sym.filename().map(|f| f.display().to_string()),
                line: sym.lineno(),
            });
        });
        if frames.len() == before {
            frames.push(Frame {
                name: "?".into(),
                ..Frame::default()
            });
        }
    }
    frames
}

/// What a stack says the thread was doing: `None` when it was idle (parked
/// by the runtime, waiting for I/O events or for blocking work), else its
/// innermost frames of interest, innermost first, joined with ` <- `,
/// after the system call it sat in if it was in one.
pub(super) fn summarize(frames: &[Frame]) -> Option<String> {
    // Drop the handler's own frames and the signal trampoline.
    let start = frames
        .iter()
        .rposition(|f| f.name == "on_signal" || f.name.ends_with("::on_signal"))
        .map_or(0, |i| i + 1);
    let mut frames = &frames[start..];
    if frames
        .first()
        .is_some_and(|f| f.name == "?" || f.name.contains("restore_rt"))
    {
        frames = &frames[1..];
    }
    let first = frames.iter().position(|f| !is_plumbing(f))?;
    if is_idle(&frames[first]) {
        return None;
    }
    let call = frames[..first]
        .iter()
        .find(|f| is_c(f) && f.name != "?")
        .map(|c| format!("[in {}] ", c.name));
    let mut shown: Vec<String> = Vec::new();
    for f in &frames[first..] {
        if is_plumbing(f) || is_idle(f) {
            continue;
        }
        let text = describe(f);
        if shown.last() != Some(&text) {
            shown.push(text);
        }
        if shown.len() == 6 {
            break;
        }
    }
    Some(format!(
        "{}{}",
        call.unwrap_or_default(),
        shown.join(" <- ")
    ))
}

/// `name (file:line)`, the file from its crate's directory on.
fn describe(f: &Frame) -> String {
    match (&f.file, f.line) {
        (Some(file), Some(line)) => format!("{} ({}:{line})", f.name, short_path(file)),
        _ => f.name.clone(),
    }
}

/// A source path from the crate's directory on: `tokio-1.47.1/src/…` for a
/// registry crate, `router/src/…` for ours (the part after `src/`'s parent).
fn short_path(file: &str) -> &str {
    let Some(src) = file.rfind("/src/") else {
        return file;
    };
    let crate_dir = file[..src].rfind('/').map_or(0, |i| i + 1);
    &file[crate_dir..]
}

/// A frame of the C library: no source file, or a relative one (glibc's
/// debug info names its sources `./time/…`; Rust's are absolute).
fn is_c(f: &Frame) -> bool {
    f.file.as_deref().is_none_or(|file| !file.starts_with('/'))
}

/// Frames that say nothing about whose work it is: the C library, the
/// standard library (sources under `/rustc/`), the unwinder, futures'
/// combinators.
fn is_plumbing(f: &Frame) -> bool {
    is_c(f)
        || f.file.as_deref().is_some_and(|file| {
            file.starts_with("/rustc/")
                || ["/backtrace-", "/futures-util-", "/futures-core-"]
                    .iter()
                    .any(|c| file.contains(c))
        })
}

/// Frames of a thread with nothing to do: tokio's scheduler, parker, I/O
/// driver and blocking pool, mio's poll, parking_lot.
fn is_idle(f: &Frame) -> bool {
    f.file.as_deref().is_some_and(|file| {
        ["/tokio-1.", "/mio-", "/parking_lot"]
            .iter()
            .any(|c| file.contains(c))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const REG: &str = "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f";

    /// A frame `name` from `file` (`None`: the C library) at line 7.
    fn fr(name: &str, file: Option<&str>) -> Frame {
        Frame {
            name: name.into(),
            file: file.map(String::from),
            line: file.map(|_| 7),
        }
    }

    fn std_(name: &str) -> Frame {
        fr(
            name,
            Some("/rustc/59807616e/library/std/src/thread/functions.rs"),
        )
    }

    fn tokio(name: &str) -> Frame {
        fr(
            name,
            Some(&format!("{REG}/tokio-1.47.1/src/runtime/park.rs")),
        )
    }

    fn ours(name: &str, file: &str) -> Frame {
        fr(name, Some(&format!("/work/main/{file}")))
    }

    #[test]
    fn a_sleeping_caller_is_named_with_its_system_call_and_source() {
        let f = [
            fr(
                "trace",
                Some(&format!("{REG}/backtrace-0.3.75/src/backtrace/mod.rs")),
            ),
            ours("on_signal", "runtime/src/watchdog/stacks.rs"),
            fr("?", None),
            fr(
                "__GI___clock_nanosleep",
                Some("./time/../sysdeps/unix/sysv/linux/clock_nanosleep.c"),
            ),
            std_("std::sys::thread::unix::sleep"),
            std_("std::thread::functions::sleep"),
            ours("verify", "router/src/auth/mod.rs"),
            ours("verify", "router/src/auth/mod.rs"),
            ours("{closure#0}", "router/src/swarm/event_loop.rs"),
            tokio("poll<…>"),
            fr("start_thread", Some("./nptl/pthread_create.c")),
        ];
        assert_eq!(
            summarize(&f).as_deref(),
            Some(
                "[in __GI___clock_nanosleep] verify (router/src/auth/mod.rs:7) <- {closure#0} (router/src/swarm/event_loop.rs:7)"
            )
        );
    }

    #[test]
    fn parked_and_polling_threads_are_idle() {
        let parked = [
            ours("on_signal", "runtime/src/watchdog/stacks.rs"),
            fr("syscall", None),
            std_("std::sys::pal::unix::futex::futex_wait"),
            std_("std::sync::condvar::Condvar::wait"),
            tokio("tokio::runtime::park::Inner::park"),
            tokio("tokio::runtime::scheduler::multi_thread::worker::Context::park"),
        ];
        assert_eq!(summarize(&parked), None);
        let polling = [
            fr("epoll_wait", None),
            fr(
                "select",
                Some(&format!("{REG}/mio-1.0.4/src/sys/unix/selector/epoll.rs")),
            ),
            tokio("turn"),
        ];
        assert_eq!(summarize(&polling), None);
        assert_eq!(
            summarize(&[fr("?", None), fr("clock_nanosleep", None)]),
            None
        );
    }

    #[test]
    fn a_busy_library_frame_is_named_first() {
        let f = [
            fr(
                "compress256",
                Some(&format!("{REG}/sha2-0.10.9/src/sha256/soft.rs")),
            ),
            ours("hash", "controlplane/src/tokens.rs"),
            ours("enroll", "controlplane/src/enroll.rs"),
        ];
        assert_eq!(
            summarize(&f).as_deref(),
            Some(
                "compress256 (sha2-0.10.9/src/sha256/soft.rs:7) <- hash (controlplane/src/tokens.rs:7) <- enroll (controlplane/src/enroll.rs:7)"
            )
        );
    }

    /// Says which thread it is from inside itself, so the stack is read
    /// while this frame is on it.
    #[inline(never)]
    fn wait_to_be_read(done: &AtomicBool, tid: std::sync::mpsc::Sender<i32>) {
        tid.send(current_tid()).expect("send");
        while !done.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A real thread's stack, read through the signal, names the function
    /// it is in and the system call it sleeps in.
    #[test]
    fn another_threads_stack_is_read_and_named() {
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let d = done.clone();
        let t = std::thread::spawn(move || wait_to_be_read(&d, tx));
        let tid = rx.recv().expect("tid");
        let ips = capture(tid, Duration::from_secs(10)).expect("capture");
        done.store(true, Ordering::Release);
        t.join().expect("join");
        let frames = symbolize(&ips);
        let summary = summarize(&frames).unwrap_or_default();
        // The first frame named is the waiting function: its bare name where
        // an optimised build's debug info names it, its path where the symbol
        // table does (an unoptimised build inlines nothing).
        let first = summary.split_once("] ").map_or("", |(_, rest)| rest);
        assert!(
            summary.starts_with("[in ")
                && (first.starts_with("wait_to_be_read (runtime/src/watchdog/stacks.rs:")
                    || first.starts_with(
                        "agentmesh_runtime::watchdog::stacks::tests::wait_to_be_read (runtime/src/watchdog/stacks.rs:"
                    ))
                && !summary.contains("start_thread"),
            "{summary:?} from {frames:#?}"
        );
    }

    #[test]
    fn a_thread_that_is_gone_does_not_answer() {
        let t = std::thread::spawn(current_tid);
        let tid = t.join().expect("join");
        assert_eq!(
            capture(tid, Duration::from_millis(50)),
            Err(CaptureError::NoAnswer)
        );
    }
}
