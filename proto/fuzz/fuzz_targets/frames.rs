//! Any bytes read as a frame of any of our messages: an error or a message, never a panic.
#![no_main]

use agentmesh_proto::framing::read_frame;
use agentmesh_proto::pb::mesh::{AuthRequest, CallRequest, CatalogRequest, GoAway};
use futures::executor::block_on;
use futures::io::Cursor;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let max = agentmesh_proto::protocols::MAX_FRAME_BYTES;
    let _ = block_on(read_frame::<AuthRequest, _>(&mut Cursor::new(data), max));
    let _ = block_on(read_frame::<CatalogRequest, _>(&mut Cursor::new(data), max));
    let _ = block_on(read_frame::<CallRequest, _>(&mut Cursor::new(data), max));
    let _ = block_on(read_frame::<GoAway, _>(&mut Cursor::new(data), max));
    if let Ok(signed) = prost::Message::decode(data) {
        let _ = agentmesh_proto::record::verify_record(&signed, 0);
    }
});
