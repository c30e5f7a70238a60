//! Which replica an event hits: the kills' seeded draws and the replica
//! the routers do not watch. Pure functions, so a recorded run's choices
//! can be replayed from its seed and checked in tests.

use std::collections::BTreeMap;

use serde::Serialize;

/// The kill times of `--kill-control-plane-every-secs every` in a hold of
/// `hold_secs`: `every`, `2 × every`, … while inside the hold, seconds.
pub fn kill_times(every: u64, hold_secs: u64) -> Vec<u64> {
    if every == 0 {
        return Vec::new();
    }
    (1..)
        .map(|k| k * every)
        .take_while(|t| *t < hold_secs)
        .collect()
}

/// The kills' random source: SplitMix64, written out rather than taken
/// from `rand` so that a seed recorded in a report picks the same
/// replicas under any later version of the crate.
#[derive(Debug, Clone)]
pub struct KillPicker {
    seed: u64,
    state: u64,
}

impl KillPicker {
    /// A picker drawing from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { seed, state: seed }
    }

    /// The seed it was made with.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// One of `live` (replica indexes), or None when none is live. Every
    /// call draws once, so the sequence depends only on the seed and the
    /// live sets it was given.
    pub fn pick(&mut self, live: &[usize]) -> Option<usize> {
        let draw = self.next();
        if live.is_empty() {
            return None;
        }
        Some(live[(draw % live.len() as u64) as usize])
    }
}

/// The replica an admin call was sent through, and the Watch streams
/// every replica held when it was chosen.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ReplicaChoice {
    /// The replica (`cp0`, `cp1`…).
    pub replica: String,
    /// Its Watch streams when chosen (`agentmesh_control_plane_watchers`).
    pub watchers: Option<u64>,
    /// Whether it held none: the change reached the routers only through
    /// the database's notifications and another replica's streams.
    pub unwatched: bool,
    /// Every replica's Watch streams at the choice (null: its `/metrics`
    /// did not answer, or it was stopped).
    pub watchers_by_replica: BTreeMap<String, Option<u64>>,
}

/// The replica of `watchers` (name and Watch streams, null where unknown
/// or not to be used) with the fewest streams, the first on a tie; None
/// when no replica's count is known.
pub fn least_watched(watchers: &[(String, Option<u64>)]) -> Option<ReplicaChoice> {
    let (name, n) = watchers
        .iter()
        .filter_map(|(name, n)| n.map(|n| (name, n)))
        .min_by_key(|(_, n)| *n)?;
    Some(ReplicaChoice {
        replica: name.clone(),
        watchers: Some(n),
        unwatched: n == 0,
        watchers_by_replica: watchers.iter().cloned().collect(),
    })
}

/// The replica with the most Watch streams (the first on a tie; None when
/// none is known): stopping it makes the routers find another.
pub fn most_watched(watchers: &[(String, Option<u64>)]) -> Option<usize> {
    watchers
        .iter()
        .enumerate()
        .filter_map(|(i, (_, n))| n.map(|n| (i, n)))
        .max_by_key(|(i, n)| (*n, std::cmp::Reverse(*i)))
        .map(|(i, _)| i)
}

