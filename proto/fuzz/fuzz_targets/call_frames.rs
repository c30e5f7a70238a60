//! `/agentmesh/call/1` frames, request and answer.
//! The checks live in `agentmesh_fuzzing::targets::call_frames` (shared with the
//! stable corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentmesh_fuzzing::targets::call_frames::run(data);
});
