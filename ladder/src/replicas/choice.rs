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

/// Scheduled signing-key rotations seen in `readings` of the stored
/// rotation deadline (`(unix_secs, deadline)`, oldest first, the start's
/// and the end's included): each time the deadline changed, the old one
/// counts when it had come by the change, unless one of the ladder's admin
/// rotations (`admin`, Unix seconds) fell between the two readings before
/// it (an admin rotation moves the deadline too). Every rotation stores a
/// new deadline, so one that had come and was replaced is one rotation
/// due; a deadline that has come but is still stored at the end has not
/// been taken yet (the replicas check it every `--key-check-interval-secs`)
/// and is not counted. Two rotations between readings count as one: the
/// readings come far more often than any rotation interval a run uses.
pub fn scheduled_rotations(readings: &[(i64, Option<i64>)], admin: &[i64]) -> u64 {
    let mut passed = 0;
    for pair in readings.windows(2) {
        let ((t0, before), (t1, after)) = (pair[0], pair[1]);
        let (Some(d), Some(new)) = (before, after) else {
            continue;
        };
        if new == d {
            continue;
        }
        let admin_first = admin.iter().any(|a| *a > t0 && *a <= t1 && *a < d);
        if d <= t1 && !admin_first {
            passed += 1;
        }
    }
    passed
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
    fn scheduled_rotations_count_deadlines_replaced_after_they_came() {
        // A deadline at 100 taken at 101 (the next at 116), then at 116
        // taken at 118; the next, 133, has not come by the end.
        let r = [
            (90, Some(100)),
            (95, Some(100)),
            (105, Some(116)),
            (120, Some(133)),
            (125, Some(133)),
        ];
        assert_eq!(scheduled_rotations(&r, &[]), 2);
        // An admin rotation at 99 moved the deadline (to 111) just before
        // it came; the reading after it is at 105.
        let r = [(95, Some(100)), (105, Some(111)), (110, Some(111))];
        assert_eq!(scheduled_rotations(&r, &[99]), 0);
        // The same readings without the admin call: the deadline was taken.
        assert_eq!(scheduled_rotations(&r, &[]), 1);
        // An admin call before the deadline but after the change's reading
        // does not excuse it.
        assert_eq!(scheduled_rotations(&r, &[106]), 1);
        // A deadline that came and is still stored at the end.
        assert_eq!(
            scheduled_rotations(&[(90, Some(100)), (130, Some(100))], &[]),
            0
        );
        // Unknown readings count nothing; a day's interval in a short run.
        assert_eq!(scheduled_rotations(&[(1, None), (2, Some(5))], &[]), 0);
        assert_eq!(
            scheduled_rotations(&[(0, Some(86_400)), (1_800, Some(87_000))], &[600]),
            0
        );
    }
}
