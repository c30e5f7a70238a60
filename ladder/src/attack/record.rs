//! What the attack did and what the mesh did meanwhile: the report's
//! `events.attack` object and its markdown.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::attack::counters::Change;
use crate::stats::{self, P50P95, Spread, pair};
use crate::tally::PhaseSummary;
use crate::wire::WindowStats;

/// The attack during the hold.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AttackRecord {
    /// Seconds into the hold when the first attack started.
    pub at_secs: u64,
    /// The router attacked (the busiest at the start).
    pub target_router: Option<String>,
    /// Each harness process: what it was, when, and what it counted.
    pub parts: Vec<PartRecord>,
    /// The routers' refusal counters that grew over the attack, by router
    /// and counter (`router_slots_refused{budget=auth,reason=source_share}`).
    pub router_refusals: BTreeMap<String, BTreeMap<String, Change>>,
    /// The control plane's refusal counters that grew over the attack.
    pub control_plane_refusals: BTreeMap<String, Change>,
    /// The members' view of the window (from the first attack's start
    /// until the next event or the hold's end): lost ready, below K, calls.
    pub window: Window,
    /// Ready → not-ready transitions in the window, all members.
    pub flaps: u64,
    /// Members with at least one of those.
    pub members_flapped: u64,
    /// Members alive at the start that exited in the window.
    pub exits: u64,
    /// The members that joined while the attack ran (`--attack-joiners`).
    pub joiners: Joiners,
    /// For comparison: the last step's (unattacked) start → credential, ms.
    pub unattacked_enroll_ms: P50P95,
    /// For comparison: the last step's (unattacked) credential → ready, ms.
    pub unattacked_ready_ms: P50P95,
    /// What went wrong starting or reading an attack, if anything.
    pub errors: Vec<String>,
}

/// One harness process.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PartRecord {
    /// `router-auth 127.0.0.200 length-byte`, `control-plane-flood 127.0.0.202`.
    pub name: String,
    /// Seconds into the hold when it started.
    pub started_at_secs: f64,
    /// How long it was asked to run, seconds.
    pub duration_secs: u64,
    /// What it counted (`streams_opened`, `code:ResourceExhausted`, …);
    /// empty when it failed (see `error`).
    pub counts: BTreeMap<String, u64>,
    /// Why it has no counts, if it has none.
    pub error: Option<String>,
}

/// What the members saw in the attack's window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Window {
    /// Length, seconds.
    pub secs: f64,
    /// Members attached to the attacked router at the start.
    pub target_attached_before: Option<u64>,
    /// Members attached to it at the end (None: it did not answer).
    pub target_attached_after: Option<u64>,
    /// Members alive at the start.
    pub members: u64,
    /// Members that were not ready at some point.
    pub lost_ready: u64,
    /// Members that had no router at some point.
    pub below_one_router: u64,
    /// Members that had fewer than K routers at some point.
    pub below_k_routers: u64,
    /// Time each member that dropped below K spent there, ms.
    pub below_k_ms: Spread,
    /// Members still below K at the end.
    pub not_back_on_k: u64,
    /// Echo calls during the window that succeeded.
    pub calls_ok: u64,
    /// Echo calls during the window that failed.
    pub calls_failed: u64,
    /// Calls still running at the end.
    pub calls_unfinished: u64,
    /// Failed calls by reason.
    pub call_errors: BTreeMap<String, u64>,
}

impl Window {
    /// The workers' window reports, summed.
    pub fn of(w: &WindowStats) -> Self {
        Self {
            members: w.members,
            lost_ready: w.lost_ready,
            below_one_router: w.below_one_router,
            below_k_routers: w.below_k_routers,
            below_k_ms: stats::spread(&w.below_k_ms),
            not_back_on_k: w.not_back_on_k,
            calls_ok: w.calls_ok,
            calls_failed: w.calls_failed,
            calls_unfinished: w.calls_unfinished,
            call_errors: w.call_errors.clone(),
            ..Self::default()
        }
    }
}

/// The members that joined during the attack.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Joiners {
    /// Members started.
    pub joining: u64,
    /// Members that got a credential.
    pub enrolled: u64,
    /// Members that became ready.
    pub ready: u64,
    /// First calls that came back.
    pub first_call_ok: u64,
    /// Members that exited.
    pub exits: u64,
    /// Start → credential, ms.
    pub enroll_ms: P50P95,
    /// Credential → ready, ms.
    pub ready_ms: P50P95,
    /// Ready → first echo, ms.
    pub first_call_ms: P50P95,
    /// Whether all were done (called or exited) by the window's end.
    pub completed: bool,
}

impl Joiners {
    /// From the tally's summary of their phase.
    pub fn of(s: &PhaseSummary, completed: bool) -> Self {
        Self {
            joining: s.joining,
            enrolled: s.enrolled,
            ready: s.ready,
            first_call_ok: s.first_call_ok,
            exits: s.exits,
            enroll_ms: s.enroll_ms,
            ready_ms: s.ready_ms,
            first_call_ms: s.first_call_ms,
            completed,
        }
    }
}

