//! A channel's shared ring state under a hostile peer: a program of steps that overwrite words
//! of the state and run either side's operations. Every operation returns a value or an error
//! within its zero timeout — never a panic, a hang, an index out of the ring or a length above
//! the capacity.
#![no_main]

use std::time::Duration;

use cuda_ipc::__private::channel::{HostConsumer, HostProducer, RING_STATE_BYTES};
use libfuzzer_sys::fuzz_target;

#[path = "steps.rs"]
mod steps;

const SLOTS: usize = 4;
const CAPACITY: u64 = 100;

fuzz_target!(|data: &[u8]| {
    let Ok(mut tx) = HostProducer::create(SLOTS, CAPACITY) else {
        return;
    };
    // Kept open to write through after the consumer unlinks the name on attach.
    let Some(state) = steps::State::open(tx.name(), RING_STATE_BYTES) else {
        return;
    };
    let Ok(mut rx) = HostConsumer::open_pausing(tx.name(), SLOTS, CAPACITY, || {}) else {
        return;
    };
    // The input is a program of 11-byte steps: [op, offset (2 bytes), value (8 bytes)]. A
    // write step puts `value` into an 8-byte word of the ring state, as a hostile peer could;
    // the others are the two sides' operations, which must stay within the ring.
    for steps::Step { op, offset, value } in steps::steps(data, RING_STATE_BYTES) {
        match op % 4 {
            0 => {
                state.write(offset, value);
            }
            1 => {
                if let Ok((slot, len)) = rx.recv(Duration::ZERO) {
                    assert!(slot < SLOTS, "slot {slot}");
                    assert!(len <= CAPACITY, "length {len}");
                    let _ = rx.release();
                }
            }
            2 => {
                if let Ok(slot) = tx.acquire(Duration::ZERO) {
                    assert!(slot < SLOTS, "slot {slot}");
                    let _ = tx.send(value % (CAPACITY + 1));
                }
            }
            _ => {
                let _ = tx.has_consumer();
            }
        }
    }
});
