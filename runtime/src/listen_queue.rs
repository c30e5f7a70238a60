//! Whether a listen backlog overflowed: the kernel's count of connections
//! it turned away because a listener's accept queue was full
//! (`TcpExt: ListenOverflows` and `ListenDrops` in `/proc/net/netstat`),
//! read at every scrape.
//!
//! Why the kernel's counters and not our own: a connection the accept queue
//! has no room for never reaches `accept()`, so no program can count it
//! itself. The counters belong to the network namespace, so they cover
//! every listener in it; in a Kubernetes pod (a namespace of its own) that
//! is the program's own listeners.
//!
//! `agentmesh_runtime_tcp_listen_overflows_total` and
//! `agentmesh_runtime_tcp_listen_drops_total`; absent where the file
//! cannot be read (not Linux).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::registry::Registry;

const NETSTAT: &str = "/proc/net/netstat";

/// The two listen counters of one `/proc/net/netstat` reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ListenCounters {
    /// Connections refused because a listener's accept queue was full.
    pub overflows: u64,
    /// Connections dropped at a listener for any reason, overflows included.
    pub drops: u64,
}

/// The `TcpExt` listen counters in the text of `/proc/net/netstat`: a
/// line of names followed by a line of values, both prefixed `TcpExt:`.
/// `None` when the lines are missing or malformed.
pub fn parse(netstat: &str) -> Option<ListenCounters> {
    let mut lines = netstat.lines().filter(|l| l.starts_with("TcpExt:"));
    let names = lines.next()?.split_whitespace().skip(1);
    let values = lines.next()?.split_whitespace().skip(1);
    let mut c = ListenCounters::default();
    let (mut overflows, mut drops) = (false, false);
    for (name, value) in names.zip(values) {
        match name {
            "ListenOverflows" => {
                c.overflows = value.parse().ok()?;
                overflows = true;
            }
            "ListenDrops" => {
                c.drops = value.parse().ok()?;
                drops = true;
            }
            _ => {}
        }
    }
    (overflows && drops).then_some(c)
}

/// The counters now, from this process's network namespace.
pub fn read() -> Option<ListenCounters> {
    parse(&std::fs::read_to_string(NETSTAT).ok()?)
}

/// Reads [`read`] at each scrape.
#[derive(Debug, Default)]
struct ListenQueueCollector;

impl Collector for ListenQueueCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(c) = read() else {
            return Ok(());
        };
        let counters = [
            (
                "agentmesh_runtime_tcp_listen_overflows",
                "Connections the kernel refused because a listener's accept queue (the listen backlog) was full, in this network namespace (TcpExt ListenOverflows)",
                c.overflows,
            ),
            (
                "agentmesh_runtime_tcp_listen_drops",
                "Connections the kernel dropped at a listener for any reason, overflows included, in this network namespace (TcpExt ListenDrops)",
                c.drops,
            ),
        ];
        for (name, help, v) in counters {
            let m = ConstCounter::new(v);
            m.encode(encoder.encode_descriptor(name, help, None, m.metric_type())?)?;
        }
        Ok(())
    }
}

/// Registers the listen-queue counters in `registry` (once per process,
/// by the programs whose listen backlog is a flag).
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(ListenQueueCollector));
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    const SAMPLE: &str = "TcpExt: SyncookiesSent ListenOverflows ListenDrops TCPLostRetransmit\n\
                          TcpExt: 0 17 19 3\n\
                          IpExt: InNoRoutes InTruncatedPkts\n\
                          IpExt: 0 0\n";

    #[test]
    fn the_listen_counters_are_read_by_name() {
        assert_eq!(
            parse(SAMPLE),
            Some(ListenCounters {
                overflows: 17,
                drops: 19
            })
        );
    }

    #[test]
    fn missing_or_malformed_counters_read_as_none() {
        assert_eq!(parse(""), None);
        assert_eq!(parse("TcpExt: ListenOverflows ListenDrops\n"), None);
        assert_eq!(parse("TcpExt: ListenOverflows\nTcpExt: 4\n"), None);
        assert_eq!(
            parse("TcpExt: ListenOverflows ListenDrops\nTcpExt: x 1\n"),
            None
        );
    }

    #[test]
    fn this_machine_serves_both_counters_at_a_scrape() {
        // Linux is where the programs run and the tests too.
        assert!(read().is_some(), "{NETSTAT} has no TcpExt listen counters");
        let mut r = Registry::default();
        register(&mut r);
        let mut text = String::new();
        encode(&mut text, &r).expect("encode");
        assert!(
            text.contains("agentmesh_runtime_tcp_listen_overflows_total "),
            "{text}"
        );
        assert!(
            text.contains("agentmesh_runtime_tcp_listen_drops_total "),
            "{text}"
        );
    }
}
