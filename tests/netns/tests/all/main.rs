//! The testbed against the real kernel: hosts reach each other and nothing
//! else, NATs map and filter as their kind says and hairpin, links go down
//! and up, programs run inside their host, and every namespace goes away
//! (on drop, on panic, and as a killed run's leftover). Each test prints
//! `SKIPPED:` and returns where namespaces cannot be made (not root).

mod cleanup;
mod links;
mod nat;
mod support;
