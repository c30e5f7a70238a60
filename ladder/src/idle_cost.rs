//! Idle cost per member: CPU-seconds per member per hour over the quiet
//! part of the hold (from its start to the first event, or its end), on the
//! member side (the worker processes hosting the members) and on the mesh
//! side (routers, control plane), from `/proc/PID/stat` deltas.
//!
//! Why: a member that does nothing still wakes up (timers, pings, polls,
//! republishing), and at 10,000 members that is what fills a core before
//! any event. The figure is the one to compare before and after removing
//! work a quiet member does not need. The member side includes the
//! ladder's own sampling (each member's readiness every second, its socket
//! checks), which a production member does not do: it is an upper bound.
//!
//! Pure: [`CpuSample`]s are taken by the hold, [`IdleCost::between`]
//! computes the row.

use serde::Serialize;

/// Seconds in an hour.
const HOUR_SECS: f64 = 3_600.0;

/// CPU time used so far by each side, seconds (`None`: not readable, e.g.
/// the routers of a remote mesh).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuSample {
    /// Seconds since an arbitrary origin shared by both samples.
    pub at_secs: f64,
    /// Σ over the worker processes.
    pub workers: Option<f64>,
    /// Σ over the routers.
    pub routers: Option<f64>,
    /// The control plane.
    pub control_plane: Option<f64>,
}

/// The idle cost row of the report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IdleCost {
    /// Length of the quiet window, seconds.
    pub secs: f64,
    /// Members alive in it.
    pub members: u64,
    /// Member side (workers): CPU-seconds per member per hour.
    pub member_cpu_secs_per_member_hour: Option<f64>,
    /// Router side (all routers together): CPU-seconds per member per hour.
    pub router_cpu_secs_per_member_hour: Option<f64>,
    /// Control plane: CPU-seconds per member per hour.
    pub control_plane_cpu_secs_per_member_hour: Option<f64>,
    /// CPU used over the window, seconds: workers, routers, control plane.
    pub member_cpu_secs: Option<f64>,
    pub router_cpu_secs: Option<f64>,
    pub control_plane_cpu_secs: Option<f64>,
}

impl IdleCost {
    /// The row for `members` between two samples; `None` when the window is
    /// empty or there are no members (nothing to divide by).
    pub fn between(before: &CpuSample, after: &CpuSample, members: u64) -> Option<Self> {
        let secs = after.at_secs - before.at_secs;
        if secs <= 0.0 || members == 0 {
            return None;
        }
        // A counter that went backwards (a process replaced) says nothing.
        let used = |b: Option<f64>, a: Option<f64>| match (b, a) {
            (Some(b), Some(a)) if a >= b => Some(a - b),
            _ => None,
        };
        let per_member_hour = |cpu: Option<f64>| cpu.map(|c| c / members as f64 * HOUR_SECS / secs);
        let member = used(before.workers, after.workers);
        let router = used(before.routers, after.routers);
        let control_plane = used(before.control_plane, after.control_plane);
        Some(Self {
            secs,
            members,
            member_cpu_secs_per_member_hour: per_member_hour(member),
            router_cpu_secs_per_member_hour: per_member_hour(router),
            control_plane_cpu_secs_per_member_hour: per_member_hour(control_plane),
            member_cpu_secs: member,
            router_cpu_secs: router,
            control_plane_cpu_secs: control_plane,
        })
    }

    /// The markdown table (header and one row).
    pub fn markdown(&self) -> String {
        let cell = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
        format!(
            "| idle (quiet hold) | secs | members | member side CPU-s/member/h | router side CPU-s/member/h | control plane CPU-s/member/h |\n\
             |---|---|---|---|---|---|\n\
             | | {:.0} | {} | {} | {} | {} |\n",
            self.secs,
            self.members,
            cell(self.member_cpu_secs_per_member_hour),
            cell(self.router_cpu_secs_per_member_hour),
            cell(self.control_plane_cpu_secs_per_member_hour),
        )
    }
}

/// Σ of `values`, or `None` if any is missing (a partial sum would
/// understate one side).
pub fn sum_all(values: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    values.into_iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: f64, w: f64, r: Option<f64>, cp: Option<f64>) -> CpuSample {
        CpuSample {
            at_secs: at,
            workers: Some(w),
            routers: r,
            control_plane: cp,
        }
    }

    #[test]
    fn cpu_seconds_per_member_per_hour_from_two_samples() {
        // 100 members, 10 s: the workers used 2 s, the routers 0.5 s.
        let c = IdleCost::between(
            &sample(5.0, 10.0, Some(3.0), Some(1.0)),
            &sample(15.0, 12.0, Some(3.5), Some(1.0)),
            100,
        )
        .expect("a row");
        assert_eq!(c.secs, 10.0);
        let close = |v: Option<f64>, want: f64| (v.expect("some") - want).abs() < 1e-9;
        // 2 s / 100 members / 10 s × 3,600 s = 7.2 s per member per hour.
        assert!(close(c.member_cpu_secs_per_member_hour, 7.2), "{c:?}");
        assert!(close(c.router_cpu_secs_per_member_hour, 1.8), "{c:?}");
        assert!(
            close(c.control_plane_cpu_secs_per_member_hour, 0.0),
            "{c:?}"
        );
        let table = c.markdown();
        assert!(
            table.contains("| | 10 | 100 | 7.20 | 1.80 | 0.00 |"),
            "{table}"
        );
    }

    #[test]
    fn missing_sides_backwards_counters_and_empty_windows_give_no_figure() {
        let c = IdleCost::between(
            &sample(0.0, 5.0, None, Some(9.0)),
            &sample(10.0, 6.0, Some(1.0), Some(2.0)),
            10,
        )
        .expect("a row");
        assert_eq!(c.router_cpu_secs_per_member_hour, None);
        assert_eq!(c.control_plane_cpu_secs_per_member_hour, None);
        assert!(c.member_cpu_secs_per_member_hour.is_some());
        assert!(c.markdown().contains("| - | - |"));
        let s = sample(3.0, 1.0, None, None);
        assert_eq!(IdleCost::between(&s, &s, 10), None, "no time passed");
        assert_eq!(
            IdleCost::between(&s, &sample(4.0, 2.0, None, None), 0),
            None,
            "no members"
        );
        assert_eq!(sum_all([Some(1.0), None]), None);
        assert_eq!(sum_all([Some(1.0), Some(2.5)]), Some(3.5));
    }
}
