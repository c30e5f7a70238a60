//! The watermarks and relay reservation cap the router runs with, sized once
//! at start from the memory budget unless flags set them: everything else
//! that defaults from the watermarks (stream budgets, the reservation cap)
//! derives from this, so it sits below the budgets.

use super::budget::{IDLE_MEMBER_PING_STREAMS, PING_STREAM_CHARGE_BYTES};
use super::config::ResourceConfig;

/// Memory charged for one idle attached member: its connection and its
/// ping streams (what the default high watermark is sized with).
pub(crate) fn idle_member_charge_bytes(r: &ResourceConfig) -> u64 {
    r.connection_charge_bytes
        .saturating_add(IDLE_MEMBER_PING_STREAMS * PING_STREAM_CHARGE_BYTES)
}

/// The watermarks and relay reservation cap in effect: explicit flags win,
/// else they are sized from the memory budget. Computed once at start,
/// after the memory limit is known, before any budget derives from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// Admitted members before go-away and trimming.
    pub high_watermark: u32,
    /// Trimming sheds down to this many members.
    pub low_watermark: u32,
    /// Relay reservations at most.
    pub relay_max_reservations: usize,
    /// Memory charged for one idle attached member, bytes (its connection
    /// and its two ping streams).
    pub idle_member_charge_bytes: u64,
    /// Idle members the whole memory budget holds (no headroom).
    pub members_that_fit: u64,
    /// Whether the high watermark was sized from the memory budget (no flag).
    pub sized_from_memory: bool,
}

/// Default high watermark for `memory_budget_bytes`: `percent` of the budget
/// divided by the charge of one idle member, at least 1.
pub fn high_watermark_for_budget(
    memory_budget_bytes: u64,
    percent: u8,
    idle_member_charge_bytes: u64,
) -> u32 {
    let share = u128::from(memory_budget_bytes) * u128::from(percent.min(100)) / 100;
    let n = share / u128::from(idle_member_charge_bytes.max(1));
    u32::try_from(n).unwrap_or(u32::MAX).max(1)
}

/// The flags sizing reads (each `None` when not given).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SizingFlags {
    /// `--high-watermark`.
    pub(crate) high_watermark: Option<u32>,
    /// `--low-watermark`.
    pub(crate) low_watermark: Option<u32>,
    /// `--relay-max-reservations`.
    pub(crate) relay_max_reservations: Option<usize>,
    /// `--high-watermark-memory-percent`.
    pub(crate) high_watermark_memory_percent: u8,
}

impl Sizing {
    /// The sizing for `flags` with a memory budget of `memory_budget_bytes`:
    /// the high watermark flag if set, else `high_watermark_memory_percent`
    /// of the budget ÷ the idle member charge; low = the low flag (capped at
    /// high) else 15% below high; reservations = the flag else the high
    /// watermark.
    pub(crate) fn new(flags: SizingFlags, r: &ResourceConfig, memory_budget_bytes: u64) -> Self {
        let idle = idle_member_charge_bytes(r);
        let high = flags.high_watermark.unwrap_or_else(|| {
            high_watermark_for_budget(
                memory_budget_bytes,
                flags.high_watermark_memory_percent,
                idle,
            )
        });
        let low = flags
            .low_watermark
            .unwrap_or_else(|| u32::try_from(u64::from(high) * 85 / 100).unwrap_or(u32::MAX))
            .min(high);
        Sizing {
            high_watermark: high,
            low_watermark: low,
            relay_max_reservations: flags.relay_max_reservations.unwrap_or(high as usize),
            idle_member_charge_bytes: idle,
            members_that_fit: memory_budget_bytes / idle.max(1),
            sized_from_memory: flags.high_watermark.is_none(),
        }
    }
}
