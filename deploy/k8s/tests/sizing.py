"""The router's sizing rule and the measured memory model, for the offline checks.

The manifests pass the router its container's memory limit and, by choice,
no watermarks: the router derives its high and low watermarks, its relay
reservation cap and its stream budgets from that limit (docs/scalability.md,
"What a member costs a router"). This module mirrors that derivation so a
check knows, without running anything, the watermarks a rendered manifest
gets; test_smoke.py compares the mirror with what the real binary logs at
start, so the two cannot drift apart unnoticed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

MIB = 2**20

# The router's rule (router/src/config/mod.rs `Config::sizing`,
# router/src/resources/budget.rs, router/src/resources/memory.rs): memory
# budget = limit x --memory-budget-percent; default high watermark = budget x
# --high-watermark-memory-percent / idle member charge (at least 1); low = 85%
# of high; relay reservation cap = high. Integer arithmetic, as the router's.
MEMORY_BUDGET_PERCENT = 75
HIGH_WATERMARK_MEMORY_PERCENT = 50
CONNECTION_CHARGE_BYTES = 64 * 1024
PING_STREAM_CHARGE_BYTES = 4 * 1024
PING_STREAMS_PER_MEMBER = 2
IDLE_MEMBER_CHARGE_BYTES = CONNECTION_CHARGE_BYTES + PING_STREAMS_PER_MEMBER * PING_STREAM_CHARGE_BYTES
LOW_WATERMARK_PERCENT = 85

# Measured, release build (ladder/RESULTS.md, run
# results/20261129T1151Z-release-10000: 10,003 members, K=2, 4 routers):
# router RSS 17.7-18.0 MiB before members, then 52.3-60.5 KiB per attached
# member (transit connections included), ~300 MiB at ~5,000 members.
MEASURED_RUN = "results/20261129T1151Z-release-10000"
RSS_BASE_BYTES = 18 * MIB
RSS_PER_MEMBER_BYTES = 61 * 1024
# A container limit must hold the RSS expected at the high watermark times
# this: calls in flight, transit connections, allocator slack, memory the
# router has not returned yet (RESULTS.md: 3.8x its start RSS after a fleet
# left).
RSS_HEADROOM = 1.5


@dataclass(frozen=True)
class RouterSizing:
    """What a router makes of its flags and memory limit."""

    limit_bytes: int
    budget_bytes: int
    idle_member_charge_bytes: int
    high: int
    low: int
    reservations: int
    # The high watermark the budget supports: what the router picks itself.
    sized_high: int
    explicit_high: bool

    @property
    def rss_at_high_bytes(self) -> int:
        """Measured model: the RSS to expect with `high` members attached."""
        return RSS_BASE_BYTES + self.high * RSS_PER_MEMBER_BYTES

    @property
    def limit_needed_bytes(self) -> float:
        """The smallest limit that holds the RSS at the high watermark with headroom."""
        return self.rss_at_high_bytes * RSS_HEADROOM


def high_watermark_for_budget(budget_bytes: int, percent: int, idle_member_charge_bytes: int) -> int:
    """router/src/resources/sizing.rs `high_watermark_for_budget`."""
    return max(1, budget_bytes * min(percent, 100) // 100 // max(idle_member_charge_bytes, 1))


def router_sizing(
    limit_bytes: int,
    flag: Callable[[str], str | None],
) -> RouterSizing:
    """The router's sizing for a memory limit and its expanded flags
    (`flag` is a Container.flag). Raises ValueError on a non-integer flag."""

    def num(name: str, default: int | None) -> int | None:
        v = flag(name)
        return default if v is None else int(v)

    budget = limit_bytes * int(num("--memory-budget-percent", MEMORY_BUDGET_PERCENT) or 0) // 100
    idle = int(num("--connection-charge-bytes", CONNECTION_CHARGE_BYTES) or 0) + (
        PING_STREAMS_PER_MEMBER * PING_STREAM_CHARGE_BYTES
    )
    sized = high_watermark_for_budget(
        budget, int(num("--high-watermark-memory-percent", HIGH_WATERMARK_MEMORY_PERCENT) or 0), idle
    )
    explicit = num("--high-watermark", None)
    high = sized if explicit is None else explicit
    low = num("--low-watermark", None)
    low = high * LOW_WATERMARK_PERCENT // 100 if low is None else min(low, high)
    reservations = num("--relay-max-reservations", None)
    return RouterSizing(
        limit_bytes=limit_bytes,
        budget_bytes=budget,
        idle_member_charge_bytes=idle,
        high=high,
        low=low,
        reservations=high if reservations is None else reservations,
        sized_high=sized,
        explicit_high=explicit is not None,
    )
