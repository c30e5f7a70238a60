//! A small reader of Prometheus text exposition, enough to pick counters,
//! gauges and histograms out of the programs' `/metrics`.

use std::collections::BTreeMap;

/// One sample: metric name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Full sample name (with `_total`, `_bucket`… suffixes).
    pub name: String,
    /// Labels, sorted by name.
    pub labels: BTreeMap<String, String>,
    /// The value.
    pub value: f64,
}

/// A parsed `/metrics` page.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// Every sample, in page order.
    pub samples: Vec<Sample>,
}

impl Metrics {
    /// Parses exposition text; lines that do not parse are skipped.
    pub fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(parse_line)
            .collect();
        Self { samples }
    }

    /// Samples named `name` whose labels include every `(k, v)` of `filter`.
    pub fn select<'a>(
        &'a self,
        name: &'a str,
        filter: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && filter
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// Sum of the samples named `name` matching `filter` (0 when absent).
    pub fn sum(&self, name: &str, filter: &[(&str, &str)]) -> f64 {
        self.select(name, filter).map(|s| s.value).sum()
    }

    /// Whether any sample is named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }

    /// Sums of the samples named `name`, grouped by the value of label `by`.
    pub fn group_by(&self, name: &str, by: &str) -> BTreeMap<String, f64> {
        self.group_by_where(name, by, &[])
    }

    /// [`Metrics::group_by`] over the samples matching `filter` only.
    pub fn group_by_where(
        &self,
        name: &str,
        by: &str,
        filter: &[(&str, &str)],
    ) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for s in self.select(name, filter) {
            let key = s.labels.get(by).cloned().unwrap_or_default();
            *out.entry(key).or_insert(0.0) += s.value;
        }
        out
    }

    /// Sums of the samples named `name`, grouped by the values of the
    /// labels `by` joined with `/` (`GetDirectory/Ok`; a missing label is
    /// empty).
    pub fn group_by_labels(&self, name: &str, by: &[&str]) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for s in self.select(name, &[]) {
            let key = by
                .iter()
                .map(|l| s.labels.get(*l).map(String::as_str).unwrap_or(""))
                .collect::<Vec<_>>()
                .join("/");
            *out.entry(key).or_insert(0.0) += s.value;
        }
        out
    }

    /// Cumulative bucket counts of histogram `base` (summed over all other labels), by upper bound.
    pub fn buckets(&self, base: &str) -> Vec<(f64, f64)> {
        self.buckets_where(base, &[])
    }

    /// [`Metrics::buckets`] over the series matching `filter` only.
    pub fn buckets_where(&self, base: &str, filter: &[(&str, &str)]) -> Vec<(f64, f64)> {
        let name = format!("{base}_bucket");
        let mut by_le: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        for s in self.select(&name, filter) {
            let le = match s.labels.get("le").map(String::as_str) {
                Some("+Inf") => f64::INFINITY,
                Some(v) => match v.parse::<f64>() {
                    Ok(v) => v,
                    Err(_) => continue,
                },
                None => continue,
            };
            let e = by_le.entry(le.to_bits()).or_insert((le, 0.0));
            e.1 += s.value;
        }
        let mut v: Vec<(f64, f64)> = by_le.into_values().collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    }
}

/// The `q` quantile (0..1) of the observations between two bucket snapshots
/// (`before` may be empty), as the upper bound of the bucket that holds it.
/// `None` when nothing was observed in between.
pub fn quantile_between(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, c)| {
            let b = before
                .iter()
                .find(|(ble, _)| ble.to_bits() == le.to_bits())
                .map(|(_, c)| *c)
                .unwrap_or(0.0);
            (*le, (c - b).max(0.0))
        })
        .collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    delta.iter().find(|(_, c)| *c >= rank).map(|(le, _)| *le)
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    let (name, rest) = match line.find('{') {
        Some(i) => (&line[..i], &line[i..]),
        None => {
            let mut it = line.split_whitespace();
            let name = it.next()?;
            let value = parse_value(it.next()?)?;
            return Some(Sample {
                name: name.to_string(),
                labels: BTreeMap::new(),
                value,
            });
        }
    };
    let close = find_label_end(rest)?;
    let labels = parse_labels(&rest[1..close])?;
    let value = parse_value(rest[close + 1..].split_whitespace().next()?)?;
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

fn find_label_end(s: &str) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_quotes => escaped = true,
            '"' => in_quotes = !in_quotes,
            '}' if !in_quotes => return Some(i),
            _ => {}
        }
    }
    None
}

fn parse_labels(s: &str) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let eq = rest.find('=')?;
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_string();
        let after = rest[eq + 1..].trim_start();
        let after = after.strip_prefix('"')?;
        let mut value = String::new();
        let mut escaped = false;
        let mut end = None;
        for (i, c) in after.char_indices() {
            if escaped {
                value.push(match c {
                    'n' => '\n',
                    other => other,
                });
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                end = Some(i);
                break;
            } else {
                value.push(c);
            }
        }
        let end = end?;
        out.insert(key, value);
        rest = after[end + 1..]
            .trim_start()
            .trim_start_matches(',')
            .trim_start();
    }
    Some(out)
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        other => other.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"# HELP agentmesh_x_total things
# TYPE agentmesh_x_total counter
agentmesh_x_total{reason="a",scope="peer"} 3
agentmesh_x_total{reason="b",scope="peer"} 4
agentmesh_up 1
agentmesh_rpc_seconds_bucket{method="Enroll",le="0.1"} 5
agentmesh_rpc_seconds_bucket{method="Enroll",le="1.0"} 9
agentmesh_rpc_seconds_bucket{method="Enroll",le="+Inf"} 10
agentmesh_rpc_seconds_bucket{method="Refresh",le="0.1"} 10
agentmesh_rpc_seconds_bucket{method="Refresh",le="1.0"} 10
agentmesh_rpc_seconds_bucket{method="Refresh",le="+Inf"} 10
weird{a="x,}\"y"} 2
"#;

    #[test]
    fn sums_groups_and_quantiles() {
        let m = Metrics::parse(PAGE);
        assert_eq!(m.sum("agentmesh_x_total", &[]), 7.0);
        assert_eq!(m.sum("agentmesh_x_total", &[("reason", "b")]), 4.0);
        assert_eq!(m.sum("agentmesh_up", &[]), 1.0);
        assert_eq!(
            m.group_by("agentmesh_x_total", "reason").get("a"),
            Some(&3.0)
        );
        assert_eq!(m.sum("weird", &[("a", "x,}\"y")]), 2.0);
        let b = m.buckets("agentmesh_rpc_seconds");
        assert_eq!(b.len(), 3);
        assert_eq!(quantile_between(&[], &b, 0.5), Some(0.1));
        assert_eq!(quantile_between(&[], &b, 0.99), Some(f64::INFINITY));
        assert_eq!(quantile_between(&b, &b, 0.99), None);
    }
}
