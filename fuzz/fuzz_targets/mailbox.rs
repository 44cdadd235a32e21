//! `cargo fuzz run mailbox`: see `ferroloader::fuzzing::mailbox`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferroloader::fuzzing::mailbox(data));
