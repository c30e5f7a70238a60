//! Signed service records: record bytes the fuzzer writes, signed by a member key, through `record::verify_record`.
//! The checks live in `agentmesh_fuzzing::targets::record` (shared with the
//! stable corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentmesh_fuzzing::targets::record::run(data);
});
