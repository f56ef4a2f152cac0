//! A lease table under a hostile peer: a program of steps that overwrite words of the table
//! and run the exporter's and an importer's operations on it. Every operation returns a value
//! or an error (the exporter's close within its zero timeout) — never a panic, a hang or a slot
//! outside the table.
#![no_main]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cuda_ipc::__private::lease::{Export, Held, TABLE_BYTES, table_name};
const MAX_IMPORTERS: usize = cuda_ipc::IpcBuffer::<u8>::MAX_IMPORTERS;
use libfuzzer_sys::fuzz_target;

#[path = "steps.rs"]
mod steps;

static RUN: AtomicU64 = AtomicU64::new(0);

fuzz_target!(|data: &[u8]| {
    // A fresh export each run: this process's pid and a counter.
    let mut token = [0u8; 16];
    token[..8].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
    token[8..].copy_from_slice(&RUN.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let Ok(export) = Export::create(&token) else {
        return;
    };
    let Some(state) = steps::State::open(&table_name(&token), TABLE_BYTES) else {
        return;
    };
    let mut held: Vec<Held> = Vec::new();
    // Steps of 11 bytes: [op, offset (2 bytes), value (8 bytes)].
    for steps::Step { op, offset, value } in steps::steps(data, TABLE_BYTES) {
        match op % 5 {
            0 => {
                state.write(offset, value);
            }
            1 if held.len() < 2 * MAX_IMPORTERS => {
                if let Ok(h) = Held::acquire(&token) {
                    assert!(h.slot() < MAX_IMPORTERS, "slot {}", h.slot());
                    held.push(h);
                }
            }
            2 => {
                held.pop();
            }
            3 => {
                let _ = export.holders();
            }
            _ => {
                let _ = export.close_and_wait(Duration::ZERO);
            }
        }
    }
});
