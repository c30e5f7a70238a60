//! Proofs of possession and the Enroll, Refresh and RouterLease requests that carry them.
//! The checks live in `agentmesh_fuzzing::targets::enroll_proof` (shared with the
//! stable corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentmesh_fuzzing::targets::enroll_proof::run(data);
});
