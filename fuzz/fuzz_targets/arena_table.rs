//! An arena's books and block table driven by a program of honest operations (allocate, free,
//! an importer entering or leaving a block, reclaiming with some importers dead) and hostile
//! writes to the table. Checked after every step:
//!
//! - never a panic; every allocation aligned, inside the arena, and disjoint from every other
//!   live allocation; free + live + quarantined bytes add up to the capacity;
//! - until the first hostile write: a freed buffer's generation never enters again, and no
//!   allocation overlaps a range a live importer holds a view of.
#![no_main]

use cuda_ipc::__private::arena::{Books, Placement};
use cuda_ipc::arena::IpcArena;
use libfuzzer_sys::fuzz_target;

#[path = "steps.rs"]
mod steps;

const CAPACITY: u64 = 64 * IpcArena::ALIGN;
const BUFFERS: usize = 12;
const IMPORTERS: u64 = 4;

fn overlaps(a: &Placement, b: &Placement) -> bool {
    a.2 < b.2 + b.3 && b.2 < a.2 + a.3
}

fuzz_target!(|data: &[u8]| {
    let mut books = Books::new(CAPACITY, BUFFERS);
    let mut live: Vec<Placement> = Vec::new();
    let mut freed: Vec<Placement> = Vec::new();
    // (importer, placement) views held by importers that are alive.
    let mut views: Vec<(u64, Placement)> = Vec::new();
    let mut dead = 0u64;
    let mut hostile = false;
    for steps::Step { op, offset, value } in steps::steps(data, BUFFERS * 32) {
        match op % 6 {
            0 => {
                if let Some(p) = books.alloc(1 + value % (CAPACITY / 3)) {
                    assert_eq!(p.2 % IpcArena::ALIGN, 0, "{p:?} misaligned");
                    assert!(p.2 + p.3 <= CAPACITY, "{p:?} outside the arena");
                    assert!(p.1 % 2 == 1, "{p:?}: a live generation is odd");
                    for q in &live {
                        assert!(!overlaps(&p, q), "{p:?} overlaps live {q:?}");
                    }
                    if !hostile {
                        for (k, q) in &views {
                            assert!(!overlaps(&p, q), "{p:?} reuses {q:?} under importer {k}");
                        }
                    }
                    live.push(p);
                }
            }
            1 if !live.is_empty() => {
                let p = live.swap_remove((value % live.len() as u64) as usize);
                books.free(p);
                freed.push(p);
            }
            2 => {
                let k = value % IMPORTERS;
                let pool = [&live[..], &freed[..]].concat();
                if dead & (1 << k) != 0 || pool.is_empty() {
                    continue;
                }
                let p = pool[(value / IMPORTERS % pool.len() as u64) as usize];
                if views.iter().any(|(j, q)| *j == k && q.0 == p.0) {
                    continue; // one entry per block and importer, as ImportedArena keeps
                }
                let entered = books.enter(1 << k, p.0, p.1);
                if !hostile {
                    assert_eq!(
                        entered,
                        live.contains(&p),
                        "{p:?}: entered {entered}, live {}",
                        live.contains(&p)
                    );
                }
                if entered {
                    views.push((k, p));
                }
            }
            3 if !views.is_empty() => {
                let (k, p) = views.swap_remove((value % views.len() as u64) as usize);
                books.leave(1 << k, p.0);
            }
            4 => {
                // Importer `k` dies (its views die with it) and the owner reclaims.
                if value & 1 == 1 {
                    let k = (value >> 1) % IMPORTERS;
                    dead |= 1 << k;
                    views.retain(|(j, _)| *j != k);
                }
                books.reclaim(dead);
            }
            5 => {
                hostile = true;
                books.scribble((offset / 8) as usize, value);
            }
            _ => {}
        }
        let live_bytes: u64 = live.iter().map(|p| p.3).sum();
        assert_eq!(
            books.free_bytes() + live_bytes + books.quarantined_bytes(),
            CAPACITY,
            "bytes lost or doubled"
        );
    }
});
