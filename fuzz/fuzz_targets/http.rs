#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tcpx_rxdm::fuzz_targets::http(data));
