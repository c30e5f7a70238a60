//! The ladder's report: the JSON document (`--report`) and the markdown tables on stdout.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::observe::{ControlPlaneStep, RouterSnapshot};
use crate::stats::{P50P95, Spread, pair};

/// The whole run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// `local` or `remote`.
    pub mode: String,
    /// The command line.
    pub command: Vec<String>,
    /// Start, Unix seconds.
    pub started_at_unix_secs: i64,
    /// Wall time of the run, seconds.
    pub duration_secs: f64,
    /// The shape of the run.
    pub shape: Shape,
    /// Routers before the first member joined.
    pub pre_ladder: Vec<RouterSnapshot>,
    /// The echo providers.
    pub providers: PhaseRecord,
    /// One object per step.
    pub steps: Vec<StepRecord>,
    /// The hold, if any.
    pub hold: Option<HoldRecord>,
    /// Events during the hold.
    pub events: Events,
    /// The enrollment burst, if any.
    pub burst: Option<BurstRecord>,
    /// Router memory after the fleet left, if sampled.
    pub after: Option<AfterRecord>,
    /// With `--rounds` above 1: every round (the first included), what
    /// joined and what routers kept after it left.
    pub rounds: Vec<RoundRecord>,
    /// Members that exited during the whole run.
    pub exits: u64,
    /// Exit reasons seen (truncated), with counts.
    pub exit_reasons: BTreeMap<String, u64>,
    /// First-call errors seen (truncated), with counts.
    pub first_call_errors: BTreeMap<String, u64>,
    /// Where the run's data and logs are.
    pub work_dir: String,
    /// Why the ladder stopped adding steps early, if it did.
    pub stopped_early: Option<String>,
    /// `--cpu-quota`: the cap and how often it throttled the run.
    pub cpu_cap: Option<crate::cgroup::CpuCapRecord>,
    /// `--hosts`: the hosts the programs ran on.
    pub hosts: Option<crate::placement::HostsRecord>,
    /// Local mode: the control plane's store (`--control-plane-store`) and its version.
    pub store: Option<crate::postgres::StoreRecord>,
    /// Credential refreshes the control plane answered during the hold
    /// (a short `--credential-ttl-secs` makes the fleet refresh in it).
    pub refresh: Option<crate::observe::RefreshRecord>,
}

/// Sizes of the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Shape {
    /// Members per step.
    pub step: u64,
    /// Steps.
    pub steps: u32,
    /// Joiners per second.
    pub join_rate_per_sec: f64,
    /// Routers per member (K).
    pub member_routers: usize,
    /// Routers in the mesh (local mode).
    pub routers: usize,
    /// Provider members.
    pub providers: u64,
    /// Members per worker process.
    pub members_per_worker: u64,
    /// Worker processes used.
    pub workers: usize,
    /// 127.0.0.x source addresses members dialed from (0: the kernel chose).
    pub source_ips: u8,
    /// Whether the control plane was reached over TLS (`https://`).
    pub control_plane_tls: bool,
}

/// Joining figures of a group of members.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PhaseRecord {
    /// Members started.
    pub joining: u64,
    /// Members that got a credential.
    pub enrolled: u64,
    /// Members that became ready.
    pub ready: u64,
    /// First calls that came back byte-identical.
    pub first_call_ok: u64,
    /// First calls that failed within the budget.
    pub first_call_failed: u64,
    /// Call attempts per member that made its first call.
    pub calls_per_member: f64,
    /// Members that exited.
    pub exits: u64,
    /// Start → credential, ms.
    pub enroll_ms: P50P95,
    /// Credential → ready, ms.
    pub ready_ms: P50P95,
    /// Ready → first echo, ms.
    pub first_call_ms: P50P95,
    /// Whether every member finished before the deadline.
    pub completed: bool,
    /// Wall time, seconds.
    pub duration_secs: f64,
}

/// One step.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StepRecord {
    /// 1-based.
    pub step: u32,
    /// Members ready before the step (providers excluded).
    pub resident_before: u64,
    /// Joining figures.
    #[serde(flatten)]
    pub joined: PhaseRecord,
    /// Routers at the end of the step.
    pub routers: Vec<RouterSnapshot>,
    /// The control plane over the step.
    pub control_plane: Option<ControlPlaneStep>,
    /// The worker processes hosting the members, at the end of the step.
    pub fleet: FleetSnapshot,
}

/// The worker processes at one instant (sums of their last ticks).
#[derive(Debug, Clone, Default, Serialize)]
pub struct FleetSnapshot {
    /// Worker processes.
    pub workers: usize,
    /// Members alive.
    pub alive: u64,
    /// Resident memory of all workers, bytes.
    pub rss_bytes: u64,
    /// CPU time of all workers since they started, seconds.
    pub cpu_secs: f64,
    /// Open file descriptors of all workers.
    pub fds: u64,
}

