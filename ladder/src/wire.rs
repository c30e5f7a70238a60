//! The coordinator ↔ worker protocol: JSON lines, commands on the worker's
//! stdin, events on its stdout.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A command to a worker.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Command {
    /// Start `count` members numbered from `first`, paced at `rate_per_sec`
    /// (0 = all at once). Providers expose the echo service and make no first call.
    Join {
        /// Request id for the reply (sent once every member has been started).
        id: u64,
        /// Global index of the first member.
        first: u64,
        /// How many.
        count: u64,
        /// Members started per second by this worker; 0 = all at the same instant.
        rate_per_sec: f64,
        /// Whether these members expose the echo service.
        provider: bool,
    },
    /// Start an observation window (an event is about to happen).
    Mark {
        /// Request id.
        id: u64,
        /// Window name.
        name: String,
    },
    /// End the current window and report on it.
    WindowReport {
        /// Request id.
        id: u64,
    },
    /// Report the hold counters (since the last `HoldStart`).
    HoldReport {
        /// Request id.
        id: u64,
    },
    /// Reset the hold counters.
    HoldStart {
        /// Request id.
        id: u64,
    },
    /// Open `count` calls to `service` from ready step members (only those
    /// enrolled with the revocable token when `revocable_only`) and hold
    /// them open, each pinging once a second, until the next
    /// `PropagationReport`. Replied to once every attempt ended.
    LiveCalls {
        /// Request id.
        id: u64,
        /// Service to call.
        service: String,
        /// Calls to open at most.
        count: u64,
        /// Only from members enrolled with the revocable token.
        revocable_only: bool,
    },
    /// Report, relative to `since_unix_ms`, when each member took a change
    /// of its policy (a version ≥ `min_version` when given, else any change:
    /// a revocation), when each held call ended and when each revocable
    /// member held no router; then end the held calls.
    PropagationReport {
        /// Request id.
        id: u64,
        /// The admin call's instant, Unix ms.
        since_unix_ms: u64,
        /// The version members must hold (policy change).
        min_version: Option<u64>,
        /// Members enrolled with the revocable token are the revoked ones:
        /// counted apart (revocation), or left out (their token was revoked
        /// before this event).
        revoked: RevokedMembers,
    },
    /// Shut every member down and exit.
    Leave {
        /// Request id.
        id: u64,
    },
}

/// An event from a worker.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// The member holds a credential; `ms` since its start.
    Enrolled {
        /// Global member index.
        member: u64,
        /// Milliseconds from start to credential in hand.
        ms: u64,
    },
    /// The member is ready; `ms` since it held a credential.
    Ready {
        /// Global member index.
        member: u64,
        /// Milliseconds from credential to ready.
        ms: u64,
    },
    /// The member's first call through the mesh finished.
    FirstCall {
        /// Global member index.
        member: u64,
        /// Whether the echo came back byte-identical within the budget.
        ok: bool,
        /// Milliseconds from ready to the successful (or last) attempt's end.
        ms: u64,
        /// Attempts made.
        attempts: u32,
        /// The last error, if it failed.
        error: Option<String>,
    },
    /// A ready member lost readiness.
    Flap {
        /// Global member index.
        member: u64,
    },
    /// The member stopped (failed to start, gave up enrolling, or its node ended).
    Exit {
        /// Global member index.
        member: u64,
        /// Why.
        reason: String,
    },
    /// Periodic counters (every second).
    Tick(Tick),
    /// The answer to a command.
    Reply {
        /// The command's id.
        id: u64,
        /// The answer.
        body: Reply,
    },
}

/// A worker's periodic counters.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Tick {
    /// Members started and not exited.
    pub alive: u64,
    /// Members ready at this sample.
    pub ready: u64,
    /// Open file descriptors of the worker.
    pub fds: u64,
    /// Resident memory of the worker, bytes.
    #[serde(default)]
    pub rss_bytes: u64,
    /// CPU time of the worker since it started, seconds.
    #[serde(default)]
    pub cpu_secs: f64,
}

