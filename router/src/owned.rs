//! One writer per table: [`Owned`] is the only handle that can change a
//! table, [`View`] the read-only snapshot everyone else holds.
//!
//! The owner (the swarm loop, see `crate::tables`) keeps the `Owned` and
//! applies every change; other tasks send it commands. Readers on hot paths
//! (the relay ACL on every reservation, the resource manager on every
//! stream) read the live table through a `View` under a short read lock,
//! so a lookup never waits for a round trip to the owner. `Owned` is not
//! `Clone` and `View` has no way to write: two writers cannot exist.

use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The writing side of a table: exactly one exists per table.
#[derive(Debug, Default)]
pub(crate) struct Owned<T>(Arc<RwLock<T>>);

/// A read-only view of a table its owner keeps up to date.
#[derive(Debug)]
pub(crate) struct View<T>(Arc<RwLock<T>>);

impl<T> Clone for View<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

/// A view of an empty table nobody writes (tests of readers).
#[cfg(test)]
impl<T: Default> Default for View<T> {
    fn default() -> Self {
        Owned::default().view()
    }
}

impl<T> Owned<T> {
    /// Takes ownership of `table`.
    pub(crate) fn new(table: T) -> Self {
        Self(Arc::new(RwLock::new(table)))
    }

    /// A view for a reader.
    pub(crate) fn view(&self) -> View<T> {
        View(self.0.clone())
    }

    /// Changes the table. Takes `&mut self`: only the holder of the one
    /// `Owned` can, and it cannot hand out a second writer.
    pub(crate) fn write(&mut self) -> RwLockWriteGuard<'_, T> {
        self.0.write()
    }

    /// Reads the table.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read()
    }
}

impl<T> View<T> {
    /// Reads the table as its owner left it (hold the guard briefly: the
    /// owner waits for it to write).
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_see_what_the_owner_writes() {
        let mut owned = Owned::new(1u32);
        let view = owned.view();
        let other = view.clone();
        *owned.write() = 2;
        assert_eq!(*view.read(), 2);
        assert_eq!(*other.read(), 2);
        assert_eq!(*owned.read(), 2);
    }
}
