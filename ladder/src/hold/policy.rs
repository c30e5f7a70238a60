//! The propagation events of the hold (`--policy-change-at`,
//! `--revoke-token-at`; local mode): what the ladder prepares before the
//! mesh starts (the start policy, the revocable token), and each event:
//! held calls opened first, then the admin call, the fleet observed until
//! the window's end, then each member's and each held call's times (see
//! `crate::propagation` for what is measured and how).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentmesh_proto::pb::controlplane::{ApplyPolicyRequest, CreateTokenRequest};
use agentmesh_proto::pb::credential::{Role, TokenKind};
use tokio::time::Instant;

use crate::config::{FleetConfig, LocalConfig};
use crate::error::{LadderError, Result};
use crate::fleet::Fleet;
use crate::member::ECHO;
use crate::mesh::{LocalMesh, TOKEN_TTL_SECS};
use crate::procstat;
use crate::propagation::record::{MeshCost, Revoked};
use crate::propagation::{
    CHANGED_POLICY, HELD_SERVICE, PropagationRecord, PropagationWorkerConfig, Quantiles,
    START_POLICY, unix_ms,
};
use crate::target::Target;
use crate::wire::{Command, PropagationStats, Reply, RevokedMembers};
use agentmesh_controlplane::Client;

/// Deadline for the workers to open their held calls (each call's own
/// deadline is the members' call budget; they open 128 at a time).
const OPEN_DEADLINE: Duration = Duration::from_secs(180);
/// Deadline for the workers' propagation reports.
const REPORT_DEADLINE: Duration = Duration::from_secs(60);
/// Extra uses of the revocable token (restarts, retries).
const TOKEN_SLACK: u64 = 20;

/// Which propagation event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    /// `--policy-change-at`.
    PolicyChange,
    /// `--revoke-token-at`.
    RevokeToken,
}

/// Before the control plane starts: with `--policy-change-at`, writes
/// [`START_POLICY`] into `dir` and has the control plane start with it.
pub fn prepare_control_plane(local: &mut LocalConfig, cfg: &FleetConfig, dir: &Path) -> Result<()> {
    if cfg.propagation.policy_change_at_secs.is_none() {
        return Ok(());
    }
    if local
        .control_plane_args
        .iter()
        .any(|a| a.starts_with("--policy"))
    {
        return Err(LadderError::Args(
            "--policy-change-at starts the control plane with a policy of its own: \
             no --control-plane-arg=--policy…"
                .into(),
        ));
    }
    let file = dir.join("policy-start.toml");
    std::fs::write(&file, START_POLICY)
        .map_err(|e| LadderError::io(format!("writing {}", file.display()), e))?;
    local
        .control_plane_args
        .push(format!("--policy={}", file.display()));
    Ok(())
}

/// After the mesh started: with `--revoke-token-at`, mints the token the
/// revocable members enroll with (its file in the run's directory).
pub async fn prepare_token(mesh: &mut LocalMesh, cfg: &FleetConfig) -> Result<()> {
    if cfg.propagation.revoke_token_at_secs.is_none() {
        return Ok(());
    }
    let uses = cfg.total_members() / cfg.propagation.revoke_every.max(1) + TOKEN_SLACK;
    let client = mesh.admin_client()?;
    let r = client
        .create_token(
            &mesh.admin_token,
            CreateTokenRequest {
                kind: TokenKind::Ephemeral as i32,
                role: Role::Member as i32,
                labels: Vec::new(),
                max_uses: u32::try_from(uses).unwrap_or(u32::MAX),
                ttl_secs: TOKEN_TTL_SECS,
            },
        )
        .await
        .map_err(|e| LadderError::Grpc {
            call: "CreateToken",
            status: e.to_string(),
        })?;
    let file: PathBuf =
        crate::children::write_secret(&mesh.dir.join("member-revocable.token"), &r.token)?;
    mesh.revocable_token = Some((file, r.token_id));
    Ok(())
}