/// Answers to commands.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reply {
    /// The command was carried out.
    Done,
    /// The command failed.
    Failed {
        /// Why.
        error: String,
    },
    /// A window's observations.
    Window(Box<WindowStats>),
    /// The hold's observations.
    Hold(HoldStats),
    /// What `LiveCalls` opened.
    LiveCalls {
        /// Calls open.
        opened: u64,
        /// Attempts that failed.
        failed: u64,
    },
    /// A propagation event's observations.
    Propagation(PropagationStats),
}

/// How a propagation report treats members enrolled with the revocable token.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RevokedMembers {
    /// Their token is not revoked: members like the others.
    None,
    /// This event revoked their token: counted as revoked.
    ThisEvent,
    /// An earlier event revoked it: left out.
    Earlier,
}

/// What a worker saw of a propagation event (ms after the admin call).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PropagationStats {
    /// Members concerned by taking the change.
    pub members: u64,
    /// Per member that took it: ms from the admin call.
    pub took_ms: Vec<u64>,
    /// Members concerned that had not taken it.
    pub not_taken: u64,
    /// Held calls open (or ended) at the report.
    pub live_calls: u64,
    /// Held calls that ended before the admin call.
    pub ended_before: u64,
    /// Per held call that ended after the admin call: ms from it.
    pub closed_ms: Vec<u64>,
    /// Held calls still open.
    pub still_open: u64,
    /// How held calls ended, by reason.
    pub close_reasons: BTreeMap<String, u64>,
    /// Live revoked members.
    pub revoked_members: u64,
    /// Per revoked member that lost its last router after the admin call: ms from it.
    pub dropped_ms: Vec<u64>,
    /// Revoked members still holding a router.
    pub not_dropped: u64,
}

/// What a worker saw between `Mark` and `WindowReport`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WindowStats {
    /// Members alive at the mark.
    pub members: u64,
    /// Members that were not ready at some point in the window.
    pub lost_ready: u64,
    /// For members that lost readiness: ms from the mark until ready again
    /// (after their last loss in the window).
    #[serde(default)]
    pub ready_again_ms: Vec<u64>,
    /// Members that lost readiness and were not ready again by the report.
    #[serde(default)]
    pub not_ready_again: u64,
    /// The worker's wall clock at the mark, Unix ms: the coordinator
    /// rebases the ms-from-the-mark lists of each worker to an instant of
    /// its own (a router ready again) with it.
    #[serde(default)]
    pub mark_unix_ms: u64,
    /// Members that had no router at some point.
    pub below_one_router: u64,
    /// Members that had fewer than K routers at some point.
    pub below_k_routers: u64,
    /// For members that fell below K: ms from the mark until back on K.
    pub back_on_k_ms: Vec<u64>,
    /// For members that fell below K: ms they spent below K in the window
    /// (all dips added up; one still open counts until the report).
    #[serde(default)]
    pub below_k_ms: Vec<u64>,
    /// Members that fell below K and were not back by the report.
    pub not_back_on_k: u64,
    /// Echo calls made during the window that succeeded.
    pub calls_ok: u64,
    /// Echo calls made during the window that failed.
    pub calls_failed: u64,
    /// Call failures by reason (see `member::CallFailure`).
    pub call_errors: BTreeMap<String, u64>,
    /// Calls still running when the window was reported (neither ok nor failed).
    #[serde(default)]
    pub calls_unfinished: u64,
    /// Of `calls_ok`, those whose stream went on a direct connection.
    #[serde(default)]
    pub calls_direct: u64,
    /// Warm calls (`--member-direct`: each window caller calls again
    /// `--warm-call-after-secs` after its first call, to the same
    /// provider): those that went direct.
    #[serde(default)]
    pub warm_direct: u64,
    /// Warm calls that went relayed.
    #[serde(default)]
    pub warm_relayed: u64,
    /// What direct connections did over the window (`--member-direct`).
    #[serde(default)]
    pub direct: DirectWindow,
    /// Members that fell below K in the window, as picked by
    /// [`pick_below_k`] (at most [`MAX_BELOW_K_RECORDS`] per worker).
    #[serde(default)]
    pub below_k_records: Vec<BelowKRecord>,
}

