//! Credentials: claims the fuzzer writes, signed with a key the trust holds, through `credential::verify`.
//! The checks live in `agentmesh_fuzzing::targets::credential` (shared with the
//! stable corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentmesh_fuzzing::targets::credential::run(data);
});
