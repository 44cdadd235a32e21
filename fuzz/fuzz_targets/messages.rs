//! `cargo fuzz run messages`: see `ferroloader::fuzzing::messages`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferroloader::fuzzing::messages(data));
