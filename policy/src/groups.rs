//! The groups an identity is in: a fixed-size bit set, computed once when
//! a credential is admitted (and again when a policy is applied), so the
//! checks on every publish, circuit and call are a few word operations.

/// Group membership, indexed by the policy that computed it; meaningless
/// against another policy (recompute when one is applied).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Groups(Box<[u64]>);

impl Groups {
    pub(crate) fn empty(len: usize) -> Self {
        Groups(vec![0; len.div_ceil(64)].into_boxed_slice())
    }

    pub(crate) fn insert(&mut self, index: usize) {
        if let Some(word) = self.0.get_mut(index / 64) {
            *word |= 1 << (index % 64);
        }
    }

    /// Whether the two sets share a group.
    pub(crate) fn intersects(&self, other: &Groups) -> bool {
        self.0.iter().zip(other.0.iter()).any(|(a, b)| a & b != 0)
    }

    pub(crate) fn indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(w, bits)| {
            (0..64)
                .filter(move |b| bits & (1 << b) != 0)
                .map(move |b| w * 64 + b)
        })
    }

    /// Whether the identity is in no group at all (then it may do nothing).
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }
}
