//! `cargo fuzz run frames`: see `ferroloader::fuzzing::frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferroloader::fuzzing::frames(data));
