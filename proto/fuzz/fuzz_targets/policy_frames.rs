//! `/agentmesh/policy/1` frames: the policy push a member reads, the ack a router reads,
//! and the held-policy acceptance of the pushed policy. The checks live in
//! `agentmesh_fuzzing::targets::policy_frames` (shared with the stable corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentmesh_fuzzing::targets::policy_frames::run(data);
});
