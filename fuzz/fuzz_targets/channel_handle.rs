//! Any bytes offered as a channel handle: an error or a handle whose geometry is one this
//! crate makes (slots 1 to 64, a stride that holds the capacity, a region name of its own),
//! never a panic. Each input is tried as given and with its checksum recomputed, so that the
//! checks behind the checksum are reached too.
#![no_main]

use cuda_ipc::channel::IpcChannelHandle;
use libfuzzer_sys::fuzz_target;

fn check(data: &[u8]) {
    if let Ok(h) = IpcChannelHandle::<u32>::from_bytes(data) {
        assert_eq!(h.as_bytes(), data);
        assert!((1..=64).contains(&h.slots()), "{} slots", h.slots());
        // The ring's whole size is computable: what opening would map.
        let total = (h.slots() as u128) * (h.capacity() as u128) * 4;
        assert!(total < u128::from(u64::MAX));
        let _ = format!("{h:?}");
    }
    let _ = IpcChannelHandle::<[u8; 3]>::from_bytes(data);
    let _ = IpcChannelHandle::<u64>::from_bytes(data);
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut sealed = data.to_vec();
    cuda_ipc::__private::reseal_channel(&mut sealed);
    check(&sealed);
});
