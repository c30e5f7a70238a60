//! `/agentmesh/catalog/1` frames, request and answer, with the signed records they carry.
//! The checks live in `agentmesh_fuzzing::targets::catalog_frames` (shared with the
//! stable corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentmesh_fuzzing::targets::catalog_frames::run(data);
});