/// Signing-key rotations due between `start` and `end` (Unix seconds):
/// one per admin rotation (`admin`, Unix seconds) and one per scheduled
/// deadline passed, where the first deadline is `next_at_start` and each
/// rotation, scheduled or admin, sets the next to its time plus
/// `interval_secs` (as the control plane does). The target is one new key
/// per rotation however many replicas race for it.
pub fn rotations_due(
    next_at_start: Option<i64>,
    interval_secs: i64,
    admin: &[i64],
    end: i64,
) -> u64 {
    let interval = interval_secs.max(1);
    let mut admin: Vec<i64> = admin.iter().copied().filter(|a| *a <= end).collect();
    admin.sort_unstable();
    let mut due = 0u64;
    let mut deadline = next_at_start;
    let scheduled_until = |deadline: &mut Option<i64>, until: i64, due: &mut u64| {
        while let Some(d) = *deadline
            && d <= until
        {
            *due += 1;
            *deadline = Some(d + interval);
        }
    };
    for a in admin {
        scheduled_until(&mut deadline, a, &mut due);
        due += 1;
        deadline = Some(a + interval);
    }
    scheduled_until(&mut deadline, end, &mut due);
    due
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kills_fall_every_period_inside_the_hold() {
        assert_eq!(kill_times(10, 40), vec![10, 20, 30]);
        assert_eq!(kill_times(10, 41), vec![10, 20, 30, 40]);
        assert_eq!(kill_times(120, 1800).len(), 14);
        assert!(kill_times(60, 60).is_empty());
        assert!(kill_times(0, 60).is_empty());
    }

    #[test]
    fn the_same_seed_and_live_sets_pick_the_same_replicas() {
        let live = [0, 1, 2];
        let draws = |seed| {
            let mut p = KillPicker::new(seed);
            (0..32).map(|_| p.pick(&live)).collect::<Vec<_>>()
        };
        assert_eq!(draws(42), draws(42));
        assert_ne!(draws(42), draws(43));
        // SplitMix64 from 42, as an independent implementation computes it:
        // fixed forever, whatever `rand` does.
        let mut p = KillPicker::new(42);
        let first: Vec<u64> = (0..3).map(|_| p.next()).collect();
        assert_eq!(
            first,
            [
                0xBDD7_3226_2FEB_6E95,
                0x28EF_E333_B266_F103,
                0x4752_6757_130F_9F52
            ]
        );
        // Every replica is hit over a long schedule, only live ones ever.
        let all = draws(7);
        for r in live {
            assert!(all.contains(&Some(r)), "{all:?}");
        }
        let mut p = KillPicker::new(7);
        for _ in 0..100 {
            assert!(matches!(p.pick(&[0, 2]), Some(0 | 2)));
        }
        assert_eq!(p.pick(&[]), None);
        assert_eq!(p.seed(), 7);
    }

    #[test]
    fn a_dead_replica_does_not_change_the_later_draws() {
        let mut a = KillPicker::new(9);
        let mut b = KillPicker::new(9);
        assert_eq!(a.pick(&[]), None);
        let _ = b.pick(&[0, 1, 2]);
        assert_eq!(a.pick(&[0, 1, 2]), b.pick(&[0, 1, 2]));
    }

    #[test]
    fn the_unwatched_replica_is_chosen_and_unknown_ones_skipped() {
        let w = |v: &[Option<u64>]| -> Vec<(String, Option<u64>)> {
            v.iter()
                .enumerate()
                .map(|(i, n)| (format!("cp{i}"), *n))
                .collect()
        };
        let c = least_watched(&w(&[Some(4), Some(0), Some(0)])).expect("choice");
        assert_eq!(
            (c.replica.as_str(), c.watchers, c.unwatched),
            ("cp1", Some(0), true)
        );
        assert_eq!(c.watchers_by_replica["cp0"], Some(4));
        let c = least_watched(&w(&[Some(2), None, Some(1)])).expect("choice");
        assert_eq!((c.replica.as_str(), c.unwatched), ("cp2", false));
        assert_eq!(c.watchers_by_replica["cp1"], None);
        assert_eq!(least_watched(&w(&[None, None])), None);
        assert_eq!(most_watched(&w(&[Some(1), Some(3), Some(3)])), Some(1));
        assert_eq!(most_watched(&w(&[Some(0), None])), Some(0));
        assert_eq!(most_watched(&w(&[None])), None);
    }

    #[test]
    fn rotations_due_count_admin_calls_and_deadlines_passed() {
        // A day's interval, a short run: only the admin rotation.
        assert_eq!(rotations_due(Some(1_000_000), 86_400, &[500], 2_000), 1);
        // A deadline inside the run, and the next one a period later.
        assert_eq!(rotations_due(Some(100), 50, &[], 249), 3);
        // An admin rotation moves the next deadline to its time + interval.
        assert_eq!(rotations_due(Some(100), 50, &[120], 200), 3);
        assert_eq!(rotations_due(Some(100), 50, &[120], 169), 2);
        // No stored deadline yet, admin calls after the end not counted.
        assert_eq!(rotations_due(None, 50, &[300], 200), 0);
    }
}