/// What direct connections did over a window, beside the calls' paths.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DirectWindow {
    /// The members' direct-connection counters over the window
    /// (`member::Member::direct_counts`): `upgrade:<result>` and
    /// `refused:<reason>` as the increase from the window's start (members
    /// alive at both ends; zeros left out), `open` as at its end.
    #[serde(default)]
    pub counts: BTreeMap<String, u64>,
    /// Warm calls by the path of the caller's first call and of the warm
    /// one: `relayed>direct`, `relayed>relayed`, `direct>direct`,
    /// `direct>relayed` (a direct connection lost in between).
    #[serde(default)]
    pub warm_paths: BTreeMap<String, u64>,
    /// Warm calls that went relayed, by the provider's PeerId (its last six
    /// characters): one provider holding most says it is that provider.
    #[serde(default)]
    pub warm_relayed_by_provider: BTreeMap<String, u64>,
}

/// Below-K records kept per worker and window, and per event in the report.
pub const MAX_BELOW_K_RECORDS: usize = 20;

/// The below-K records worth reading, at most [`MAX_BELOW_K_RECORDS`]: half
/// the earliest (how the event started) and the rest the members that
/// stayed below K longest (what kept them there; not back counts as
/// longest), listed earliest first. Picking from per-worker picks gives the
/// same as picking from all: each worker's earliest and longest are in its
/// own pick.
pub fn pick_below_k(mut all: Vec<BelowKRecord>) -> Vec<BelowKRecord> {
    all.sort_by_key(|r| (r.at_ms, r.member));
    if all.len() > MAX_BELOW_K_RECORDS {
        let earliest = MAX_BELOW_K_RECORDS / 2;
        let mut rest = all.split_off(earliest);
        rest.sort_by_key(|r| {
            std::cmp::Reverse(r.back_ms.map_or(u64::MAX, |b| b.saturating_sub(r.at_ms)))
        });
        all.extend(rest.into_iter().take(MAX_BELOW_K_RECORDS - earliest));
        all.sort_by_key(|r| (r.at_ms, r.member));
    }
    all
}

/// One member that fell below K routers in an event window: who, when,
/// when back, which routers before and after, and the last router error
/// the node showed while below K (what kept it there).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BelowKRecord {
    /// Global member index.
    pub member: u64,
    /// The member's PeerId.
    pub peer_id: String,
    /// Ms from the window's start when it fell below K.
    pub at_ms: u64,
    /// Ms from the window's start when it was back on K (none: not by the report).
    pub back_ms: Option<u64>,
    /// Routers it held (reserved) when last on K: PeerIds, router names in
    /// the report where the ladder knows them.
    pub routers_before: Vec<String>,
    /// Routers it held when it fell below K.
    pub routers_after: Vec<String>,
    /// The node's last router error while below K.
    pub last_router_error: Option<String>,
}

/// What a worker saw since `HoldStart`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HoldStats {
    /// Samples taken (one a second).
    pub samples: u64,
    /// Ready → not ready transitions.
    pub flaps: u64,
    /// Members with at least one flap.
    pub members_flapped: u64,
    /// Fewest members ready at one sample.
    pub fewest_ready: u64,
    /// Members alive at the last sample.
    pub alive: u64,
    /// Members that exited during the hold.
    pub exits: u64,
    /// `/readyz` reads over members' Unix sockets.
    pub socket_checks: u64,
    /// Reads answered with a readiness that differs from the watch channel
    /// both before and after the read (a real disagreement).
    pub socket_mismatches: u64,
    /// Reads with no answer: failed, or none within the read's deadline
    /// (a slow read, not an answer "not ready").
    #[serde(default)]
    pub socket_unanswered: u64,
    /// Reads during which the watch changed, answered with one of its two
    /// values (agreeing, at an instant of the read).
    #[serde(default)]
    pub socket_changed: u64,
    /// The slowest read, milliseconds.
    #[serde(default)]
    pub socket_read_max_ms: u64,
    /// The first members to lose readiness (the first loss of each), at
    /// most [`MAX_FLAP_RECORDS`] per worker.
    #[serde(default)]
    pub flap_records: Vec<FlapRecord>,
}

/// Flap records kept per worker, and in the report.
pub const MAX_FLAP_RECORDS: usize = 20;

