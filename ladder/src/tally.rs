//! What the coordinator knows about every member, from the workers' events.

use std::collections::BTreeMap;

use crate::stats::{self, P50P95};
use crate::wire::{Event, Tick};

/// When a member joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// A provider of echo, started before the steps.
    Provider,
    /// Step n (1-based).
    Step(u32),
    /// The enrollment burst.
    Burst,
    /// Joiners during the hold's attack (`--attack-joiners`).
    Attack,
}

/// One member's record.
#[derive(Debug, Clone)]
pub struct MemberRec {
    /// When it joined.
    pub phase: Phase,
    /// Start → credential, ms.
    pub enrolled_ms: Option<u64>,
    /// Credential → ready, ms.
    pub ready_ms: Option<u64>,
    /// First call: ok, ms from ready, attempts.
    pub first_call: Option<(bool, u64, u32)>,
    /// Why it exited, if it did.
    pub exit: Option<String>,
    /// Flaps seen.
    pub flaps: u32,
}

/// Every member's record, plus the workers' latest counters.
#[derive(Debug, Default)]
pub struct Tally {
    /// Records by global member index.
    pub members: BTreeMap<u64, MemberRec>,
    /// Latest counters per worker.
    pub ticks: Vec<Tick>,
    /// Last few exit reasons, for diagnosis.
    pub exit_reasons: BTreeMap<String, u64>,
    /// Last few first-call errors, for diagnosis.
    pub call_errors: BTreeMap<String, u64>,
    /// Members per phase that have not finished joining (see [`Tally::phase_done`]).
    pending: BTreeMap<Phase, u64>,
}

/// Distinct reasons kept.
const MAX_REASONS: usize = 32;

/// Aggregates of one phase.
#[derive(Debug, Clone, Default)]
pub struct PhaseSummary {
    /// Members started.
    pub joining: u64,
    /// Members that got a credential.
    pub enrolled: u64,
    /// Members that became ready.
    pub ready: u64,
    /// First calls that succeeded.
    pub first_call_ok: u64,
    /// First calls that failed within the budget.
    pub first_call_failed: u64,
    /// Call attempts per member that made a first call.
    pub calls_per_member: f64,
    /// Members that exited.
    pub exits: u64,
    /// Start → credential.
    pub enroll_ms: P50P95,
    /// Credential → ready.
    pub ready_ms: P50P95,
    /// Ready → first echo back.
    pub first_call_ms: P50P95,
    /// Largest start → credential, ms.
    pub enroll_max_ms: Option<u64>,
}

impl Tally {
    /// Registers members about to be started.
    pub fn register(&mut self, first: u64, count: u64, phase: Phase) {
        *self.pending.entry(phase).or_insert(0) += count;
        for i in first..first + count {
            self.members.insert(
                i,
                MemberRec {
                    phase,
                    enrolled_ms: None,
                    ready_ms: None,
                    first_call: None,
                    exit: None,
                    flaps: 0,
                },
            );
        }
    }

    /// Applies one event from worker `w`.
    pub fn apply(&mut self, w: usize, ev: &Event) {
        let member = match ev {
            Event::Enrolled { member, .. }
            | Event::Ready { member, .. }
            | Event::FirstCall { member, .. }
            | Event::Exit { member, .. } => Some(*member),
            _ => None,
        };
        let was_done = member.and_then(|m| self.members.get(&m)).map(done);
        self.update(w, ev);
        if let (Some(false), Some(m)) = (was_done, member.and_then(|m| self.members.get(&m)))
            && done(m)
            && let Some(n) = self.pending.get_mut(&m.phase)
        {
            *n = n.saturating_sub(1);
        }
    }

    fn update(&mut self, w: usize, ev: &Event) {
        match ev {
            Event::Enrolled { member, ms } => {
                if let Some(m) = self.members.get_mut(member) {
                    m.enrolled_ms = Some(*ms);
                }
            }
            Event::Ready { member, ms } => {
                if let Some(m) = self.members.get_mut(member) {
                    m.ready_ms = Some(*ms);
                }
            }
            Event::FirstCall {
                member,
                ok,
                ms,
                attempts,
                error,
            } => {
                if let Some(m) = self.members.get_mut(member) {
                    m.first_call = Some((*ok, *ms, *attempts));
                }
                if let Some(e) = error {
                    bump(&mut self.call_errors, e);
                }
            }
            Event::Flap { member } => {
                if let Some(m) = self.members.get_mut(member) {
                    m.flaps += 1;
                }
            }
            Event::Exit { member, reason } => {
                if let Some(m) = self.members.get_mut(member) {
                    m.exit = Some(reason.clone());
                }
                bump(&mut self.exit_reasons, reason);
            }
            Event::Tick(t) => {
                if self.ticks.len() <= w {
                    self.ticks.resize(w + 1, Tick::default());
                }
                self.ticks[w] = t.clone();
            }
            Event::Reply { .. } => {}
        }
    }