/// What the workers are told for the events `cfg` asks for.
pub fn worker_config(target: &Target, cfg: &FleetConfig) -> PropagationWorkerConfig {
    let revocable = match target {
        Target::Local(m) => m.revocable_token.as_ref().map(|(f, _)| f.clone()),
        Target::Remote { .. } => None,
    };
    PropagationWorkerConfig {
        expose_also: cfg
            .propagation
            .policy_change_at_secs
            .map(|_| HELD_SERVICE.to_string()),
        revocable_every: if revocable.is_some() {
            cfg.propagation.revoke_every
        } else {
            0
        },
        revocable_token_file: revocable,
    }
}

/// Runs one propagation event at `at` s into the hold, observing until
/// `window_end`; `revoked_before`: the token was revoked by an earlier event.
pub(super) async fn run(
    fleet: &mut Fleet,
    target: &mut Target,
    cfg: &FleetConfig,
    what: What,
    at: u64,
    window_end: Instant,
    revoked_before: bool,
) -> Result<PropagationRecord> {
    let mut record = PropagationRecord {
        at_secs: at,
        ..PropagationRecord::default()
    };
    record.held.live_calls_not_opened = open_held_calls(fleet, cfg, what).await?;
    super::mark(fleet, &format!("{what:?}")).await?;
    let marked = Instant::now();
    let cpu_before = cpu(target);
    let pushes_before = pushes(target).await;
    let since = unix_ms();
    let outcome = match super::replicas::unwatched_client(target).await {
        Ok((client, via)) => {
            record.via = via;
            match what {
                What::PolicyChange => super::while_pumping(fleet, apply_changed(target, &client))
                    .await
                    .map(|v| record.version = Some(v)),
                What::RevokeToken => super::while_pumping(fleet, revoke(target, &client))
                    .await
                    .map(|id| record.token_id = Some(id)),
            }
        }
        Err(e) => Err(e),
    };
    if let Err(e) = outcome {
        eprintln!("\rladder: event {what:?}: {e}");
        record.error = Some(e.to_string());
    }
    fleet.pump_until(window_end, |_| false).await;
    let cpu_after = cpu(target);
    record.router_pushes = grown(&pushes_before, &pushes(target).await);
    let w = super::window_stats(fleet).await?;
    let revoked = match (what, revoked_before) {
        (What::RevokeToken, _) => RevokedMembers::ThisEvent,
        (What::PolicyChange, true) => RevokedMembers::Earlier,
        (What::PolicyChange, false) => RevokedMembers::None,
    };
    let min_version = record.version;
    let replies = fleet
        .broadcast(
            |id| Command::PropagationReport {
                id,
                since_unix_ms: since,
                min_version,
                revoked,
            },
            REPORT_DEADLINE,
        )
        .await?;
    record.window_secs = marked.elapsed().as_secs_f64();
    take_sums(&mut record, sum(replies));
    record.calls_ok = w.calls_ok;
    record.calls_failed = w.calls_failed;
    record.cost = cost(cpu_before, cpu_after, target, fleet).await;
    log_event(what, &record);
    Ok(record)
}