/// The hold.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HoldRecord {
    /// Length, seconds.
    pub secs: u64,
    /// Members alive at the start.
    pub members: u64,
    /// One-second samples per worker.
    pub samples: u64,
    /// Ready → not-ready transitions.
    pub flaps: u64,
    /// Members that flapped.
    pub members_flapped: u64,
    /// Fewest ready (sum of each worker's minimum, a lower bound).
    pub fewest_ready: u64,
    /// Members ready at the end.
    pub ready_at_end: u64,
    /// Members that exited during the hold.
    pub exits: u64,
    /// `/readyz` reads over members' Unix sockets.
    pub socket_checks: u64,
    /// Reads answered with a readiness the in-process watch had neither
    /// before nor after the read (a real disagreement). Runs before
    /// session 10 also counted the unanswered reads here.
    pub socket_mismatches: u64,
    /// Reads with no answer within the read's deadline (5 s) or failed: a
    /// slow socket, not a member that said "not ready".
    pub socket_unanswered: u64,
    /// Reads during which the watch changed, answered with one of its values.
    pub socket_changed: u64,
    /// The slowest read, milliseconds.
    pub socket_read_max_ms: u64,
    /// The first members to lose readiness (each member's first loss,
    /// earliest first, at most `wire::MAX_FLAP_RECORDS`): who, when, which
    /// routers before and after, the node's last router error.
    pub flap_records: Vec<crate::wire::FlapRecord>,
    /// CPU per member per hour over the quiet part of the hold (until the
    /// first event), member and mesh side; see `idle_cost`.
    pub idle: Option<crate::idle_cost::IdleCost>,
    /// The control plane's memory read at the end of the hold: with a hold
    /// longer than `--grpc-max-connection-age-secs`, every member's idle
    /// connection has been recycled by then, so this is what an enrolled
    /// member costs at rest (the readings at the steps and events are taken
    /// while members' connections are still young).
    pub control_plane_memory: Option<ControlPlaneMemory>,
}

/// The control plane's RSS at one instant against its RSS before the ladder.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ControlPlaneMemory {
    /// RSS before the first member joined, bytes.
    pub pre_ladder_rss_bytes: u64,
    /// RSS at the reading, bytes.
    pub rss_bytes: u64,
    /// Members alive at the reading.
    pub members: u64,
    /// (RSS − pre-ladder RSS) ÷ members, bytes (0 when RSS fell).
    pub per_member_bytes: u64,
}

impl ControlPlaneMemory {
    /// `None` without both readings or without members.
    pub fn between(pre_ladder: Option<u64>, now: Option<u64>, members: u64) -> Option<Self> {
        let (pre, now) = (pre_ladder?, now?);
        (members > 0).then(|| Self {
            pre_ladder_rss_bytes: pre,
            rss_bytes: now,
            members,
            per_member_bytes: now.saturating_sub(pre) / members,
        })
    }

    /// One line for the table.
    pub fn summary(&self) -> String {
        format!(
            "Control plane at the hold's end: RSS {:.1} MiB (pre-ladder {:.1} MiB), {:.1} KiB per member over {} members.",
            self.rss_bytes as f64 / 1_048_576.0,
            self.pre_ladder_rss_bytes as f64 / 1_048_576.0,
            self.per_member_bytes as f64 / 1024.0,
            self.members
        )
    }
}

/// The events of the hold.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Events {
    /// `--kill-router-at`.
    pub kill_router: Option<EventRecord>,
    /// `--drain-router-at`.
    pub drain_router: Option<EventRecord>,
    /// `--restart-control-plane-at`.
    pub restart_control_plane: Option<EventRecord>,
    /// `--rotate-key-at`.
    pub rotate_key: Option<EventRecord>,
    /// `--attack-router-at` / `--attack-control-plane-at`.
    pub attack: Option<crate::attack::AttackRecord>,
    /// `--policy-change-at`.
    pub policy_change: Option<crate::propagation::PropagationRecord>,
    /// `--revoke-token-at`.
    pub revoke_token: Option<crate::propagation::PropagationRecord>,
}

