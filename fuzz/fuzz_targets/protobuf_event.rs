#![no_main]
// Generated alike for every target of kube_nlproxy::fuzz::TARGETS.
libfuzzer_sys::fuzz_target!(
    init: kube_nlproxy::fuzz::write_seeds_from_env("protobuf_event"),
    |data: &[u8]| kube_nlproxy::fuzz::protobuf_event(data)
);
