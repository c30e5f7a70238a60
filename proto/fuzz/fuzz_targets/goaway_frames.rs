//! `/agentmesh/goaway/1` frames: the go-away a member reads and the ack a router reads.
//! The checks live in `agentmesh_fuzzing::targets::goaway_frames` (shared with the
//! stable corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentmesh_fuzzing::targets::goaway_frames::run(data);
});