/// What one event did to the fleet, from the event until the next one (or the hold's end).
#[derive(Debug, Clone, Default, Serialize)]
pub struct EventRecord {
    /// Seconds into the hold.
    pub at_secs: u64,
    /// Length of the observation window, seconds.
    pub window_secs: f64,
    /// The router acted on, if any.
    pub target: Option<String>,
    /// Members attached to the target just before the event: an event on
    /// an empty router would measure nothing.
    pub target_attached_before: Option<u64>,
    /// Members attached to the target at the window's end; None when it no
    /// longer answered (killed, or exited at the end of its drain).
    pub target_attached_after: Option<u64>,
    /// Error carrying out the action, if any.
    pub error: Option<String>,
    /// Members alive at the event.
    pub members: u64,
    /// Members that were not ready at some point.
    pub lost_ready: u64,
    /// Members that had no router at some point.
    pub below_one_router: u64,
    /// Members that had fewer than K routers at some point.
    pub below_k_routers: u64,
    /// Time from the event until back on K routers (members that dropped).
    pub back_on_k_ms: Spread,
    /// Time each member that dropped spent below K in the window (a member
    /// whose relay client reset a reservation late in the window is back in
    /// milliseconds, though its back-on-K time from the event is long).
    pub below_k_ms: Spread,
    /// Members still below K at the window's end.
    pub not_back_on_k: u64,
    /// Echo calls during the window that succeeded.
    pub calls_ok: u64,
    /// Echo calls during the window that failed.
    pub calls_failed: u64,
    /// Failed calls by reason: `call: <node error kind>`, `call did not
    /// return within …`, `echo not returned within …`, `stream <op>: <kind>`,
    /// `echo came back different`, `member shut down`.
    pub call_errors: BTreeMap<String, u64>,
    /// Calls still running when the window ended (started less than a call
    /// deadline before it), counted neither ok nor failed.
    pub calls_unfinished: u64,
    /// Control plane: time until ready again (restart).
    pub control_plane_ready_ms: Option<u64>,
    /// The killed or drained router started again at the window's end
    /// (`--restart-routers`): time until it was ready, ms.
    pub router_restarted_ms: Option<u64>,
    /// New key id (rotate).
    pub key_id: Option<String>,
    /// Router refusals during the window by `router:resource/scope/protocol`.
    pub router_refusals: BTreeMap<String, u64>,
    /// Router auth failures during the window by `router:purpose/result`.
    pub router_auth_failures: BTreeMap<String, u64>,
    /// The first members to fall below K in the window (earliest first, at
    /// most `wire::MAX_BELOW_K_RECORDS`): who, when, when back, routers
    /// before and after, the last router error while below K.
    pub below_k_records: Vec<crate::wire::BelowKRecord>,
}

/// The enrollment burst.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BurstRecord {
    /// Joiners started at the same instant.
    pub joiners: u64,
    /// Joiners that got a credential.
    pub enrolled: u64,
    /// Time from the burst until the last joiner enrolled, ms (None if not all did).
    pub all_enrolled_ms: Option<u64>,
    /// Start → credential.
    pub enroll_ms: P50P95,
    /// Largest start → credential, ms.
    pub enroll_max_ms: Option<u64>,
    /// Enrollments the control plane refused with RESOURCE_EXHAUSTED during the burst.
    pub refusals: u64,
    /// Control-plane RPCs during the burst by code.
    pub codes: BTreeMap<String, u64>,
    /// Joiners that gave up (exited).
    pub gave_up: u64,
}

/// Router memory after the fleet left.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AfterRecord {
    /// Sampling length, seconds.
    pub secs: u64,
    /// Samples: seconds after the fleet left, RSS bytes per router.
    pub samples: Vec<AfterSample>,
    /// RSS per router before the ladder.
    pub pre_ladder_rss_bytes: BTreeMap<String, u64>,
    /// Last sample ÷ pre-ladder RSS, per router.
    pub ratio_to_pre_ladder: BTreeMap<String, f64>,
    /// Anonymous RSS per router before the ladder (see [`AfterSample::rss_anon_bytes`]).
    pub pre_ladder_rss_anon_bytes: BTreeMap<String, u64>,
    /// Last sample ÷ pre-ladder, anonymous pages only, per router.
    pub anon_ratio_to_pre_ladder: BTreeMap<String, f64>,
}

/// One round of joining and leaving (`--rounds`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RoundRecord {
    /// 1 for the first round (the one with the steps, hold and events).
    pub round: u32,
    /// Members started (providers included).
    pub joining: u64,
    /// Members that became ready.
    pub ready: u64,
    /// First calls that succeeded.
    pub first_call_ok: u64,
    /// Members that exited.
    pub exits: u64,
    /// Whether every step finished within its deadline.
    pub completed: bool,
    /// Router memory after this round's fleet left.
    pub after: Option<AfterRecord>,
}

/// One after-teardown sample.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AfterSample {
    /// Seconds after the fleet left.
    pub t_secs: u64,
    /// RSS per router.
    pub rss_bytes: BTreeMap<String, u64>,
    /// Of RSS, anonymous pages per router: what the router holds, as opposed
    /// to pages of its binary that the peak paged in.
    pub rss_anon_bytes: BTreeMap<String, u64>,
    /// `agentmesh_runtime_allocator_allocated_bytes` per router (null: not served).
    pub allocator_allocated_bytes: BTreeMap<String, Option<u64>>,
    /// `agentmesh_runtime_allocator_active_bytes` per router (null: not served).
    pub allocator_active_bytes: BTreeMap<String, Option<u64>>,
    /// `agentmesh_runtime_allocator_resident_bytes` per router (null: not served).
    pub allocator_resident_bytes: BTreeMap<String, Option<u64>>,
    /// `agentmesh_runtime_allocator_metadata_bytes` per router (null: not served).
    pub allocator_metadata_bytes: BTreeMap<String, Option<u64>>,
}

