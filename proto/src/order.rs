//! What never goes backwards: the order of what the control plane serves
//! from its database, one rule in one place.
//!
//! The policy, the revocation list and the key set each carry
//! `(epoch, generation)`: the epoch is the database's policy epoch (made
//! anew when a database is created or restored), the generation follows
//! the commit order of the database's writes to what it orders (the policy
//! version; a counter row bumped by a trigger in the transaction of every
//! revocation or signing-key write). Within one epoch a higher generation
//! is newer; across epochs the generations say nothing, and each caller
//! decides by what else it carries ([`within_epoch`] answers `None`).
//!
//! A holder (a router, a member) never replaces what it holds with an
//! older copy, so failing over to a control-plane replica whose view has
//! not caught up yet (it reloads on a notification or its next check)
//! cannot roll it back.

use std::cmp::Ordering;

/// How `offered` stands to `held`, both `(epoch, generation)`: within one
/// epoch, their generations compared (`Greater`: `offered` is newer);
/// across epochs `None`, no order.
pub fn within_epoch(held: (u64, u64), offered: (u64, u64)) -> Option<Ordering> {
    (held.0 == offered.0).then(|| offered.1.cmp(&held.1))
}

/// Whether a holder that reports `theirs` (`(epoch, generation)`) lacks
/// what we hold, `ours`: `(0, 0)` (none, or a holder that predates these
/// fields) always does, another epoch does (let the holder judge), and
/// within one epoch a lower generation does.
pub fn holder_lacks(ours: (u64, u64), theirs: (u64, u64)) -> bool {
    theirs == (0, 0) || within_epoch(theirs, ours).is_none_or(Ordering::is_gt)
}

/// The order of a key set: `KeySet.epoch`, `.generation` and
/// `.epoch_created_at_unix_secs`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyOrder {
    /// The database's epoch.
    pub epoch: u64,
    /// The keys' generation within it.
    pub generation: u64,
    /// When the epoch began (0: unknown).
    pub epoch_created_at: i64,
}

impl KeyOrder {
    /// `(epoch, generation)`.
    pub fn pair(self) -> (u64, u64) {
        (self.epoch, self.generation)
    }
}

impl From<&crate::pb::credential::KeySet> for KeyOrder {
    fn from(k: &crate::pb::credential::KeySet) -> Self {
        Self {
            epoch: k.epoch,
            generation: k.generation,
            epoch_created_at: k.epoch_created_at_unix_secs,
        }
    }
}

/// Whether a key set ordered `offered` replaces the one held, ordered
/// `held`:
///
/// - within one epoch, a set of a generation at least the one held does
///   (the same generation is the same stored keys, read at another
///   instant); a lower one is stale (a replica that has not reloaded yet)
///   and is not taken;
/// - a set of another epoch does unless its epoch began before the held
///   one's (both beginnings known): right after `store new-policy-epoch`
///   or a restore, a replica that has not reloaded serves the old epoch,
///   which began earlier, and must not flip a holder back to it (a key set
///   is never forwarded by routers, so no holder is offered an old epoch
///   replayed otherwise); an epoch begun the same second does, and so
///   does one whose beginning is unknown (0: an older control plane);
/// - `(0, 0)` offered, from a control plane that predates these fields,
///   always does, as every set did before them: refusing it would freeze
///   the keys of every holder of a control plane rolled back to such a
///   binary. So a rollback is refused once every replica fills them;
/// - anything replaces `(0, 0)` held (nothing yet, or such a set).
pub fn key_set_replaces(held: KeyOrder, offered: KeyOrder) -> bool {
    if offered.pair() == (0, 0) {
        return true;
    }
    match within_epoch(held.pair(), offered.pair()) {
        Some(o) => o.is_ge(),
        None => {
            held.epoch_created_at == 0
                || offered.epoch_created_at == 0
                || offered.epoch_created_at >= held.epoch_created_at
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_compare_only_within_an_epoch() {
        assert_eq!(within_epoch((7, 3), (7, 4)), Some(Ordering::Greater));
        assert_eq!(within_epoch((7, 3), (7, 3)), Some(Ordering::Equal));
        assert_eq!(within_epoch((7, 3), (7, 2)), Some(Ordering::Less));
        assert_eq!(within_epoch((7, 3), (8, 1)), None);
    }

    /// An order with no epoch beginning (as before that field).
    fn o((epoch, generation): (u64, u64)) -> KeyOrder {
        KeyOrder {
            epoch,
            generation,
            epoch_created_at: 0,
        }
    }

    fn key_set_replaces(held: (u64, u64), offered: (u64, u64)) -> bool {
        super::key_set_replaces(o(held), o(offered))
    }

    #[test]
    fn an_epoch_begun_earlier_does_not_replace_a_later_one() {
        let new = KeyOrder {
            epoch: 9,
            generation: 1,
            epoch_created_at: 2_000,
        };
        let old = KeyOrder {
            epoch: 7,
            generation: 5,
            epoch_created_at: 1_000,
        };
        assert!(super::key_set_replaces(old, new), "the new epoch is taken");
        assert!(
            !super::key_set_replaces(new, old),
            "a lagging replica's old epoch is not"
        );
        let same_second = KeyOrder {
            epoch: 8,
            epoch_created_at: 2_000,
            ..new
        };
        assert!(super::key_set_replaces(new, same_second));
        let unknown = KeyOrder {
            epoch_created_at: 0,
            ..old
        };
        assert!(
            super::key_set_replaces(new, unknown),
            "an older control plane's"
        );
        assert!(super::key_set_replaces(unknown, new));
    }

    #[test]
    fn a_key_set_never_goes_back_within_an_epoch() {
        let held = (7, 5);
        assert!(key_set_replaces(held, (7, 6)), "newer");
        assert!(key_set_replaces(held, (7, 5)), "the same keys");
        assert!(!key_set_replaces(held, (7, 4)), "a lagging replica's");
        assert!(!key_set_replaces(held, (7, 0)));
    }

    #[test]
    fn another_epoch_and_the_unordered_sets_of_older_control_planes_replace() {
        assert!(key_set_replaces((7, 5), (8, 1)), "a restored database");
        assert!(key_set_replaces((7, 5), (6, 9)));
        assert!(key_set_replaces((7, 5), (0, 0)), "an older control plane");
        assert!(key_set_replaces((0, 0), (7, 1)), "nothing ordered held");
        assert!(key_set_replaces((0, 0), (0, 0)), "as before the fields");
    }

    #[test]
    fn a_holder_lacks_what_it_does_not_report() {
        let ours = (7, 3);
        assert!(holder_lacks(ours, (0, 0)), "none held");
        assert!(holder_lacks(ours, (7, 2)));
        assert!(!holder_lacks(ours, (7, 3)));
        assert!(!holder_lacks(ours, (7, 4)), "the holder is ahead");
        assert!(holder_lacks(ours, (6, 9)), "another epoch: let it judge");
    }
}
