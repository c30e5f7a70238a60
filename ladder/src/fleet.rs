//! The coordinator's side of the fleet: worker processes (the ladder
//! re-executed as `worker`), their command pipes, and the event pump that
//! keeps the [`Tally`] current.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command as Process};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::WorkerConfig;
use crate::error::{LadderError, Result};
use crate::tally::{Phase, Tally};
use crate::wire::{Command, Event, Reply};

/// Lines buffered from all workers before their readers wait.
const LINE_QUEUE: usize = 65_536;
/// Deadline for a worker's answer to a command.
const REPLY_DEADLINE: Duration = Duration::from_secs(60);
/// Deadline for workers to shut their members down and exit.
const LEAVE_DEADLINE: Duration = Duration::from_secs(180);
/// Minimum interval between progress lines on a terminal (redrawn in place).
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Minimum interval between progress lines when stderr is a file or pipe.
const PROGRESS_EVERY_PIPED: Duration = Duration::from_secs(10);

struct WorkerProc {
    child: Child,
    stdin: ChildStdin,
    hosted: u64,
    closed: bool,
}

fn reply_result(w: usize, body: Reply) -> Result<Reply> {
    match body {
        Reply::Failed { error } => Err(LadderError::Worker {
            worker: w,
            message: error,
        }),
        other => Ok(other),
    }
}

/// The fleet of workers.
pub struct Fleet {
    ladder: PathBuf,
    base: WorkerConfig,
    dir: PathBuf,
    capacity: u64,
    workers: Vec<WorkerProc>,
    tx: mpsc::Sender<(usize, Option<Event>)>,
    rx: mpsc::Receiver<(usize, Option<Event>)>,
    next_id: u64,
    next_member: u64,
    /// Replies that arrived while waiting for another one (broadcasts).
    stashed: HashMap<u64, (usize, Reply)>,
    /// What is known about every member.
    pub tally: Tally,
    /// Label shown on the progress line.
    pub label: String,
    last_progress: Option<Instant>,
    /// Command prefix that starts worker `i` on its host:
    /// `prefixes[i % len]` (empty: every worker here).
    prefixes: Vec<Vec<std::ffi::OsString>>,
}

impl Fleet {
    /// A fleet with no workers yet; workers host up to `capacity` members each.
    pub fn new(ladder: PathBuf, base: WorkerConfig, dir: &Path, capacity: u64) -> Self {
        let (tx, rx) = mpsc::channel(LINE_QUEUE);
        Self {
            ladder,
            base,
            dir: dir.to_path_buf(),
            capacity: capacity.max(1),
            workers: Vec::new(),
            tx,
            rx,
            next_id: 1,
            next_member: 0,
            stashed: HashMap::new(),
            tally: Tally::default(),
            label: String::new(),
            last_progress: None,
            prefixes: Vec::new(),
        }
    }

    /// Starts worker `i` behind `prefixes[i % len]` (e.g. `ip netns exec
    /// NAMESPACE`: on a host of its own) instead of here.
    pub fn place_workers(&mut self, prefixes: Vec<Vec<std::ffi::OsString>>) {
        self.prefixes = prefixes;
    }

    /// The workers' resources, from their last ticks.
    pub fn snapshot(&self) -> crate::report::FleetSnapshot {
        let t = &self.tally.ticks;
        crate::report::FleetSnapshot {
            workers: self.workers.len(),
            alive: t.iter().map(|t| t.alive).sum(),
            rss_bytes: t.iter().map(|t| t.rss_bytes).sum(),
            cpu_secs: t.iter().map(|t| t.cpu_secs).sum(),
            fds: t.iter().map(|t| t.fds).sum(),
        }
    }

    /// Pids of the worker processes still running (for `/proc` readings).
    pub fn worker_pids(&self) -> Vec<u32> {
        self.workers
            .iter()
            .filter(|w| !w.closed)
            .filter_map(|w| w.child.id())
            .collect()
    }