    /// Whether every member of `phase` has finished joining: called (or, for
    /// providers, ready; for the burst, enrolled) or exited.
    pub fn phase_done(&self, phase: Phase) -> bool {
        self.pending.get(&phase).copied().unwrap_or(0) == 0
    }

    /// Members alive now (started, not exited), across all phases.
    pub fn alive(&self) -> u64 {
        self.members.values().filter(|m| m.exit.is_none()).count() as u64
    }

    /// Members ready now according to the workers' last samples.
    pub fn ready_now(&self) -> u64 {
        self.ticks.iter().map(|t| t.ready).sum()
    }

    /// Aggregates of `phase`.
    pub fn summary(&self, phase: Phase) -> PhaseSummary {
        let members: Vec<&MemberRec> = self.members.values().filter(|m| m.phase == phase).collect();
        let enroll: Vec<u64> = members.iter().filter_map(|m| m.enrolled_ms).collect();
        let ready: Vec<u64> = members.iter().filter_map(|m| m.ready_ms).collect();
        let called: Vec<(bool, u64, u32)> = members.iter().filter_map(|m| m.first_call).collect();
        let ok_ms: Vec<u64> = called.iter().filter(|c| c.0).map(|c| c.1).collect();
        let attempts: u64 = called.iter().map(|c| u64::from(c.2)).sum();
        PhaseSummary {
            joining: members.len() as u64,
            enrolled: enroll.len() as u64,
            ready: ready.len() as u64,
            first_call_ok: ok_ms.len() as u64,
            first_call_failed: (called.len() - ok_ms.len()) as u64,
            calls_per_member: if called.is_empty() {
                0.0
            } else {
                attempts as f64 / called.len() as f64
            },
            exits: members.iter().filter(|m| m.exit.is_some()).count() as u64,
            enroll_ms: stats::p50_p95(&enroll),
            ready_ms: stats::p50_p95(&ready),
            first_call_ms: stats::p50_p95(&ok_ms),
            enroll_max_ms: enroll.iter().copied().max(),
        }
    }

    /// Exits across all members so far.
    pub fn exits(&self) -> u64 {
        self.members.values().filter(|m| m.exit.is_some()).count() as u64
    }
}

fn done(m: &MemberRec) -> bool {
    m.exit.is_some() || finished(m)
}

fn finished(m: &MemberRec) -> bool {
    match m.phase {
        Phase::Provider => m.ready_ms.is_some(),
        Phase::Step(_) | Phase::Attack => m.first_call.is_some(),
        Phase::Burst => m.enrolled_ms.is_some(),
    }
}

fn bump(map: &mut BTreeMap<String, u64>, reason: &str) {
    let key: String = reason.chars().take(160).collect();
    if map.len() < MAX_REASONS || map.contains_key(&key) {
        *map.entry(key).or_insert(0) += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_done_when_everyone_called_or_exited() {
        let mut t = Tally::default();
        t.register(0, 2, Phase::Step(1));
        assert!(!t.phase_done(Phase::Step(1)));
        t.apply(0, &Event::Enrolled { member: 0, ms: 5 });
        t.apply(0, &Event::Ready { member: 0, ms: 7 });
        t.apply(
            0,
            &Event::FirstCall {
                member: 0,
                ok: true,
                ms: 9,
                attempts: 2,
                error: None,
            },
        );
        assert!(!t.phase_done(Phase::Step(1)));
        t.apply(
            0,
            &Event::Exit {
                member: 1,
                reason: "start: boom".into(),
            },
        );
        assert!(t.phase_done(Phase::Step(1)));
        let s = t.summary(Phase::Step(1));
        assert_eq!(
            (s.joining, s.enrolled, s.ready, s.first_call_ok, s.exits),
            (2, 1, 1, 1, 1)
        );
        assert_eq!(s.calls_per_member, 2.0);
        assert_eq!(s.ready_ms.p50, Some(7));
        assert_eq!(t.exit_reasons.get("start: boom"), Some(&1));
    }
}
