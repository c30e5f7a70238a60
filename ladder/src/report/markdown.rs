//! The report's markdown rendering: the tables and lines printed on stdout.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{
    AfterRecord, BurstRecord, EventRecord, EventTarget, FleetWindow, HoldRecord, Report, joined,
};
use crate::stats::pair;

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

/// Bytes as MiB with one decimal, `-` when unknown.
pub(crate) fn mib(b: Option<u64>) -> String {
    b.map_or_else(|| "-".into(), |b| format!("{:.1}", b as f64 / 1_048_576.0))
}

/// An event's target with its attached members before → after the window
/// (`r2 (5098 → -)`: it no longer answered at the end).
fn target_cell(e: &EventTarget) -> String {
    let Some(t) = e.target.as_deref() else {
        return "-".into();
    };
    let n = |v: Option<u64>| v.map_or_else(|| "-".into(), |v| v.to_string());
    match (e.target_attached_before, e.target_attached_after) {
        (None, None) => t.to_string(),
        (b, a) => format!("{t} ({} → {})", n(b), n(a)),
    }
}

impl Report {
    /// The markdown rendering printed on stdout.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        if let Some(h) = &self.environment.hosts {
            let _ = writeln!(s, "{}\n", h.summary());
        }
        if let Some(st) = &self.environment.store {
            let _ = writeln!(s, "{}\n", st.summary());
        }
        if !self.steps.is_empty() {
            self.steps_tables(&mut s);
        }
        self.routers_table(&mut s);
        self.control_plane_table(&mut s);
        if let Some(h) = &self.hold {
            self.hold_section(&mut s, h);
        }
        self.events_table(&mut s);
        if let Some(c) = &self.control_planes {
            c.markdown(&mut s);
        }
        if let Some(e) = &self.events.restart_all_routers {
            super::restart_all::markdown(&mut s, e);
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
            burst_line(&mut s, b);
        }
        if let Some(a) = &self.after {
            self.after_section(&mut s, a);
        }
        if !self.rounds.is_empty() {
            self.rounds_table(&mut s);
        }
        let _ = writeln!(s);
        if let Some(why) = &self.stopped_early {
            let _ = writeln!(s, "Stopped early: {why}.");
        }
        if let Some(c) = &self.environment.cpu_cap {
            let _ = writeln!(
                s,
                "CPU cap: {} cores ({:?}, {}): throttled in {} of {} periods, {:.1} s in all.",
                c.cores, c.version, c.path, c.throttled_periods, c.periods, c.throttled_secs
            );
        }
        let _ = writeln!(s, "Exits in the whole run: {}.", self.failures.exits);
        s
    }

    /// The steps' joining table, first-call failures and the fleet table.
    fn steps_tables(&self, s: &mut String) {
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
        if !self.failures.first_call_errors.is_empty() {
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "First-call failures by reason (last attempt): {}.",
                joined(&self.failures.first_call_errors)
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

    /// Every router before the ladder and at the end of each step.
    fn routers_table(&self, s: &mut String) {
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
    }

    /// The control plane over each step, when it was read.
    fn control_plane_table(&self, s: &mut String) {
        if !self.steps.iter().any(|s| s.control_plane.is_some()) {
            return;
        }
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

    /// The hold's line, refreshes, idle cost, control-plane memory and flaps.
    fn hold_section(&self, s: &mut String, h: &HoldRecord) {
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

    /// The router and control-plane events: one row each, then their call
    /// failures and below-K records.
    fn events_table(&self, s: &mut String) {
        let e = &self.events;
        let mut events: Vec<(String, &EventRecord)> = [
            ("kill router", &e.kill_router),
            ("drain router", &e.drain_router),
            ("restart control plane", &e.restart_control_plane),
            ("rotate key", &e.rotate_key),
            ("restart all routers", &e.restart_all_routers),
            (
                "rolling restart control planes",
                &e.rolling_restart_control_planes,
            ),
            ("stop control plane", &e.stop_control_plane),
        ]
        .into_iter()
        .filter_map(|(name, r)| r.as_ref().map(|r| (name.to_string(), r)))
        .chain(
            e.kill_control_plane
                .iter()
                .enumerate()
                .map(|(i, r)| (format!("kill control plane #{}", i + 1), r)),
        )
        .collect();
        if events.is_empty() {
            return;
        }
        events.sort_by_key(|(_, r)| r.at_secs);
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "| event | at s | target (attached before → after) | lost ready | below 1 router | below K | back on K p50/p95/max ms | time below K p50/p95/max ms | not back | calls ok/failed | notes |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
        for (name, e) in &events {
            let _ = writeln!(s, "{}", event_row(name, e));
        }
        for (name, e) in &events {
            if !e.calls.call_errors.is_empty() {
                let _ = writeln!(
                    s,
                    "- {name}: window call failures by reason: {}",
                    joined(&e.calls.call_errors)
                );
            }
        }
        for (name, e) in &events {
            below_k_lines(s, name, &e.fleet);
        }
    }

    /// Router memory after the fleet left, against before the ladder.
    fn after_section(&self, s: &mut String, a: &AfterRecord) {
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

    /// One row per round: what joined and what routers kept after it left.
    fn rounds_table(&self, s: &mut String) {
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
}

/// One event's row of the events table.
fn event_row(name: &str, e: &EventRecord) -> String {
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
    if let Some(r) = &e.replica {
        notes.extend(r.notes());
    }
    if e.calls.calls_unfinished > 0 {
        notes.push(format!(
            "{} calls unfinished at window end",
            e.calls.calls_unfinished
        ));
    }
    let c = &e.calls;
    if c.calls_direct + c.warm_direct + c.warm_relayed > 0 {
        let warm = c.warm_direct + c.warm_relayed;
        notes.push(format!(
            "direct {} of {} ok calls; warm calls direct {} of {} ({:.1}%)",
            c.calls_direct,
            c.calls_ok,
            c.warm_direct,
            warm,
            100.0 * c.warm_direct as f64 / warm.max(1) as f64
        ));
    }
    if !c.warm_paths.is_empty() {
        notes.push(format!(
            "warm calls by first>warm path {}; relayed by provider {}",
            joined(&c.warm_paths),
            joined(&c.warm_relayed_by_provider)
        ));
    }
    if !c.direct_counts.is_empty() {
        notes.push(format!(
            "members' direct counters {}",
            joined(&c.direct_counts)
        ));
    }
    if let Some(routers) = router_relay_note(&e.router_relay, e.router_cpu_secs) {
        notes.push(routers);
    }
    if !e.router_refusals.is_empty() {
        notes.push(format!("refusals {}", joined(&e.router_refusals)));
    }
    if !e.router_auth_failures.is_empty() {
        notes.push(format!("auth failures {}", joined(&e.router_auth_failures)));
    }
    let f = &e.fleet;
    let b = &f.back_on_k_ms;
    let t = &f.below_k_ms;
    let max = |m: Option<u64>| m.map_or_else(|| "-".into(), |m| m.to_string());
    format!(
        "| {name} | {} | {} | {} | {} | {} | {}/{} | {}/{} | {} | {}/{} | {} |",
        e.at_secs,
        target_cell(&e.target),
        f.lost_ready,
        f.below_one_router,
        f.below_k_routers,
        pair(b.p50, b.p95),
        max(b.max),
        pair(t.p50, t.p95),
        max(t.max),
        f.not_back_on_k,
        e.calls.calls_ok,
        e.calls.calls_failed,
        if notes.is_empty() {
            "-".into()
        } else {
            notes.join("; ")
        }
    )
}

/// An event's below-K records under the events table, if it has any.
fn below_k_lines(s: &mut String, name: &str, f: &FleetWindow) {
    if f.below_k_records.is_empty() {
        return;
    }
    let n = f.below_k_records.len() as u64;
    let which = if n < f.below_k_routers {
        format!(
            "{n} of {}: the earliest and the longest below K",
            f.below_k_routers
        )
    } else {
        format!("all {n}")
    };
    let _ = writeln!(s, "- {name}: members below K ({which}):");
    for r in &f.below_k_records {
        let _ = writeln!(s, "  {}", below_k_line(r));
    }
}

/// The burst's line.
fn burst_line(s: &mut String, b: &BurstRecord) {
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

/// Routers as a comma-separated list, "none" when empty.
fn router_list(v: &[String]) -> String {
    if v.is_empty() {
        "none".to_string()
    } else {
        v.join(", ")
    }
}

/// One below-K record as a table line.
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

/// The routers' relaying over a window, summed over routers: bytes relayed,
/// circuits accepted and upgraded away, CPU; `None` when nothing was read.
fn router_relay_note(relay: &BTreeMap<String, u64>, cpu_secs: Option<f64>) -> Option<String> {
    let total = |key: &str| -> Option<u64> {
        let mut of = relay
            .iter()
            .filter(|(k, _)| k.rsplit(':').next() == Some(key))
            .map(|(_, n)| *n)
            .peekable();
        of.peek()?;
        Some(of.sum())
    };
    let mut parts = Vec::new();
    if let Some(b) = total("relayed_bytes") {
        parts.push(format!("relayed {:.1} MiB", b as f64 / 1_048_576.0));
    }
    if let Some(n) = total("circuits_accepted") {
        parts.push(format!("circuits {n}"));
    }
    if let Some(n) = total("circuits_upgraded") {
        parts.push(format!("upgraded away {n}"));
    }
    if let Some(c) = cpu_secs {
        parts.push(format!("CPU {c:.1} s"));
    }
    (!parts.is_empty()).then(|| format!("routers: {}", parts.join(", ")))
}