/// One member that lost readiness during the hold: who, when, which
/// routers it held before and after, and the node's last router error.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FlapRecord {
    /// Global member index.
    pub member: u64,
    /// The member's PeerId.
    pub peer_id: String,
    /// Seconds into the hold when the loss was sampled.
    pub at_secs: f64,
    /// Routers it held (reserved) when last seen ready: PeerIds, router
    /// names in the report where the ladder knows them.
    pub routers_before: Vec<String>,
    /// Of those, the ones that had sent go-away.
    pub leaving_before: Vec<String>,
    /// Routers it held when the loss was sampled.
    pub routers_after: Vec<String>,
    /// The node's last router error then (refusal, failed connection,
    /// lost reservation, go-away), if any.
    pub last_router_error: Option<String>,
}

#[cfg(test)]
mod pick_tests {
    use super::*;

    fn rec(member: u64, at_ms: u64, back_ms: Option<u64>) -> BelowKRecord {
        BelowKRecord {
            member,
            at_ms,
            back_ms,
            ..BelowKRecord::default()
        }
    }

    #[test]
    fn the_earliest_and_the_longest_below_k_are_kept() {
        // 50 members below K 0..49 ms in, member i back 5 + i ms later,
        // except member 25 (back after 90 s) and member 27 (never back).
        let all: Vec<_> = (0..50)
            .map(|i| match i {
                25 => rec(i, i, Some(90_025)),
                27 => rec(i, i, None),
                _ => rec(i, i, Some(2 * i + 5)),
            })
            .collect();
        let kept = pick_below_k(all.clone());
        assert_eq!(kept.len(), MAX_BELOW_K_RECORDS);
        let members: Vec<u64> = kept.iter().map(|r| r.member).collect();
        assert_eq!(&members[..10], &(0..10).collect::<Vec<_>>()[..]);
        assert!(
            members.contains(&25) && members.contains(&27),
            "{members:?}"
        );
        assert_eq!(&members[10..], [25, 27, 42, 43, 44, 45, 46, 47, 48, 49]);
        assert!(kept.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        // Picking again from picks (the coordinator over workers) keeps them.
        let (a, b) = all.split_at(25);
        let again = pick_below_k(
            pick_below_k(a.to_vec())
                .into_iter()
                .chain(pick_below_k(b.to_vec()))
                .collect(),
        );
        assert_eq!(again, kept);
        // Few records: all of them, earliest first.
        let few = pick_below_k(vec![rec(2, 9, None), rec(1, 3, Some(4))]);
        assert_eq!(few.iter().map(|r| r.member).collect::<Vec<_>>(), [1, 2]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let c = Command::Join {
            id: 1,
            first: 10,
            count: 5,
            rate_per_sec: 2.5,
            provider: false,
        };
        let line = serde_json::to_string(&c).expect("encode");
        assert!(line.contains("\"cmd\":\"join\""));
        assert_eq!(serde_json::from_str::<Command>(&line).expect("decode"), c);
        let e = Event::Reply {
            id: 3,
            body: Reply::Window(Box::new(WindowStats {
                back_on_k_ms: vec![5],
                ..Default::default()
            })),
        };
        let line = serde_json::to_string(&e).expect("encode");
        assert_eq!(serde_json::from_str::<Event>(&line).expect("decode"), e);
        let t = Event::Tick(Tick {
            alive: 1,
            ready: 1,
            fds: 9,
            rss_bytes: 1 << 20,
            cpu_secs: 0.5,
        });
        let line = serde_json::to_string(&t).expect("encode");
        assert_eq!(serde_json::from_str::<Event>(&line).expect("decode"), t);
        let h = Event::Reply {
            id: 4,
            body: Reply::Hold(HoldStats {
                flaps: 1,
                flap_records: vec![FlapRecord {
                    member: 3,
                    peer_id: "p".into(),
                    at_secs: 1.5,
                    routers_before: vec!["a".into()],
                    last_router_error: Some("e".into()),
                    ..FlapRecord::default()
                }],
                ..HoldStats::default()
            }),
        };
        let line = serde_json::to_string(&h).expect("encode");
        assert_eq!(serde_json::from_str::<Event>(&line).expect("decode"), h);
        // A worker without flap records (an older binary) still decodes.
        let old = r#"{"ev":"reply","id":5,"body":{"kind":"hold","samples":1,"flaps":0,"members_flapped":0,"fewest_ready":1,"alive":1,"exits":0,"socket_checks":0,"socket_mismatches":0}}"#;
        assert!(serde_json::from_str::<Event>(old).is_ok());
    }
}
