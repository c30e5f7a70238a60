//! Signed revocation lists offered to a member or router (`HeldRevocations::accept`).
//! The checks live in `agentmesh_fuzzing::targets::revocation_list` (shared
//! with the stable corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentmesh_fuzzing::targets::revocation_list::run(data);
});