impl AfterSample {
    /// A sample at `t_secs` of every router (RSS: local children only;
    /// allocator bytes null for a router that did not answer).
    pub fn of(t_secs: u64, routers: &[RouterSnapshot]) -> Self {
        let mut s = Self {
            t_secs,
            ..Self::default()
        };
        for r in routers {
            if let Some(b) = r.rss_bytes {
                s.rss_bytes.insert(r.name.clone(), b);
            }
            if let Some(b) = r.rss_anon_bytes {
                s.rss_anon_bytes.insert(r.name.clone(), b);
            }
            let a = &r.allocator;
            let name = || r.name.clone();
            s.allocator_allocated_bytes
                .insert(name(), a.allocator_allocated_bytes);
            s.allocator_active_bytes
                .insert(name(), a.allocator_active_bytes);
            s.allocator_resident_bytes
                .insert(name(), a.allocator_resident_bytes);
            s.allocator_metadata_bytes
                .insert(name(), a.allocator_metadata_bytes);
        }
        s
    }
}

/// `name=ratio` per router, two decimals.
fn ratios(m: &BTreeMap<String, f64>) -> String {
    m.iter()
        .map(|(r, x)| format!("{r}={x:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `name=RSS (allocated a, allocator resident r)` in MiB, `-` where unknown.
fn memory_line<'a>(
    routers: impl Iterator<Item = &'a str>,
    rss: impl Fn(&str) -> Option<u64>,
    anon: impl Fn(&str) -> Option<u64>,
    allocated: impl Fn(&str) -> Option<u64>,
    resident: impl Fn(&str) -> Option<u64>,
) -> String {
    routers
        .map(|r| {
            format!(
                "{r}={} (anonymous {}, allocated {}, allocator resident {})",
                mib(rss(r)),
                mib(anon(r)),
                mib(allocated(r)),
                mib(resident(r))
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn mib(b: Option<u64>) -> String {
    b.map_or_else(|| "-".into(), |b| format!("{:.1}", b as f64 / 1_048_576.0))
}

/// An event's target with its attached members before → after the window
/// (`r2 (5098 → -)`: it no longer answered at the end).
fn target_cell(e: &EventRecord) -> String {
    let Some(t) = e.target.as_deref() else {
        return "-".into();
    };
    let n = |v: Option<u64>| v.map_or_else(|| "-".into(), |v| v.to_string());
    match (e.target_attached_before, e.target_attached_after) {
        (None, None) => t.to_string(),
        (b, a) => format!("{t} ({} → {})", n(b), n(a)),
    }
}

fn joined(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Report {
    /// The markdown rendering printed on stdout.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        if let Some(h) = &self.hosts {
            let _ = writeln!(s, "{}\n", h.summary());
        }
        if let Some(st) = &self.store {
            let _ = writeln!(s, "{}\n", st.summary());
        }
        if !self.steps.is_empty() {
            let _ = writeln!(
                s,
                "| step | resident before | joining | enrolled | ready | first call ok | calls/member | enroll p50/p95 ms | ready p50/p95 ms | first-call p50/p95 ms | exits |"
            );
            let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
            for st in &self.steps {
                let j = &st.joined;
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {} | {} |",
                    st.step,
                    st.resident_before,
                    j.joining,
                    j.enrolled,
                    j.ready,
                    j.first_call_ok,
                    j.calls_per_member,
                    pair(j.enroll_ms.p50, j.enroll_ms.p95),
                    pair(j.ready_ms.p50, j.ready_ms.p95),
                    pair(j.first_call_ms.p50, j.first_call_ms.p95),
                    j.exits
                );
            }
            if !self.first_call_errors.is_empty() {
                let _ = writeln!(s);
                let _ = writeln!(
                    s,
                    "First-call failures by reason (last attempt): {}.",
                    joined(&self.first_call_errors)
                );
            }
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "| step | workers | members alive | fleet RSS MiB | fleet CPU s | fleet fds |"
            );
            let _ = writeln!(s, "|---|---|---|---|---|---|");
            for st in &self.steps {
                let f = &st.fleet;
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {:.1} | {} |",
                    st.step,
                    f.workers,
                    f.alive,
                    mib(Some(f.rss_bytes)),
                    f.cpu_secs,
                    f.fds
                );
            }
            let _ = writeln!(s);
        }
        let _ = writeln!(
            s,
            "| step | router | attached | transit | other conns | RSS MiB | CPU s | refusals |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
        let pre = self.pre_ladder.iter().map(|r| ("pre", r));
        let steps = self
            .steps
            .iter()
            .flat_map(|st| st.routers.iter().map(move |r| (st.step, r)))
            .map(|(n, r)| (n.to_string(), r));
        for (label, r) in pre.map(|(l, r)| (l.to_string(), r)).chain(steps) {
            let _ = writeln!(
                s,
                "| {label} | {} | {} | {} | {} | {} | {} | {} |",
                r.name,
                r.attached,
                r.transit,
                r.other,
                mib(r.rss_bytes),
                r.cpu_secs.map_or_else(|| "-".into(), |c| format!("{c:.1}")),
                joined(&r.refusals)
            );
        }
        if self.steps.iter().any(|s| s.control_plane.is_some()) {
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "| step | CP RPC p50/p99 ms | refreshes | CP codes | storage rows | CP RSS MiB | DB server CPU s / PSS MiB |"
            );
            let _ = writeln!(s, "|---|---|---|---|---|---|---|");
            let ms = crate::stats::ms_cell;
            for st in &self.steps {
                if let Some(cp) = &st.control_plane {
                    let _ = writeln!(
                        s,
                        "| {} | {}/{} | {} | {} | {} | {} | {} |",
                        st.step,
                        ms(cp.rpc_p50_ms),
                        ms(cp.rpc_p99_ms),
                        cp.refreshes,
                        joined(&cp.codes),
                        joined(&cp.storage_rows),
                        mib(cp.rss_bytes),
                        match cp.store_server_cpu_secs {
                            Some(c) => format!("{c:.1} / {}", mib(cp.store_server_pss_bytes)),
                            None => "-".into(),
                        }
                    );
                }
            }
        }
        if let Some(h) = &self.hold {
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "Hold {} s: {} members, flaps {}, members flapped {}, fewest ready {}, ready at end {}, exits {}, socket checks {} ({} disagreed, {} unanswered within 5 s, {} changed during the read; slowest {} ms).",
                h.secs,
                h.members,
                h.flaps,
                h.members_flapped,
                h.fewest_ready,
                h.ready_at_end,
                h.exits,
                h.socket_checks,
                h.socket_mismatches,
                h.socket_unanswered,
                h.socket_changed,
                h.socket_read_max_ms
            );
            if let Some(r) = &self.refresh {
                let _ = writeln!(s);
                let _ = writeln!(s, "{}", r.summary());
                let _ = writeln!(s);
                let _ = writeln!(s, "{}", r.cost());
            }
            if let Some(idle) = &h.idle {
                let _ = writeln!(s);
                let _ = write!(s, "{}", idle.markdown());
            }
            if let Some(m) = &h.control_plane_memory {
                let _ = writeln!(s);
                let _ = writeln!(s, "{}", m.summary());
            }
            if !h.flap_records.is_empty() {
                let _ = writeln!(s);
                let _ = writeln!(
                    s,
                    "Members that lost readiness (first {} of {}, each member's first loss):",
                    h.flap_records.len(),
                    h.members_flapped
                );
                for f in &h.flap_records {
                    let _ = writeln!(s, "{}", flap_line(f));
                }
            }
        }
        let events = [
            ("kill router", &self.events.kill_router),
            ("drain router", &self.events.drain_router),
            ("restart control plane", &self.events.restart_control_plane),
            ("rotate key", &self.events.rotate_key),
        ];
        if events.iter().any(|(_, e)| e.is_some()) {
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "| event | at s | target (attached before → after) | lost ready | below 1 router | below K | back on K p50/p95/max ms | time below K p50/p95/max ms | not back | calls ok/failed | notes |"
            );
            let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
            for (name, e) in events {
                let Some(e) = e else { continue };
                let mut notes = Vec::new();
                if let Some(err) = &e.error {
                    notes.push(format!("error: {err}"));
                }
                if let Some(ms) = e.control_plane_ready_ms {
                    notes.push(format!("ready again after {ms} ms"));
                }
                if let Some(ms) = e.router_restarted_ms {
                    notes.push(format!("router started again, ready after {ms} ms"));
                }
                if let Some(k) = &e.key_id {
                    notes.push(format!("key {k}"));
                }
                if e.calls_unfinished > 0 {
                    notes.push(format!(
                        "{} calls unfinished at window end",
                        e.calls_unfinished
                    ));
                }
                if !e.router_refusals.is_empty() {
                    notes.push(format!("refusals {}", joined(&e.router_refusals)));
                }
                if !e.router_auth_failures.is_empty() {
                    notes.push(format!("auth failures {}", joined(&e.router_auth_failures)));
                }
                let b = &e.back_on_k_ms;
                let t = &e.below_k_ms;
                let _ = writeln!(
                    s,
                    "| {name} | {} | {} | {} | {} | {} | {}/{} | {}/{} | {} | {}/{} | {} |",
                    e.at_secs,
                    target_cell(e),
                    e.lost_ready,
                    e.below_one_router,
                    e.below_k_routers,
                    pair(b.p50, b.p95),
                    b.max.map_or_else(|| "-".into(), |m| m.to_string()),
                    pair(t.p50, t.p95),
                    t.max.map_or_else(|| "-".into(), |m| m.to_string()),
                    e.not_back_on_k,
                    e.calls_ok,
                    e.calls_failed,
                    if notes.is_empty() {
                        "-".into()
                    } else {
                        notes.join("; ")
                    }
                );
            }
            for (name, e) in events {
                if let Some(e) = e.as_ref().filter(|e| !e.call_errors.is_empty()) {
                    let _ = writeln!(
                        s,
                        "- {name}: window call failures by reason: {}",
                        joined(&e.call_errors)
                    );
                }
            }
            for (name, e) in events {
                if let Some(e) = e.as_ref().filter(|e| !e.below_k_records.is_empty()) {
                    let n = e.below_k_records.len() as u64;
                    let which = if n < e.below_k_routers {
                        format!(
                            "{n} of {}: the earliest and the longest below K",
                            e.below_k_routers
                        )
                    } else {
                        format!("all {n}")
                    };
                    let _ = writeln!(s, "- {name}: members below K ({which}):");
                    for r in &e.below_k_records {
                        let _ = writeln!(s, "  {}", below_k_line(r));
                    }
                }
            }
        }
        if let Some(a) = &self.events.attack {
            a.markdown(&mut s);
        }
        crate::propagation::record::markdown(
            &mut s,
            &[
                ("policy change", &self.events.policy_change),
                ("revoke token", &self.events.revoke_token),
            ],
        );
        if let Some(b) = &self.burst {
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "Burst of {}: {} enrolled, all enrolled after {} ms, enroll p50/p95 {} ms (max {}), {} refusals, {} gave up.",
                b.joiners,
                b.enrolled,
                b.all_enrolled_ms
                    .map_or_else(|| "-".into(), |v| v.to_string()),
                pair(b.enroll_ms.p50, b.enroll_ms.p95),
                b.enroll_max_ms
                    .map_or_else(|| "-".into(), |v| v.to_string()),
                b.refusals,
                b.gave_up
            );
        }
        if let Some(a) = &self.after {
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "After teardown ({} s), MiB per router: RSS (of it anonymous; allocator: allocated, resident):",
                a.secs
            );
            let pre = &self.pre_ladder;
            let find = |r: &str| pre.iter().find(|p| p.name == r);
            let _ = writeln!(
                s,
                "- pre-ladder: {}",
                memory_line(
                    pre.iter().map(|p| p.name.as_str()),
                    |r| find(r).and_then(|p| p.rss_bytes),
                    |r| find(r).and_then(|p| p.rss_anon_bytes),
                    |r| find(r).and_then(|p| p.allocator.allocator_allocated_bytes),
                    |r| find(r).and_then(|p| p.allocator.allocator_resident_bytes),
                )
            );
            for sample in &a.samples {
                let mut names: Vec<&str> = sample.rss_bytes.keys().map(String::as_str).collect();
                names.extend(sample.allocator_resident_bytes.keys().map(String::as_str));
                names.sort_unstable();
                names.dedup();
                let get = |m: &BTreeMap<String, Option<u64>>, r: &str| m.get(r).copied().flatten();
                let _ = writeln!(
                    s,
                    "- t={} s: {}",
                    sample.t_secs,
                    memory_line(
                        names.into_iter(),
                        |r| sample.rss_bytes.get(r).copied(),
                        |r| sample.rss_anon_bytes.get(r).copied(),
                        |r| get(&sample.allocator_allocated_bytes, r),
                        |r| get(&sample.allocator_resident_bytes, r),
                    )
                );
            }
            let _ = writeln!(
                s,
                "- last ÷ pre-ladder: {} (anonymous pages only: {})",
                ratios(&a.ratio_to_pre_ladder),
                ratios(&a.anon_ratio_to_pre_ladder)
            );
        }
        if !self.rounds.is_empty() {
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "Rounds (the fleet joins and leaves again; RSS after each, MiB per router, ÷ pre-ladder):"
            );
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "| round | joining | ready | first call ok | exits | RSS after | ÷ pre-ladder |"
            );
            let _ = writeln!(s, "|---|---|---|---|---|---|---|");
            for r in &self.rounds {
                let (rss, ratio) = r.after.as_ref().map_or_else(
                    || ("-".to_string(), "-".to_string()),
                    |a| {
                        let last = a.samples.last();
                        let rss = last
                            .map(|l| {
                                l.rss_bytes
                                    .iter()
                                    .map(|(n, b)| format!("{n}={}", mib(Some(*b))))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            })
                            .unwrap_or_default();
                        (rss, ratios(&a.ratio_to_pre_ladder))
                    },
                );
                let _ = writeln!(
                    s,
                    "| {}{} | {} | {} | {} | {} | {rss} | {ratio} |",
                    r.round,
                    if r.completed {
                        ""
                    } else {
                        " (deadline passed)"
                    },
                    r.joining,
                    r.ready,
                    r.first_call_ok,
                    r.exits
                );
            }
        }
        let _ = writeln!(s);
        if let Some(why) = &self.stopped_early {
            let _ = writeln!(s, "Stopped early: {why}.");
        }
        if let Some(c) = &self.cpu_cap {
            let _ = writeln!(
                s,
                "CPU cap: {} cores ({:?}, {}): throttled in {} of {} periods, {:.1} s in all.",
                c.cores, c.version, c.path, c.throttled_periods, c.periods, c.throttled_secs
            );
        }
        let _ = writeln!(s, "Exits in the whole run: {}.", self.exits);
        s
    }
}

