//! Percentiles of latency samples.

use serde::{Deserialize, Serialize};

/// p50 and p95 of a set of millisecond samples.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct P50P95 {
    /// Median, ms.
    pub p50: Option<u64>,
    /// 95th percentile, ms.
    pub p95: Option<u64>,
}

/// p50, p95 and max of a set of millisecond samples.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Spread {
    /// Median, ms.
    pub p50: Option<u64>,
    /// 95th percentile, ms.
    pub p95: Option<u64>,
    /// Largest, ms.
    pub max: Option<u64>,
}

/// Count, p50, p95, p99 and max of millisecond samples.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Quantiles {
    /// Samples.
    pub count: u64,
    /// Median, ms.
    pub p50: Option<u64>,
    /// 95th percentile, ms.
    pub p95: Option<u64>,
    /// 99th percentile, ms.
    pub p99: Option<u64>,
    /// Largest, ms.
    pub max: Option<u64>,
}

impl Quantiles {
    /// Of `samples` (nearest rank).
    pub fn of(samples: &[u64]) -> Self {
        Self {
            count: samples.len() as u64,
            p50: percentile(samples, 0.5),
            p95: percentile(samples, 0.95),
            p99: percentile(samples, 0.99),
            max: samples.iter().copied().max(),
        }
    }

    /// `p50/p95/p99/max (n)`.
    pub fn cell(&self) -> String {
        let f = |x: Option<u64>| x.map_or_else(|| "-".to_string(), |x| x.to_string());
        format!(
            "{}/{}/{}/{} ({})",
            f(self.p50),
            f(self.p95),
            f(self.p99),
            f(self.max),
            self.count
        )
    }
}

/// A latency in ms for a table cell: `-` when unknown, one decimal below
/// 10 ms (histogram bounds there are 0.5, 1, 2, 4, 8 ms), whole ms above.
pub fn ms_cell(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v < 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.0}"),
    }
}

/// The `q` (0..=1) percentile of `samples` by nearest rank; `None` when empty.
pub fn percentile(samples: &[u64], q: f64) -> Option<u64> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_unstable();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

/// p50 and p95 of `samples`.
pub fn p50_p95(samples: &[u64]) -> P50P95 {
    P50P95 {
        p50: percentile(samples, 0.5),
        p95: percentile(samples, 0.95),
    }
}

/// p50, p95 and max of `samples`.
pub fn spread(samples: &[u64]) -> Spread {
    Spread {
        p50: percentile(samples, 0.5),
        p95: percentile(samples, 0.95),
        max: samples.iter().copied().max(),
    }
}

/// `a/b` rendered for the table, `-` for missing values.
pub fn pair(a: Option<u64>, b: Option<u64>) -> String {
    let f = |x: Option<u64>| x.map_or_else(|| "-".to_string(), |x| x.to_string());
    format!("{}/{}", f(a), f(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_cells_keep_sub_10_ms_bounds() {
        assert_eq!(ms_cell(None), "-");
        assert_eq!(ms_cell(Some(0.5)), "0.5");
        assert_eq!(ms_cell(Some(128.0)), "128");
    }

    #[test]
    fn nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), Some(50));
        assert_eq!(percentile(&v, 0.95), Some(95));
        assert_eq!(percentile(&[7], 0.95), Some(7));
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(spread(&[3, 1, 2]).max, Some(3));
        assert_eq!(pair(Some(1), None), "1/-");
    }
}
