#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_cases::grpc_handlers(data));