/// One below-K record as a table line.
/// Routers as a comma-separated list, "none" when empty.
fn router_list(v: &[String]) -> String {
    if v.is_empty() {
        "none".to_string()
    } else {
        v.join(", ")
    }
}

fn below_k_line(r: &crate::wire::BelowKRecord) -> String {
    let back = r
        .back_ms
        .map_or_else(|| "not back".to_string(), |b| format!("back at {b} ms"));
    format!(
        "- member {} ({}) at {} ms, {back}: routers before {}, after {}; last router error: {}",
        r.member,
        r.peer_id,
        r.at_ms,
        router_list(&r.routers_before),
        router_list(&r.routers_after),
        r.last_router_error.as_deref().unwrap_or("none")
    )
}

/// One flap record as a table line.
fn flap_line(f: &crate::wire::FlapRecord) -> String {
    let leaving = if f.leaving_before.is_empty() {
        String::new()
    } else {
        format!(" (leaving: {})", f.leaving_before.join(", "))
    };
    format!(
        "- member {} ({}) at {:.1} s: routers before {}{leaving}, after {}; last router error: {}",
        f.member,
        f.peer_id,
        f.at_secs,
        router_list(&f.routers_before),
        router_list(&f.routers_after),
        f.last_router_error.as_deref().unwrap_or("none")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::AllocatorBytes;
    use crate::prom::Metrics;

    #[test]
    fn markdown_and_json_carry_the_issue_fields() {
        let report = Report {
            steps: vec![StepRecord {
                step: 1,
                joined: PhaseRecord {
                    joining: 10,
                    enrolled: 10,
                    ready: 9,
                    first_call_ok: 9,
                    ready_ms: P50P95 {
                        p50: Some(400),
                        p95: Some(900),
                    },
                    ..PhaseRecord::default()
                },
                routers: vec![RouterSnapshot {
                    name: "r0".into(),
                    attached: 7,
                    rss_bytes: Some(10 * 1_048_576),
                    ..RouterSnapshot::default()
                }],
                ..StepRecord::default()
            }],
            hold: Some(HoldRecord {
                secs: 30,
                members_flapped: 1,
                flap_records: vec![crate::wire::FlapRecord {
                    member: 7,
                    peer_id: "12D3KooWmember".into(),
                    at_secs: 301.5,
                    routers_before: vec!["r0".into(), "r3".into()],
                    leaving_before: vec!["r3".into()],
                    routers_after: Vec::new(),
                    last_router_error: Some("router r1: connection failed".into()),
                }],
                ..HoldRecord::default()
            }),
            events: Events {
                drain_router: Some(EventRecord {
                    at_secs: 10,
                    target: Some("r2".into()),
                    target_attached_before: Some(120),
                    calls_ok: 40,
                    calls_failed: 2,
                    calls_unfinished: 3,
                    call_errors: [
                        ("call did not return within 22s".to_string(), 1),
                        ("echo not returned within 10s".to_string(), 1),
                    ]
                    .into(),
                    below_k_routers: 3,
                    below_k_records: vec![crate::wire::BelowKRecord {
                        member: 9,
                        peer_id: "12D3KooWother".into(),
                        at_ms: 1200,
                        back_ms: Some(86_000),
                        routers_before: vec!["r2".into(), "r3".into()],
                        routers_after: vec!["r3".into()],
                        last_router_error: Some("router r0: refused".into()),
                    }],
                    ..EventRecord::default()
                }),
                ..Events::default()
            },
            first_call_errors: [("call: no_providers".to_string(), 3)].into(),
            ..Report::default()
        };
        // The after samples come from real scrapes: one router serving the
        // allocator gauges, one old binary without them.
        let page = include_str!("../testdata/router-after-ladder.metrics");
        let mut with = RouterSnapshot {
            name: "r0".into(),
            up: true,
            rss_bytes: Some(40 * 1_048_576),
            rss_anon_bytes: Some(25 * 1_048_576),
            ..RouterSnapshot::default()
        };
        with.allocator = AllocatorBytes::from_metrics(&Metrics::parse(page));
        let old_page: String = page
            .lines()
            .filter(|l| !l.contains("agentmesh_runtime_allocator_"))
            .map(|l| format!("{l}\n"))
            .collect();
        let without = RouterSnapshot {
            name: "r1".into(),
            up: true,
            rss_bytes: Some(30 * 1_048_576),
            allocator: AllocatorBytes::from_metrics(&Metrics::parse(&old_page)),
            ..RouterSnapshot::default()
        };
        let mut report = report;
        report.pre_ladder = vec![with.clone(), without.clone()];
        report.after = Some(AfterRecord {
            secs: 60,
            samples: vec![AfterSample::of(5, &[with.clone(), without])],
            ..AfterRecord::default()
        });
        report.rounds = vec![
            RoundRecord {
                round: 1,
                joining: 13,
                ready: 13,
                first_call_ok: 10,
                exits: 0,
                completed: true,
                after: report.after.clone().map(|a| AfterRecord {
                    ratio_to_pre_ladder: [("r0".to_string(), 1.0)].into(),
                    ..a
                }),
            },
            RoundRecord {
                round: 2,
                joining: 13,
                ready: 12,
                first_call_ok: 9,
                exits: 1,
                completed: false,
                after: None,
            },
        ];
        let md = report.markdown();
        assert!(
            md.contains("| 1 | 13 | 13 | 10 | 0 | r0=40.0, r1=30.0 | r0=1.00 |"),
            "{md}"
        );
        assert!(
            md.contains("| 2 (deadline passed) | 13 | 12 | 9 | 1 | - | - |"),
            "{md}"
        );
        assert!(
            md.contains(
                "- t=5 s: r0=40.0 (anonymous 25.0, allocated 6.6, allocator resident 15.7), r1=30.0 (anonymous -, allocated -, allocator resident -)"
            ),
            "{md}"
        );
        assert!(
            md.contains("- pre-ladder: r0=40.0 (anonymous 25.0, allocated 6.6, allocator resident 15.7), r1=30.0"),
            "{md}"
        );
        assert!(
            md.contains("| 40/2 | 3 calls unfinished at window end |"),
            "{md}"
        );
        assert!(
            md.contains(
                "- drain router: window call failures by reason: call did not return within 22s=1, echo not returned within 10s=1"
            ),
            "{md}"
        );
        assert!(
            md.contains("First-call failures by reason (last attempt): call: no_providers=3."),
            "{md}"
        );
        assert!(
            md.contains("| 1 | 0 | 10 | 10 | 9 | 9 | 0.00 | -/- | 400/900 | -/- | 0 |"),
            "{md}"
        );
        assert!(md.contains("| 1 | r0 | 7 | 0 | 0 | 10.0 |"), "{md}");
        assert!(md.contains("| drain router | 10 | r2 (120 → -) |"), "{md}");
        let json = serde_json::to_value(&report).expect("json");
        for key in [
            "joining",
            "enrolled",
            "ready",
            "first_call_ok",
            "resident_before",
        ] {
            assert!(
                json["steps"][0].get(key).is_some(),
                "steps[0].{key} missing"
            );
        }
        for key in ["flaps", "exits", "fewest_ready", "members_flapped"] {
            assert!(json["hold"].get(key).is_some(), "hold.{key} missing");
        }
        assert!(
            md.contains(
                "- member 7 (12D3KooWmember) at 301.5 s: routers before r0, r3 (leaving: r3), after none; last router error: router r1: connection failed"
            ),
            "{md}"
        );
        assert!(
            md.contains(
                "- drain router: members below K (1 of 3: the earliest and the longest below K):\n  - member 9 (12D3KooWother) at 1200 ms, back at 86000 ms: routers before r2, r3, after r3; last router error: router r0: refused"
            ),
            "{md}"
        );
        assert_eq!(
            json["events"]["drain_router"]["below_k_records"][0]["back_ms"],
            86_000
        );
        let flap = &json["hold"]["flap_records"][0];
        assert_eq!(flap["peer_id"], "12D3KooWmember");
        assert_eq!(flap["routers_after"].as_array().map(Vec::len), Some(0));
        assert_eq!(flap["last_router_error"], "router r1: connection failed");
        assert!(json["events"]["drain_router"]["below_one_router"].is_u64());
        assert!(json.get("burst").is_some() && json.get("after").is_some());
        assert_eq!(json["rounds"][1]["ready"], 12);
        assert!(json["rounds"][1]["after"].is_null());
        let sample = &json["after"]["samples"][0];
        assert_eq!(sample["allocator_allocated_bytes"]["r0"], 6_963_312);
        assert_eq!(sample["allocator_active_bytes"]["r0"], 11_993_088);
        assert_eq!(sample["allocator_resident_bytes"]["r0"], 16_478_208);
        assert_eq!(sample["allocator_metadata_bytes"]["r0"], 4_093_504);
        assert!(
            sample["allocator_resident_bytes"]["r1"].is_null(),
            "{sample}"
        );
        assert_eq!(
            json["pre_ladder"][0]["allocator_allocated_bytes"],
            6_963_312
        );
        assert!(json["pre_ladder"][1]["allocator_allocated_bytes"].is_null());
        assert!(
            json["steps"][0]["routers"][0]
                .as_object()
                .expect("router")
                .contains_key("allocator_resident_bytes")
        );
    }

    #[test]
    fn control_plane_memory_per_member_is_the_growth_over_the_members() {
        let m =
            ControlPlaneMemory::between(Some(40 << 20), Some((40 << 20) + 10_000 * 3_000), 10_000)
                .expect("both readings");
        assert_eq!(m.per_member_bytes, 3_000);
        assert!(
            m.summary()
                .contains("2.9 KiB per member over 10000 members"),
            "{}",
            m.summary()
        );
        // RSS below the pre-ladder reading is no growth, not an underflow.
        let shrunk = ControlPlaneMemory::between(Some(50), Some(40), 10).expect("both readings");
        assert_eq!(shrunk.per_member_bytes, 0);
        assert_eq!(ControlPlaneMemory::between(None, Some(1), 1), None);
        assert_eq!(ControlPlaneMemory::between(Some(1), Some(1), 0), None);
    }
}
