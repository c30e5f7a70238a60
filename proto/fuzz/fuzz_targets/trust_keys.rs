//! Key sets and revocation lists given to `Trust::set_keys` and `Trust::set_revocations`.
//! The checks live in `agentmesh_fuzzing::targets::trust_keys` (shared with the
//! stable corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentmesh_fuzzing::targets::trust_keys::run(data);
});
