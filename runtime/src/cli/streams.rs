//! The stream-limit flags: the streams crate's bounds, one flag each.

use clap::builder::RangedU64ValueParser;

/// Bounds of the streams behaviour (inbound queues, opens waiting for a dial).
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct StreamLimitArgs {
    /// Inbound streams of one protocol waiting for its accept loop, streams (at least 1); when full, shared fairly by peer; more are dropped, agentmesh_streams_inbound_dropped_total.
    #[arg(
        long,
        default_value_t = agentmesh_streams::DEFAULT_INBOUND_QUEUE_PER_PROTOCOL,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub stream_inbound_queue_per_protocol: usize,
    /// Stream opens waiting for a dial to one peer, opens (at least 1); more are refused, agentmesh_streams_pending_opens_refused_total{limit="per_peer"}.
    #[arg(
        long,
        default_value_t = agentmesh_streams::DEFAULT_MAX_PENDING_OPENS_PER_PEER,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub stream_max_pending_opens_per_peer: usize,
    /// Stream opens waiting for dials to all peers together, opens (at least 1); more are refused, limit="total".
    #[arg(
        long,
        default_value_t = agentmesh_streams::DEFAULT_MAX_PENDING_OPENS_TOTAL,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub stream_max_pending_opens_total: usize,
}

impl StreamLimitArgs {
    /// The bounds of opens waiting for a dial, as the streams crate takes them.
    pub fn pending_open_limits(&self) -> agentmesh_streams::PendingOpenLimits {
        agentmesh_streams::PendingOpenLimits {
            max_pending_opens_per_peer: self.stream_max_pending_opens_per_peer,
            max_pending_opens_total: self.stream_max_pending_opens_total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        s: StreamLimitArgs,
    }

    #[test]
    fn defaults_are_the_streams_crates_and_zero_is_refused() {
        let c = Cli::try_parse_from(["x"]).expect("parse").s;
        assert_eq!(
            (
                c.stream_inbound_queue_per_protocol,
                c.stream_max_pending_opens_per_peer,
                c.stream_max_pending_opens_total
            ),
            (
                agentmesh_streams::DEFAULT_INBOUND_QUEUE_PER_PROTOCOL,
                agentmesh_streams::DEFAULT_MAX_PENDING_OPENS_PER_PEER,
                agentmesh_streams::DEFAULT_MAX_PENDING_OPENS_TOTAL
            )
        );
        for flag in [
            "--stream-inbound-queue-per-protocol",
            "--stream-max-pending-opens-per-peer",
            "--stream-max-pending-opens-total",
        ] {
            let err = Cli::try_parse_from(["x", flag, "0"]).expect_err("0 refused");
            assert!(err.to_string().contains(&flag[2..]), "{err}");
            assert!(Cli::try_parse_from(["x", flag, "3"]).is_ok(), "{flag}");
        }
    }
}
