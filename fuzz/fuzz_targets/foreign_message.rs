//! Any bytes offered as a foreign export's messages (`cuda_ipc::foreign`: a head, then
//! continuations): an error, or counts consistent with the bytes — never a panic. The first
//! two bytes split the input into a head and up to three continuations.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&[a, b], rest)) = data.split_first_chunk::<2>().map(|(h, r)| (h, r)) else {
        return;
    };
    let cut = (usize::from(u16::from_le_bytes([a, b])) % (rest.len() + 1)).min(rest.len());
    let (head, tail) = rest.split_at(cut);
    let third = tail.len() / 3;
    let more = [&tail[..third], &tail[third..2 * third], &tail[2 * third..]];
    cuda_ipc::__private::foreign::parse(head, &more);
});
