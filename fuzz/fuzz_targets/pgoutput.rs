#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| wal2delta_cdc::fuzz::pgoutput(data));