    /// Worker processes started so far.
    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    fn spawn_worker(&mut self) -> Result<usize> {
        let index = self.workers.len();
        let data_dir = self.dir.join(format!("w{index}"));
        let args = worker_args(&self.base, index, &data_dir);
        let log = self.dir.join(format!("worker-{index}.log"));
        let log_file = std::fs::File::create(&log)
            .map_err(|e| LadderError::io(format!("creating {}", log.display()), e))?;
        let mut cmd = match self.prefixes.get(index % self.prefixes.len().max(1)) {
            Some(at) if !at.is_empty() => {
                let mut c = Process::new(&at[0]);
                c.args(&at[1..]).arg(&self.ladder);
                c
            }
            _ => Process::new(&self.ladder),
        };
        cmd.args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true);
        let level = std::env::var("LADDER_WORKER_LOG").unwrap_or_else(|_| "warn".into());
        cmd.env("RUST_LOG", level);
        let mut child = cmd
            .spawn()
            .map_err(|e| LadderError::io(format!("starting worker {index}"), e))?;
        let stdin = child.stdin.take().ok_or_else(|| LadderError::Worker {
            worker: index,
            message: "no stdin pipe".into(),
        })?;
        let stdout = child.stdout.take().ok_or_else(|| LadderError::Worker {
            worker: index,
            message: "no stdout pipe".into(),
        })?;
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Event>(&line) {
                    Ok(ev) => {
                        if tx.send((index, Some(ev))).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(worker = index, error = %e, line, "bad event line"),
                }
            }
            let _ = tx.send((index, None)).await;
        });
        self.workers.push(WorkerProc {
            child,
            stdin,
            hosted: 0,
            closed: false,
        });
        Ok(index)
    }

    /// Starts `count` members at `rate_per_sec` in total (0 = at once), filling
    /// workers in order and starting new ones as needed.
    pub async fn join(&mut self, count: u64, rate_per_sec: f64, phase: Phase) -> Result<()> {
        let mut left = count;
        let mut plan = Vec::new();
        while left > 0 {
            let w = match self
                .workers
                .iter()
                .position(|w| w.hosted < self.capacity && !w.closed)
            {
                Some(w) => w,
                None => self.spawn_worker()?,
            };
            let n = left.min(self.capacity - self.workers[w].hosted);
            self.workers[w].hosted += n;
            if phase == Phase::Provider {
                // Providers get worker processes of their own, as they would
                // have hosts of their own: their answers then do not queue
                // behind thousands of joining or re-attaching members on the
                // same runtime.
                self.workers[w].hosted = self.capacity;
            }
            plan.push((w, self.next_member, n));
            self.tally.register(self.next_member, n, phase);
            self.next_member += n;
            left -= n;
        }
        for (w, first, n) in plan {
            let rate = if rate_per_sec > 0.0 {
                rate_per_sec * n as f64 / count as f64
            } else {
                0.0
            };
            let provider = phase == Phase::Provider;
            self.request(w, |id| Command::Join {
                id,
                first,
                count: n,
                rate_per_sec: rate,
                provider,
            })
            .await?;
        }
        Ok(())
    }

    /// Sends a command to worker `w` and waits for its reply, applying other events meanwhile.
    pub async fn request(&mut self, w: usize, make: impl FnOnce(u64) -> Command) -> Result<Reply> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(w, &make(id)).await?;
        let deadline = Instant::now() + REPLY_DEADLINE;
        self.wait_reply(w, id, deadline).await
    }

    /// Sends the same command to every live worker and collects the replies.
    pub async fn broadcast(
        &mut self,
        make: impl Fn(u64) -> Command,
        deadline: Duration,
    ) -> Result<Vec<Reply>> {
        let mut ids = Vec::new();
        for w in 0..self.workers.len() {
            if self.workers[w].closed {
                continue;
            }
            let id = self.next_id;
            self.next_id += 1;
            self.send(w, &make(id)).await?;
            ids.push((w, id));
        }
        let deadline = Instant::now() + deadline;
        let mut replies = Vec::new();
        for (w, id) in ids {
            replies.push(self.wait_reply(w, id, deadline).await?);
        }
        Ok(replies)
    }

    async fn send(&mut self, w: usize, cmd: &Command) -> Result<()> {
        let mut line = serde_json::to_vec(cmd).map_err(|e| LadderError::Worker {
            worker: w,
            message: format!("encoding command: {e}"),
        })?;
        line.push(b'\n');
        let worker = &mut self.workers[w];
        worker
            .stdin
            .write_all(&line)
            .await
            .map_err(|e| LadderError::Worker {
                worker: w,
                message: format!("writing command: {e} (see worker-{w}.log)"),
            })?;
        worker.stdin.flush().await.map_err(|e| LadderError::Worker {
            worker: w,
            message: format!("flushing command: {e}"),
        })
    }

    async fn wait_reply(&mut self, w: usize, id: u64, deadline: Instant) -> Result<Reply> {
        if let Some((_, body)) = self.stashed.remove(&id) {
            return reply_result(w, body);
        }
        loop {
            let next = tokio::time::timeout_at(deadline, self.rx.recv()).await;
            match next {
                Err(_) => {
                    return Err(LadderError::Worker {
                        worker: w,
                        message: format!("no reply to command {id} in time (see worker-{w}.log)"),
                    });
                }
                Ok(None) => {
                    return Err(LadderError::Worker {
                        worker: w,
                        message: "event channel closed".into(),
                    });
                }
                Ok(Some((from, None))) => {
                    self.workers[from].closed = true;
                    if from == w {
                        return Err(LadderError::Worker {
                            worker: w,
                            message: format!("exited (see worker-{w}.log)"),
                        });
                    }
                }
                Ok(Some((from, Some(Event::Reply { id: rid, body }))))
                    if from == w && rid == id =>
                {
                    return match body {
                        Reply::Failed { error } => Err(LadderError::Worker {
                            worker: w,
                            message: error,
                        }),
                        other => Ok(other),
                    };
                }
                Ok(Some((from, Some(ev)))) => self.apply(from, ev),
            }
        }
    }

    fn apply(&mut self, w: usize, ev: Event) {
        if let Event::Reply { id, body } = ev {
            self.stashed.insert(id, (w, body));
            return;
        }
        let tick = matches!(ev, Event::Tick(_));
        self.tally.apply(w, &ev);
        if tick {
            self.progress(false);
        }
    }

    /// Applies events until `done(tally)` holds or `deadline` passes; returns whether it held.
    pub async fn pump_until(&mut self, deadline: Instant, done: impl Fn(&Tally) -> bool) -> bool {
        loop {
            if done(&self.tally) {
                return true;
            }
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Err(_) | Ok(None) => return done(&self.tally),
                Ok(Some((from, None))) => {
                    self.workers[from].closed = true;
                    tracing::warn!(worker = from, "worker exited");
                }
                Ok(Some((from, Some(ev)))) => self.apply(from, ev),
            }
        }
    }

    /// Starts `count` members of `phase` at `rate_per_sec` and applies
    /// events until every one of them is done (see `Tally::phase_done`) or
    /// `timeout` from now passes; returns whether they all were.
    pub async fn join_phase(
        &mut self,
        count: u64,
        rate_per_sec: f64,
        phase: Phase,
        timeout: Duration,
    ) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        self.join(count, rate_per_sec, phase).await?;
        Ok(self.pump_until(deadline, |t| t.phase_done(phase)).await)
    }

    /// Applies events for `d`.
    pub async fn pump_for(&mut self, d: Duration) {
        let deadline = Instant::now() + d;
        self.pump_until(deadline, |_| false).await;
    }

    /// Prints the live progress line (at most once a second unless `force`).
    pub fn progress(&mut self, force: bool) {
        let now = Instant::now();
        let tty = std::io::stderr().is_terminal();
        let every = if tty {
            PROGRESS_EVERY
        } else {
            PROGRESS_EVERY_PIPED
        };
        if !force && self.last_progress.is_some_and(|t| now - t < every) {
            return;
        }
        self.last_progress = Some(now);
        let t = &self.tally;
        let fds: u64 = t.ticks.iter().map(|t| t.fds).sum();
        let line = format!(
            "[{}] members {} alive {} ready {} exits {} | workers {} fds {}",
            self.label,
            t.members.len(),
            t.alive(),
            t.ready_now(),
            t.exits(),
            self.workers.len(),
            fds
        );
        let mut err = std::io::stderr().lock();
        if tty {
            let _ = write!(err, "\r\x1b[2K{line}");
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    /// Tells every worker to shut its members down, waits for them to exit.
    pub async fn leave(&mut self) -> Result<()> {
        let r = self
            .broadcast(|id| Command::Leave { id }, LEAVE_DEADLINE)
            .await;
        for w in &mut self.workers {
            if tokio::time::timeout(Duration::from_secs(30), w.child.wait())
                .await
                .is_err()
            {
                let _ = w.child.start_kill();
            }
            w.closed = true;
        }
        r.map(|_| ())
    }
}

/// The command line of worker `index` (data under `data_dir`): `c` as
/// flags, so the worker parses back the same [`WorkerConfig`].
fn worker_args(c: &WorkerConfig, index: usize, data_dir: &std::path::Path) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "worker".into(),
        "--index".into(),
        index.to_string(),
        "--control-plane".into(),
        c.control_plane.clone(),
        "--token-file".into(),
        c.token_file.display().to_string(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--member-routers".into(),
        c.member_routers.to_string(),
        "--source-ips".into(),
        c.source_ips.to_string(),
        "--call-timeout-secs".into(),
        c.call_timeout_secs.to_string(),
        "--call-budget-secs".into(),
        c.call_budget_secs.to_string(),
        "--member-ping-interval-secs".into(),
        c.member_ping_interval_secs.to_string(),
        "--member-rejoin-spread-ms".into(),
        c.member_rejoin_spread_ms.to_string(),
        "--window-calls-per-sec".into(),
        c.window_calls_per_sec.to_string(),
        "--member-quic-idle-timeout-secs".into(),
        c.member_quic_idle_timeout_secs.to_string(),
    ];
    if let Some(ca) = &c.control_plane_ca {
        args.extend(["--control-plane-ca".into(), ca.display().to_string()]);
    }
    for e in &c.control_plane_endpoints {
        args.extend(["--control-plane-endpoint".into(), e.clone()]);
    }
    if c.member_direct {
        args.push("--member-direct".into());
        args.extend([
            "--member-direct-transport".into(),
            c.member_direct_transport.as_str().into(),
            "--warm-call-after-secs".into(),
            c.warm_call_after_secs.to_string(),
        ]);
    }
    args.extend(c.propagation.args());
    args
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Worker {
        #[command(flatten)]
        cfg: WorkerConfig,
    }

    fn parse(args: &[String]) -> WorkerConfig {
        Worker::try_parse_from(std::iter::once("worker").chain(args.iter().map(String::as_str)))
            .expect("the worker parses its command line")
            .cfg
    }

    /// A worker parses back the configuration its command line was made
    /// from: direct connections over QUIC, endpoints, the propagation part.
    #[test]
    fn a_workers_command_line_round_trips_its_configuration() {
        let base = parse(
            &[
                "--index=3",
                "--control-plane=http://127.0.0.1:7400",
                "--control-plane-endpoint=http://127.0.0.1:7401",
                "--control-plane-endpoint=http://127.0.0.1:7402",
                "--token-file=/t/token",
                "--data-dir=/t/w3",
                "--member-routers=2",
                "--source-ips=4",
                "--member-direct",
                "--member-direct-transport=quic",
                "--member-quic-idle-timeout-secs=4",
                "--warm-call-after-secs=7",
                "--expose-also=echo-held",
                "--revocable-token-file=/t/revocable",
                "--revocable-every=20",
            ]
            .map(String::from),
        );
        assert!(base.member_direct);
        assert_eq!(
            base.member_direct_transport,
            agentmesh_node::config::DirectTransport::Quic
        );
        assert_eq!(base.member_quic_idle_timeout_secs, 4);
        let args = worker_args(&base, base.index, &base.data_dir);
        assert_eq!(args[0], "worker");
        assert_eq!(parse(&args[1..]), base);
    }
}