/// Opens the calls the event will forbid and holds them (see
/// [`Command::LiveCalls`]); returns the attempts that failed.
async fn open_held_calls(fleet: &mut Fleet, cfg: &FleetConfig, what: What) -> Result<u64> {
    let (service, count, revocable_only) = match what {
        What::PolicyChange => (
            HELD_SERVICE,
            cfg.propagation
                .live_calls
                .div_ceil(fleet.worker_count().max(1) as u64),
            false,
        ),
        What::RevokeToken => (ECHO, u64::MAX, true),
    };
    // Revoked members cannot open calls: after an earlier revocation the
    // change's held calls come from the others only (they are not revocable).
    let replies = fleet
        .broadcast(
            |id| Command::LiveCalls {
                id,
                service: service.to_string(),
                count,
                revocable_only,
            },
            OPEN_DEADLINE,
        )
        .await?;
    let mut opened = 0;
    let mut not_opened = 0;
    for r in replies {
        if let Reply::LiveCalls { opened: o, failed } = r {
            opened += o;
            not_opened += failed;
        }
    }
    // A worker with fewer ready callers than its share leaves the rest to
    // the others: asked one by one for what is still missing.
    if what == What::PolicyChange {
        for w in 0..fleet.worker_count() {
            let missing = cfg.propagation.live_calls.saturating_sub(opened);
            if missing == 0 {
                break;
            }
            if let Ok(Reply::LiveCalls { opened: o, failed }) = fleet
                .request(w, |id| Command::LiveCalls {
                    id,
                    service: service.to_string(),
                    count: missing,
                    revocable_only,
                })
                .await
            {
                opened += o;
                not_opened += failed;
            }
        }
    }
    Ok(not_opened)
}

/// The workers' summed propagation report into `record`.
fn take_sums(record: &mut PropagationRecord, sum: PropagationStats) {
    record.members = sum.members;
    record.took_ms = Quantiles::of(&sum.took_ms);
    record.not_taken = sum.not_taken;
    let held = &mut record.held;
    held.live_calls = sum.live_calls;
    held.live_calls_ended_before = sum.ended_before;
    held.closed_ms = Quantiles::of(&sum.closed_ms);
    held.still_open = sum.still_open;
    held.close_reasons = sum.close_reasons;
    record.revoked = Revoked {
        revoked_members: sum.revoked_members,
        dropped_ms: Quantiles::of(&sum.dropped_ms),
        not_dropped: sum.not_dropped,
    };
}

/// CPU over the window (between two readings) and the control plane's
/// memory at its end; the pre-ladder baseline is set by the run.
async fn cost(
    before: Option<Cpu>,
    after: Option<Cpu>,
    target: &mut Target,
    fleet: &Fleet,
) -> MeshCost {
    let mut cost = MeshCost::default();
    if let (Some(b), Some(a)) = (&before, &after) {
        cost.control_plane_cpu_secs = match (b.control_plane, a.control_plane) {
            (Some(b), Some(a)) => Some((a - b).max(0.0)),
            _ => None,
        };
        for (name, after) in &a.routers {
            if let Some(before) = b.routers.get(name) {
                cost.router_cpu_secs
                    .insert(name.clone(), (after - before).max(0.0));
            }
        }
    }
    cost.control_plane_rss_bytes = target.control_plane().await.and_then(|c| c.rss_bytes);
    cost.enrolled_members = fleet
        .tally
        .members
        .values()
        .filter(|m| m.enrolled_ms.is_some())
        .count() as u64;
    cost
}

/// The event's progress line.
fn log_event(what: What, record: &PropagationRecord) {
    let p99 = |q: &Quantiles| q.p99.map_or_else(|| "-".into(), |v| v.to_string());
    eprintln!(
        "\rladder: event {what:?} at {} s: {} of {} members took it (p99 {} ms), {} of {} forbidden calls closed (p99 {} ms), {} of {} revoked members dropped",
        record.at_secs,
        record.took_ms.count,
        record.members,
        p99(&record.took_ms),
        record.held.closed_ms.count,
        record.held.live_calls,
        p99(&record.held.closed_ms),
        record.revoked.dropped_ms.count,
        record.revoked.revoked_members
    );
}

/// Applies [`CHANGED_POLICY`] through `client`; returns the version now in force.
async fn apply_changed(target: &mut Target, client: &Client) -> Result<u64> {
    let mesh = target.local("--policy-change-at")?;
    let r = client
        .apply_policy(
            &mesh.admin_token,
            ApplyPolicyRequest {
                text: CHANGED_POLICY.to_string(),
                dry_run: false,
                author: "agentmesh-ladder --policy-change-at".into(),
            },
        )
        .await
        .map_err(|e| LadderError::Grpc {
            call: "ApplyPolicy",
            status: e.to_string(),
        })?;
    if !r.applied {
        return Err(LadderError::Process(format!(
            "ApplyPolicy applied nothing (version {} in force)",
            r.version
        )));
    }
    Ok(r.version)
}

