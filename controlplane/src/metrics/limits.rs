//! The request limits' metrics: refusals per limiter, the `retry-after`
//! given, the per-source tables and the failure guard's token index.

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{
    HistogramFamily, LIMITERS, LimiterLabel, ResultLabel, SOURCE_TABLES, SPREADING_LIMITERS,
    TOKEN_INDEX_LOAD_RESULTS, TableLabel, retry_after_histogram,
};

#[derive(Clone)]
pub(super) struct LimitMetrics {
    pub(super) limiter_refusals: Family<LimiterLabel, Counter>,
    pub(super) retry_after: HistogramFamily<LimiterLabel>,
    pub(super) retry_after_capped: Family<LimiterLabel, Counter>,
    pub(super) source_table_sources: Family<TableLabel, Gauge>,
    pub(super) source_table_aggregated: Family<TableLabel, Gauge>,
    pub(super) source_table_overflowed: Family<TableLabel, Gauge>,
    pub(super) token_index_tokens: Gauge,
    pub(super) token_index_loads: Family<ResultLabel, Counter>,
}

impl LimitMetrics {
    /// Registers these metrics under `r` with every label value created.
    pub(super) fn register(r: &mut Registry) -> Self {
        let m = Self {
            limiter_refusals: Family::default(),
            retry_after: Family::new_with_constructor(retry_after_histogram),
            retry_after_capped: Family::default(),
            source_table_sources: Family::default(),
            source_table_aggregated: Family::default(),
            source_table_overflowed: Family::default(),
            token_index_tokens: Gauge::default(),
            token_index_loads: Family::default(),
        };
        r.register(
            "limiter_refusals",
            "Requests refused by a limit: a budget spent (unauth, enroll, refresh, lease), \
             a source over its share of a contended budget (*_source_share), the failure \
             guard, the database queue (db_busy), streams_per_connection, watch_streams \
             (--watch-max-streams watchers already open)",
            m.limiter_refusals.clone(),
        );
        r.register(
            "retry_after_seconds",
            "retry-after given to callers refused by the enroll and refresh limiters: \
             the wait until the slot the virtual queue assigned them",
            m.retry_after.clone(),
        );
        r.register(
            "retry_after_capped",
            "Refused callers told the cap (--enroll/--refresh-max-retry-after-secs) \
             because the virtual queue reached it",
            m.retry_after_capped.clone(),
        );
        r.register(
            "source_table_sources",
            "Sources in a per-source table (bounded by --source-table-max-sources, \
             --failure-guard-max-sources)",
            m.source_table_sources.clone(),
        );
        r.register(
            "source_table_aggregated",
            "Sources a per-source table keyed at a wider prefix than the finest because it \
             was filling, since start",
            m.source_table_aggregated.clone(),
        );
        r.register(
            "source_table_overflowed",
            "Times a full per-source table put new sources into its one shared overflow \
             source, since start",
            m.source_table_overflowed.clone(),
        );
        r.register(
            "token_index_tokens",
            "Live enrollment token digests the failure guard's token index holds (loaded \
             only while a source over its failures enrolls)",
            m.token_index_tokens.clone(),
        );
        r.register(
            "token_index_loads",
            "Token index loads from the database: complete, or truncated at \
             --token-index-max-tokens (the index then cannot refuse a token)",
            m.token_index_loads.clone(),
        );
        for l in LIMITERS {
            let _ = m.limiter_refusals.get_or_create(&LimiterLabel {
                limiter: (*l).into(),
            });
        }
        for t in SOURCE_TABLES {
            let label = TableLabel { table: (*t).into() };
            let _ = m.source_table_sources.get_or_create(&label);
            let _ = m.source_table_aggregated.get_or_create(&label);
            let _ = m.source_table_overflowed.get_or_create(&label);
        }
        for l in SPREADING_LIMITERS {
            let label = LimiterLabel {
                limiter: (*l).into(),
            };
            let _ = m.retry_after.get_or_create(&label);
            let _ = m.retry_after_capped.get_or_create(&label);
        }
        for r in TOKEN_INDEX_LOAD_RESULTS {
            let _ = m.token_index_loads.get_or_create(&ResultLabel {
                result: (*r).into(),
            });
        }
        m
    }
}