fn counts_line(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn changes_line(m: &BTreeMap<String, Change>) -> String {
    m.iter()
        .map(|(k, c)| format!("{k} {} → {}", c.before, c.after))
        .collect::<Vec<_>>()
        .join(", ")
}

impl AttackRecord {
    /// The report's attack section.
    pub fn markdown(&self, s: &mut String) {
        let w = &self.window;
        let target = match (&self.target_router, w.target_attached_before) {
            (Some(t), Some(b)) => format!(
                " on {t} (attached {b} → {})",
                w.target_attached_after
                    .map_or_else(|| "-".into(), |a| a.to_string())
            ),
            (Some(t), None) => format!(" on {t}"),
            (None, _) => String::new(),
        };
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "Attack at {} s{target}, window {:.0} s:",
            self.at_secs, w.secs
        );
        let _ = writeln!(s);
        let _ = writeln!(s, "| attacker | started at s | ran s | what it counted |");
        let _ = writeln!(s, "|---|---|---|---|");
        for p in &self.parts {
            let what = match &p.error {
                Some(e) => format!("error: {}", e.lines().next().unwrap_or("")),
                None => counts_line(&p.counts),
            };
            let _ = writeln!(
                s,
                "| {} | {:.0} | {} | {what} |",
                p.name, p.started_at_secs, p.duration_secs
            );
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "- members in the window: {} at the start, flaps {} ({} members), lost ready {}, below 1 router {}, below K {} (not back {}), exits {}, calls ok/failed {}/{}{}",
            w.members,
            self.flaps,
            self.members_flapped,
            w.lost_ready,
            w.below_one_router,
            w.below_k_routers,
            w.not_back_on_k,
            self.exits,
            w.calls_ok,
            w.calls_failed,
            if w.call_errors.is_empty() {
                String::new()
            } else {
                format!(" ({})", counts_line(&w.call_errors))
            }
        );
        let j = &self.joiners;
        let _ = writeln!(
            s,
            "- joined during the attack: {} joining, {} enrolled, {} ready, {} first call ok, {} exits; enroll p50/p95 {} ms (last step {}), ready p50/p95 {} ms (last step {}){}",
            j.joining,
            j.enrolled,
            j.ready,
            j.first_call_ok,
            j.exits,
            pair(j.enroll_ms.p50, j.enroll_ms.p95),
            pair(self.unattacked_enroll_ms.p50, self.unattacked_enroll_ms.p95),
            pair(j.ready_ms.p50, j.ready_ms.p95),
            pair(self.unattacked_ready_ms.p50, self.unattacked_ready_ms.p95),
            if j.completed || j.joining == 0 {
                ""
            } else {
                " (not all done by the window's end)"
            }
        );
        for (router, changes) in &self.router_refusals {
            let _ = writeln!(s, "- {router} refusals: {}", changes_line(changes));
        }
        if !self.control_plane_refusals.is_empty() {
            let _ = writeln!(
                s,
                "- control plane refusals: {}",
                changes_line(&self.control_plane_refusals)
            );
        }
        for e in &self.errors {
            let _ = writeln!(s, "- error: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_names_attackers_members_and_counters() {
        let r = AttackRecord {
            at_secs: 10,
            target_router: Some("r2".into()),
            parts: vec![
                PartRecord {
                    name: "router-auth 127.0.0.200 length-byte".into(),
                    started_at_secs: 10.0,
                    duration_secs: 60,
                    counts: [("streams_opened".to_string(), 4000)].into(),
                    error: None,
                },
                PartRecord {
                    name: "control-plane-flood 127.0.0.202".into(),
                    started_at_secs: 10.2,
                    duration_secs: 60,
                    error: Some("exited with 1\nmore".into()),
                    ..PartRecord::default()
                },
            ],
            router_refusals: [(
                "r2".to_string(),
                [(
                    "router_failed_logins{reason=silent}".to_string(),
                    Change {
                        before: 0,
                        after: 41,
                    },
                )]
                .into(),
            )]
            .into(),
            window: Window {
                secs: 60.2,
                members: 400,
                target_attached_before: Some(120),
                calls_ok: 30,
                ..Window::default()
            },
            joiners: Joiners {
                joining: 100,
                ready: 100,
                completed: true,
                ready_ms: P50P95 {
                    p50: Some(40),
                    p95: Some(90),
                },
                ..Joiners::default()
            },
            unattacked_ready_ms: P50P95 {
                p50: Some(35),
                p95: Some(80),
            },
            ..AttackRecord::default()
        };
        let mut md = String::new();
        r.markdown(&mut md);
        for want in [
            "Attack at 10 s on r2 (attached 120 → -), window 60 s:",
            "| router-auth 127.0.0.200 length-byte | 10 | 60 | streams_opened=4000 |",
            "| control-plane-flood 127.0.0.202 | 10 | 60 | error: exited with 1 |",
            "- members in the window: 400 at the start, flaps 0 (0 members)",
            "calls ok/failed 30/0",
            "ready p50/p95 40/90 ms (last step 35/80)",
            "- r2 refusals: router_failed_logins{reason=silent} 0 → 41",
        ] {
            assert!(md.contains(want), "{want:?} missing from:\n{md}");
        }
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(
            json["router_refusals"]["r2"]["router_failed_logins{reason=silent}"]["after"],
            41
        );
        assert_eq!(json["joiners"]["ready_ms"]["p95"], 90);
        assert_eq!(json["parts"][0]["counts"]["streams_opened"], 4000);
    }
}
