//! `cargo fuzz run record`: see `ferroloader::fuzzing::record`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferroloader::fuzzing::record(data));