/// Revokes the revocable token through `client`; returns its id.
async fn revoke(target: &mut Target, client: &Client) -> Result<String> {
    let mesh = target.local("--revoke-token-at")?;
    let (_, id) = mesh
        .revocable_token
        .clone()
        .ok_or_else(|| LadderError::Process("no revocable token was minted".into()))?;
    client
        .revoke_token(&mesh.admin_token, &id, "agentmesh-ladder --revoke-token-at")
        .await
        .map_err(|e| LadderError::Grpc {
            call: "RevokeToken",
            status: e.to_string(),
        })?;
    Ok(id)
}

/// CPU seconds of the control plane (its replicas added up) and of each router, now.
struct Cpu {
    control_plane: Option<f64>,
    routers: BTreeMap<String, f64>,
}

/// Names of the routers' push counters the record keeps.
const PUSH_COUNTERS: [(&str, &str); 2] = [
    ("agentmesh_router_policy_push_total", "outcome"),
    ("agentmesh_router_policy_push_decisions_total", "decision"),
];

/// The routers' policy pushes so far, summed over the routers, by
/// `outcome=…` and `decision=…` (empty where `/metrics` did not answer).
async fn pushes(target: &mut Target) -> BTreeMap<String, u64> {
    let Ok(mesh) = target.local("policy pushes") else {
        return BTreeMap::new();
    };
    let addrs: Vec<_> = mesh.routers.iter().map(|r| r.metrics).collect();
    let mut sum = BTreeMap::new();
    for addr in addrs {
        let Ok(page) = crate::http::get(addr, "/metrics", PUSH_SCRAPE_TIMEOUT).await else {
            continue;
        };
        let m = crate::prom::Metrics::parse(&page.body);
        for s in &m.samples {
            for (name, label) in PUSH_COUNTERS {
                if s.name == name
                    && let Some(v) = s.labels.get(label)
                {
                    *sum.entry(format!("{label}={v}")).or_insert(0) += s.value.max(0.0) as u64;
                }
            }
        }
    }
    sum
}

/// Deadline of one router's `/metrics` read for the push counters.
const PUSH_SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// What grew between two readings (non-zero only).
fn grown(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, a)| {
            let d = a.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

fn cpu(target: &mut Target) -> Option<Cpu> {
    let mesh = target.local("cpu").ok()?;
    let routers = (0..mesh.routers.len())
        .filter_map(|i| {
            let secs = procstat::cpu_secs(mesh.router_pid(i)?)?;
            Some((mesh.routers[i].name.clone(), secs))
        })
        .collect();
    // Every replica's: the change goes through one the routers do not
    // watch and reaches them through another.
    let replicas: Vec<f64> = mesh
        .control_planes
        .replicas
        .iter()
        .filter_map(|r| r.pid().and_then(procstat::cpu_secs))
        .collect();
    Some(Cpu {
        control_plane: (!replicas.is_empty()).then(|| replicas.iter().sum()),
        routers,
    })
}

fn sum(replies: Vec<Reply>) -> PropagationStats {
    let mut s = PropagationStats::default();
    for r in replies {
        if let Reply::Propagation(x) = r {
            s.members += x.members;
            s.took_ms.extend(x.took_ms);
            s.not_taken += x.not_taken;
            s.live_calls += x.live_calls;
            s.ended_before += x.ended_before;
            s.closed_ms.extend(x.closed_ms);
            s.still_open += x.still_open;
            for (k, v) in x.close_reasons {
                *s.close_reasons.entry(k).or_insert(0) += v;
            }
            s.revoked_members += x.revoked_members;
            s.dropped_ms.extend(x.dropped_ms);
            s.not_dropped += x.not_dropped;
        }
    }
    s
}
