//! CNI_ARGS as the runtime passes it: any text parses or is refused with
//! CNI code 4 (invalid environment), and what parses names the pod it read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use thereabouts_allocator::cni_args;

fuzz_target!(|text: &str| {
    match cni_args::parse(text) {
        Ok(args) => {
            let pairs = cni_args::pairs(text).expect("parsed text has pairs");
            let name = pairs.iter().rev().find(|(k, _)| *k == "K8S_POD_NAME").map(|(_, v)| *v).unwrap_or_default();
            assert_eq!(args.pod_name, name);
            assert!(args.pod_ref().is_empty() == name.is_empty());
        }
        Err(e) => {
            assert_eq!(e.code, 4, "{e:?}");
            assert!(e.message.starts_with("CNI_ARGS"), "{e:?}");
        }
    }
});
