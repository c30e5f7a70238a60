//! The ladder's report: the JSON document (`--report`) and the markdown tables on stdout.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::observe::{ControlPlaneStep, RouterSnapshot};
use crate::stats::{P50P95, Spread};

mod markdown;
mod restart_all;
#[cfg(test)]
mod tests;

pub use restart_all::RestartAllRecord;

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
    /// Members' exits and first-call failures over the whole run (JSON:
    /// `exits`, `exit_reasons`, `first_call_errors` at the top level).
    #[serde(flatten)]
    pub failures: Failures,
    /// Where the run's data and logs are.
    pub work_dir: String,
    /// Why the ladder stopped adding steps early, if it did.
    pub stopped_early: Option<String>,
    /// What the run ran on (JSON: `cpu_cap`, `hosts`, `store` at the top level).
    #[serde(flatten)]
    pub environment: Environment,
    /// Credential refreshes the control plane answered during the hold
    /// (a short `--credential-ttl-secs` makes the fleet refresh in it).
    pub refresh: Option<crate::observe::RefreshRecord>,
    /// Local mode: the control plane's replicas, the routers' leases, the
    /// database's connections and signing keys over the run.
    pub control_planes: Option<crate::replicas::record::ControlPlanesRecord>,
}

/// What went wrong for members over the whole run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Failures {
    /// Members that exited during the whole run.
    pub exits: u64,
    /// Exit reasons seen (truncated), with counts.
    pub exit_reasons: BTreeMap<String, u64>,
    /// First-call errors seen (truncated), with counts.
    pub first_call_errors: BTreeMap<String, u64>,
}

/// What the run ran on, where the flags asked for something of their own.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Environment {
    /// `--cpu-quota`: the cap and how often it throttled the run.
    pub cpu_cap: Option<crate::cgroup::CpuCapRecord>,
    /// `--hosts`: the hosts the programs ran on.
    pub hosts: Option<crate::placement::HostsRecord>,
    /// Local mode: the control plane's store (`--control-plane-store`) and its version.
    pub store: Option<crate::postgres::StoreRecord>,
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
    /// `--restart-all-routers-at`: every router drained and started again
    /// at once; its record carries `restart_all`. For it `router_refusals`
    /// and `router_auth_failures` are what the restarted routers counted
    /// (their counters start again at 0), i.e. during the return.
    pub restart_all_routers: Option<EventRecord>,
    /// `--attack-router-at` / `--attack-control-plane-at`.
    pub attack: Option<crate::attack::AttackRecord>,
    /// `--policy-change-at`.
    pub policy_change: Option<crate::propagation::PropagationRecord>,
    /// `--revoke-token-at`.
    pub revoke_token: Option<crate::propagation::PropagationRecord>,
    /// `--kill-control-plane-every-secs`: one record per kill, its window
    /// until the next event.
    pub kill_control_plane: Vec<EventRecord>,
    /// `--rolling-restart-control-planes-at`.
    pub rolling_restart_control_planes: Option<EventRecord>,
    /// `--stop-control-plane-at`.
    pub stop_control_plane: Option<EventRecord>,
}

/// What one event did to the fleet, from the event until the next one (or the hold's end).
#[derive(Debug, Clone, Default, Serialize)]
pub struct EventRecord {
    /// Seconds into the hold.
    pub at_secs: u64,
    /// Length of the observation window, seconds.
    pub window_secs: f64,
    /// The router acted on and its members before and after (JSON:
    /// `target`, `target_attached_before`, `target_attached_after`).
    #[serde(flatten)]
    pub target: EventTarget,
    /// Error carrying out the action, if any.
    pub error: Option<String>,
    /// The members' readiness and routers in the window (JSON: `members`,
    /// `lost_ready`, `below_one_router`, `below_k_routers`, `back_on_k_ms`,
    /// `below_k_ms`, `not_back_on_k`, `below_k_records`).
    #[serde(flatten)]
    pub fleet: FleetWindow,
    /// The echo calls made in the window (JSON: `calls_ok`, `calls_failed`,
    /// `call_errors`, `calls_unfinished`, `calls_direct`, `warm_direct`,
    /// `warm_relayed`).
    #[serde(flatten)]
    pub calls: WindowCalls,
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
    /// What the routers relayed during the window by
    /// `router:relayed_bytes|circuits_accepted|circuits_upgraded` (a
    /// router killed or restarted in it counts from its new start).
    pub router_relay: BTreeMap<String, u64>,
    /// CPU the routers used during the window, seconds (Σ over routers
    /// running at both ends; local meshes only).
    pub router_cpu_secs: Option<f64>,
    /// `--restart-all-routers-at`: the routers' restart, the members' way
    /// back from the first router ready again and the control plane's load
    /// (absent for the other events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_all: Option<RestartAllRecord>,
    /// The control-plane replica events: the draw, the rolling restart's
    /// steps, the stop (absent for the other events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<crate::replicas::record::ReplicaEvent>,
}

/// The router an event acted on.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EventTarget {
    /// The router acted on, if any.
    pub target: Option<String>,
    /// Members attached to the target just before the event: an event on
    /// an empty router would measure nothing.
    pub target_attached_before: Option<u64>,
    /// Members attached to the target at the window's end; None when it no
    /// longer answered (killed, or exited at the end of its drain).
    pub target_attached_after: Option<u64>,
}

/// The members' readiness and routers over an event's window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FleetWindow {
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
    /// The first members to fall below K in the window (earliest first, at
    /// most `wire::MAX_BELOW_K_RECORDS`): who, when, when back, routers
    /// before and after, the last router error while below K.
    pub below_k_records: Vec<crate::wire::BelowKRecord>,
}

/// The echo calls made during an event's window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WindowCalls {
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
    /// Of `calls_ok`, those that went on a direct connection.
    pub calls_direct: u64,
    /// Warm calls (`--member-direct`: a window caller's second call, made
    /// 2 s after its first, to the same provider) that went direct.
    pub warm_direct: u64,
    /// Warm calls that went relayed.
    pub warm_relayed: u64,
    /// The members' direct-connection counters over the window:
    /// `upgrade:<result>` and `refused:<reason>` (inbound direct
    /// connections closed at once) as their increase, `open` (direct
    /// connections) at the window's end; zeros left out.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub direct_counts: BTreeMap<String, u64>,
    /// Warm calls by `first>warm` path (`relayed>direct`, …).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub warm_paths: BTreeMap<String, u64>,
    /// Warm calls that went relayed, by provider (PeerId tail).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub warm_relayed_by_provider: BTreeMap<String, u64>,
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

/// `key=value` pairs, `-` when empty.
pub(crate) fn joined(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}
