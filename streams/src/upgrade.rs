//! The (trivial) upgrade: multistream-select picks one of the offered
//! protocol names and the raw stream is handed over as is.

use std::convert::Infallible;
use std::future::{Ready, ready};

use libp2p::core::upgrade::{InboundUpgrade, OutboundUpgrade, UpgradeInfo};
use libp2p::{Stream, StreamProtocol};

/// Offers (outbound) or accepts (inbound) a list of protocol names.
pub struct Protocols(pub(crate) Vec<StreamProtocol>);

impl UpgradeInfo for Protocols {
    type Info = StreamProtocol;
    type InfoIter = std::vec::IntoIter<StreamProtocol>;

    fn protocol_info(&self) -> Self::InfoIter {
        self.0.clone().into_iter()
    }
}

impl InboundUpgrade<Stream> for Protocols {
    type Output = (Stream, StreamProtocol);
    type Error = Infallible;
    type Future = Ready<Result<Self::Output, Infallible>>;

    fn upgrade_inbound(self, stream: Stream, negotiated: StreamProtocol) -> Self::Future {
        ready(Ok((stream, negotiated)))
    }
}

impl OutboundUpgrade<Stream> for Protocols {
    type Output = Stream;
    type Error = Infallible;
    type Future = Ready<Result<Stream, Infallible>>;

    fn upgrade_outbound(self, stream: Stream, _: StreamProtocol) -> Self::Future {
        ready(Ok(stream))
    }
}
