//! A worker process: hosts many members in-process and talks to the
//! coordinator in JSON lines (commands on stdin, events on stdout).

mod echo;
mod lifecycle;
mod propagation;
mod sampler;
mod state;
mod trace;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::WorkerConfig;
use crate::error::{LadderError, Result};
use crate::wire::{Command, Event, Reply};
use state::{HoldAcc, Shared, Slot, WindowAcc};

/// Events buffered towards stdout before members wait.
const EVENT_QUEUE: usize = 16_384;
/// Members shut down at once when leaving.
const LEAVE_PARALLELISM: usize = 64;
/// Deadline for every member to shut down when leaving.
const LEAVE_DEADLINE: Duration = Duration::from_secs(120);

/// Runs a worker until the coordinator says `leave` or closes stdin.
pub async fn run(cfg: WorkerConfig) -> Result<()> {
    let token = read_token(&cfg.token_file).await?;
    tokio::fs::create_dir_all(&cfg.data_dir)
        .await
        .map_err(|e| LadderError::io(format!("creating {}", cfg.data_dir.display()), e))?;
    let revocable_token = match &cfg.propagation.revocable_token_file {
        Some(f) => Some(read_token(f).await?),
        None => None,
    };
    let echo = echo::spawn_echo()
        .await
        .map_err(|e| LadderError::io("binding the echo backend", e))?;
    let (out, out_rx) = mpsc::channel::<Event>(EVENT_QUEUE);
    let shared = Arc::new(Shared {
        cfg,
        token,
        echo,
        out,
        slots: Mutex::new(Vec::new()),
        window: Mutex::new(WindowAcc::default()),
        hold: Mutex::new(HoldAcc::default()),
        leaving: std::sync::atomic::AtomicBool::new(false),
        propagation: trace::Live::new(revocable_token),
    });
    let writer = tokio::spawn(write_events(out_rx));
    tokio::spawn(sampler::sample_forever(shared.clone()));

    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    loop {
        let line = match lines.next_line().await {
            Ok(Some(l)) => l,
            Ok(None) | Err(_) => break,
        };
        let cmd: Command = match serde_json::from_str(&line) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, line, "bad command line");
                continue;
            }
        };
        let last = matches!(cmd, Command::Leave { .. });
        if let Some((id, body)) = handle(&shared, cmd).await {
            shared.emit(Event::Reply { id, body }).await;
        }
        if last {
            break;
        }
    }
    shared.leaving.store(true, Ordering::SeqCst);
    drop(shared);
    let _ = tokio::time::timeout(Duration::from_secs(10), writer).await;
    Ok(())
}

/// A token file's contents, trimmed.
async fn read_token(path: &std::path::Path) -> Result<String> {
    Ok(tokio::fs::read_to_string(path)
        .await
        .map_err(|e| LadderError::io(format!("reading {}", path.display()), e))?
        .trim()
        .to_string())
}

/// Writes events to stdout as JSON lines, as many as are queued at once,
/// until the queue closes or stdout fails.
async fn write_events(mut out_rx: mpsc::Receiver<Event>) {
    let mut stdout = tokio::io::stdout();
    while let Some(ev) = out_rx.recv().await {
        let mut buf = Vec::new();
        push_line(&mut buf, &ev);
        while let Ok(ev) = out_rx.try_recv() {
            push_line(&mut buf, &ev);
        }
        if stdout.write_all(&buf).await.is_err() || stdout.flush().await.is_err() {
            return;
        }
    }
}

/// Carries out one command; returns the reply to send now, or `None` when
/// a task replies later itself.
async fn handle(shared: &Arc<Shared>, cmd: Command) -> Option<(u64, Reply)> {
    Some(match cmd {
        Command::Join {
            id,
            first,
            count,
            rate_per_sec,
            provider,
        } => {
            tokio::spawn(join(shared.clone(), first, count, rate_per_sec, provider));
            (id, Reply::Done)
        }
        Command::Mark { id, name } => {
            tracing::info!(window = name, "window starts");
            shared.mark();
            tokio::spawn(sampler::window_calls(shared.clone()));
            (id, Reply::Done)
        }
        Command::WindowReport { id } => (id, Reply::Window(Box::new(shared.window_report()))),
        Command::HoldStart { id } => {
            shared.hold_start();
            (id, Reply::Done)
        }
        Command::HoldReport { id } => (id, Reply::Hold(shared.hold_report())),
        Command::LiveCalls {
            id,
            service,
            count,
            revocable_only,
        } => {
            // Replies itself once the calls are open.
            tokio::spawn(propagation::open_live(
                shared.clone(),
                id,
                service,
                count,
                revocable_only,
            ));
            return None;
        }
        Command::PropagationReport {
            id,
            since_unix_ms,
            min_version,
            revoked,
        } => (
            id,
            Reply::Propagation(propagation::report(
                shared,
                since_unix_ms,
                min_version,
                revoked,
            )),
        ),
        Command::Leave { id } => {
            leave(shared).await;
            (id, Reply::Done)
        }
    })
}

fn push_line(buf: &mut Vec<u8>, ev: &Event) {
    if let Ok(line) = serde_json::to_vec(ev) {
        buf.extend_from_slice(&line);
        buf.push(b'\n');
    }
}

/// Starts `count` members from `first`, `rate` a second (0 = all at once).
async fn join(shared: Arc<Shared>, first: u64, count: u64, rate: f64, provider: bool) {
    let t0 = Instant::now();
    for i in 0..count {
        if rate > 0.0 {
            tokio::time::sleep_until(t0 + Duration::from_secs_f64(i as f64 / rate)).await;
        }
        if shared.leaving.load(Ordering::SeqCst) {
            return;
        }
        let slot = Arc::new(Slot::new(first + i, provider));
        shared.add(slot.clone());
        tokio::spawn(lifecycle::run(shared.clone(), slot));
    }
}

/// Shuts every member down, a bounded number at a time, within a deadline.
async fn leave(shared: &Arc<Shared>) {
    shared.leaving.store(true, Ordering::SeqCst);
    let members: Vec<_> = shared
        .slots()
        .iter()
        .filter_map(|s| s.member.get().cloned())
        .collect();
    let deadline = Instant::now() + LEAVE_DEADLINE;
    let mut set = JoinSet::new();
    for m in members {
        while set.len() >= LEAVE_PARALLELISM {
            if tokio::time::timeout_at(deadline, set.join_next())
                .await
                .is_err()
            {
                tracing::warn!("members did not shut down within {LEAVE_DEADLINE:?}");
                return;
            }
        }
        set.spawn(async move { m.shutdown().await });
    }
    while !set.is_empty() {
        if tokio::time::timeout_at(deadline, set.join_next())
            .await
            .is_err()
        {
            tracing::warn!("members did not shut down within {LEAVE_DEADLINE:?}");
            return;
        }
    }
}
