#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_cases::gpu_host_transport(data));
