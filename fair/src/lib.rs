//! Fair shares of global budgets among the sources that use them.
//!
//! Every program bounds what strangers can take globally (auth slots,
//! handshakes, unauthenticated RPCs per second). A global bound alone lets
//! one host take all of it: the members that arrive next find it full. This
//! crate adds the per-source half, with one rule everywhere: **a share binds
//! only under contention**. While a budget has room, one source may use all
//! of it (a ladder joining 1,500 members from four loopback addresses gets
//! in as fast as without shares); once it is contended, each source gets at
//! most its max-min fair share.
//!
//! - [`SourceKey`]: what "a source" is: an IPv4 address or an IPv6 prefix
//!   (/64 by default), the only way to key per-source state.
//! - [`SourceMap`]: a bounded table of per-source state that aggregates new
//!   sources to wider prefixes as it fills (IPv6 /64 → /56 → /48, IPv4
//!   /32 → /24) and, when full, puts them into one shared overflow source:
//!   a flood of addresses can neither grow it without bound nor evict the
//!   sources already in it.
//! - [`FairSlots`]: slots held for a while (streams in their handshake,
//!   requests in flight). When all are taken, a source holding fewer than
//!   the heaviest source takes one of the heaviest source's slots (its
//!   least recently active: the oldest, unless holders report activity
//!   with [`Slot::touch`]; the idlest is the most likely stalled); the holder sees
//!   [`Slot::revoked`] and stops. Sources are addresses, or any key the
//!   program already trusts to name one party ([`FairSlots::keyed`], e.g.
//!   the PeerId a connection proved).
//! - [`FairRate`]: a rate (token bucket) shared by sources; while more than
//!   half its burst is spent, each active source may take at most `rate / n`
//!   per second.
//!
//! - [`handshakes`]: inbound connections in their handshake, shared by
//!   source the same way, where a newcomer at its source's share takes the
//!   place of the handshake that progressed least (and that one is closed);
//!   with the libp2p transport wrappers that do it for a listener (feature
//!   `transport`).
//!
//! The programs own their metrics and flags; this crate reports what it did
//! ([`Acquired::preempted`], [`RateRefusal::reason`]) so they can count it.

pub mod handshakes;
mod map;
mod rate;
mod slots;
mod source;

pub use map::{MapStats, SourceMap};
pub use rate::{FairRate, RateReason, RateRefusal};
pub use slots::{Acquired, FairSlots, Slot, SlotKey, SlotRefusal};
pub use source::{IPV4_MAX_PREFIX_LEN, IPV6_MAX_PREFIX_LEN, SourceKey};
