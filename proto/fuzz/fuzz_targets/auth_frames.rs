//! `/agentmesh/auth/1` frames, as the router's request and the member's answer.
//! The checks live in `agentmesh_fuzzing::targets::auth_frames` (shared with the
//! stable corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentmesh_fuzzing::targets::auth_frames::run(data);
});
