//! The fuzz corpus on the stable toolchain: every committed input replays
//! through its target's checks, so CI guards what fuzzing found without
//! nightly or libFuzzer.

mod replay;
