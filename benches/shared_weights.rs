//! Opening every tensor of a model another process holds: 2,000 tensors (8 GiB, the shapes of
//! `examples/shared_weights.rs`) in one arena imported **read-only** — one descriptor, one
//! `PROT_READ` mapping, then 2,000 opens with no driver call — against the same tensors as
//! 2,000 buffers with a legacy handle each (`ImportedBuffer::open` per tensor: the crate's cold
//! open, within a few percent of raw `cuIpcOpenMemHandle`, see `handle_open`), in the same
//! run, alternating. A sample is one reader's cold import: from receiving the arena's
//! descriptor to every tensor open (the handles, received once before, are plain bytes the
//! reader already holds; the legacy side opens its 2,000 handles). Views and mappings are
//! dropped after the clock stops. Also: a read-only against a read-write import of the same
//! arena (the goal: within 1.05×).
//!
//! A helper process (the owner), started once outside the measurement, allocates both sets
//! and answers each request with a new descriptor of the arena. Run:
//! `cargo bench --bench shared_weights`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench code: fail loudly

#[path = "common/mod.rs"]
mod common;
#[path = "../examples/common/weights.rs"]
mod weights;

use std::time::{Duration, Instant};

use criterion::Criterion;
use cuda_ipc::arena::{ArenaHandle, ImportedArena, IpcArena};
use cuda_ipc::fd::{FdListener, FdSocket, PeerPolicy, SocketName};
use cuda_ipc::{GpuContext, ImportedBuffer, IpcBuffer, IpcMemHandle};

const TENSORS: usize = 2000;
const GIB: f64 = 8.0;
const WAIT: Duration = Duration::from_secs(120);

fn socket_name(raw: &str) -> SocketName {
    SocketName::Abstract(raw.to_owned())
}

/// The handles of every tensor, as the owner sent them.
fn recv_all<H>(s: &FdSocket, size: usize, parse: impl Fn(&[u8]) -> H) -> Vec<H> {
    let bytes = weights::recv_handles(s, TENSORS, size, WAIT).unwrap();
    bytes.chunks(size).map(parse).collect()
}

/// The owner: both sets of tensors; then a new arena descriptor per request ("arena" for a
/// read-only one, "arena-rw" for one of the unmarked twin arena).
fn owner(raw: &str) {
    let ctx = GpuContext::new(0).unwrap();
    let words = weights::tensor_words(TENSORS, GIB);
    let room: usize = words.iter().map(|w| (w * 4).next_multiple_of(256)).sum();
    let weights = IpcArena::with_max_buffers(&ctx, room, TENSORS)
        .unwrap()
        .read_only_for_importers();
    let tensors: Vec<_> = words
        .iter()
        .map(|&w| weights.alloc::<u32>(w).unwrap())
        .collect();
    let twin = IpcArena::with_max_buffers(&ctx, room, TENSORS).unwrap();
    let twins: Vec<_> = words
        .iter()
        .map(|&w| twin.alloc::<u32>(w).unwrap())
        .collect();
    let legacy: Vec<_> = words
        .iter()
        .map(|&w| IpcBuffer::<u32>::new(&ctx, w).unwrap())
        .collect();
    let s = FdSocket::connect(&socket_name(raw), &PeerPolicy::SameUid, WAIT).unwrap();
    let handles: Vec<u8> = tensors
        .iter()
        .flat_map(|t| t.handle().as_bytes().to_vec())
        .collect();
    weights::send_handles(&s, &handles, ArenaHandle::<u32>::SIZE, WAIT).unwrap();
    let handles: Vec<u8> = twins
        .iter()
        .flat_map(|t| t.handle().as_bytes().to_vec())
        .collect();
    weights::send_handles(&s, &handles, ArenaHandle::<u32>::SIZE, WAIT).unwrap();
    let mut handles = Vec::new();
    for b in &legacy {
        handles.extend_from_slice(b.handle().unwrap().as_bytes());
    }
    weights::send_handles(&s, &handles, IpcMemHandle::<u32>::SIZE, WAIT).unwrap();
    loop {
        match s.recv(Duration::from_secs(3600)).map(|m| m.payload) {
            Ok(m) if m == b"arena" => s.send_arena(&weights, WAIT).unwrap(),
            Ok(m) if m == b"arena-rw" => s.send_arena(&twin, WAIT).unwrap(),
            _ => return,
        }
    }
}

struct Fixture {
    ctx: GpuContext,
    s: FdSocket,
    arena_handles: Vec<ArenaHandle<u32>>,
    twin_handles: Vec<ArenaHandle<u32>>,
    legacy_handles: Vec<IpcMemHandle<u32>>,
}

impl Fixture {
    /// Ask the owner for a new descriptor (`request`), then time one cold import (`import`)
    /// and the open of every one of `handles` (`open`): from receiving the descriptor to the
    /// last open. The views and the mapping are dropped after the clock stops. Both arena
    /// rows go through here, so that they measure exactly the same steps.
    fn cold_import<A, V>(
        &self,
        request: &[u8],
        handles: &[ArenaHandle<u32>],
        import: impl FnOnce(&FdSocket) -> A,
        open: impl Fn(&A, &ArenaHandle<u32>) -> V,
    ) -> Duration {
        self.s.send(request, &[], WAIT).unwrap();
        let t = Instant::now();
        let arena = import(&self.s);
        let views: Vec<V> = handles.iter().map(|h| open(&arena, h)).collect();
        let took = t.elapsed();
        drop((views, arena));
        took
    }

    /// One cold read-only import and 2,000 opens; the time until the last is open.
    fn read_only_arena(&self) -> Duration {
        self.cold_import(
            b"arena",
            &self.arena_handles,
            |s| s.recv_arena_read_only(&self.ctx, WAIT).unwrap(),
            |a, h| a.open(h).unwrap(),
        )
    }

    /// The same with a read-write import of the unmarked twin arena.
    fn read_write_arena(&self) -> Duration {
        self.cold_import(
            b"arena-rw",
            &self.twin_handles,
            |s| s.recv_arena(&self.ctx, WAIT).unwrap(),
            |a: &ImportedArena, h| a.open(h).unwrap(),
        )
    }

    /// 2,000 cold legacy opens; the time until the last is open.
    fn legacy_handles(&self) -> Duration {
        let t = Instant::now();
        let views: Vec<_> = self
            .legacy_handles
            .iter()
            .map(|h| ImportedBuffer::open(&self.ctx, h).unwrap())
            .collect();
        let took = t.elapsed();
        drop(views);
        took
    }
}

fn total(iters: u64, f: impl Fn() -> Duration) -> Duration {
    (0..iters).map(|_| f()).sum()
}

fn main() {
    if let Some((role, arg)) = common::role() {
        assert_eq!(role, "owner");
        owner(&arg);
        return;
    }
    let Some(ctx) = common::gpu_or_skip("shared_weights") else {
        return;
    };
    if !common::is_bench_run() {
        println!(
            "bench shared_weights: runs under `cargo bench` only (8 GiB twice, 2,000 buffers)"
        );
        return;
    }
    let raw = format!("cuda-ipc-bench-weights-{}", std::process::id());
    let listener = FdListener::bind(socket_name(&raw), PeerPolicy::SameUid).unwrap();
    let _helper = common::spawn("owner", &raw);
    let s = listener.accept(WAIT).unwrap();
    let arena = |b: &[u8]| ArenaHandle::from_bytes(b).unwrap();
    let arena_handles = recv_all(&s, ArenaHandle::<u32>::SIZE, arena);
    let twin_handles = recv_all(&s, ArenaHandle::<u32>::SIZE, arena);
    let legacy_handles = recv_all(&s, IpcMemHandle::<u32>::SIZE, |b| {
        IpcMemHandle::from_bytes(b).unwrap()
    });
    let f = Fixture {
        ctx,
        s,
        arena_handles,
        twin_handles,
        legacy_handles,
    };
    let mut c = Criterion::default()
        .sample_size(10)
        .measurement_time(Duration::from_secs(10))
        .configure_from_args();
    {
        let mut g = c.benchmark_group("shared_weights");
        g.bench_function("open_2000/read_only_arena", |b| {
            b.iter_custom(|n| total(n, || f.read_only_arena()))
        });
        g.bench_function("open_2000/read_write_arena", |b| {
            b.iter_custom(|n| total(n, || f.read_write_arena()))
        });
        g.bench_function("open_2000/legacy_handles", |b| {
            b.iter_custom(|n| total(n, || f.legacy_handles()))
        });
        g.finish();
    }
    c.final_summary();
    // The same-run table: alternating samples, p10 / p50 / p90 of one reader's cold import.
    let ns = |d: Duration| d.as_nanos() as f64;
    let (mut ro, mut rw, mut legacy) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..21 {
        ro.push(ns(f.read_only_arena()));
        legacy.push(ns(f.legacy_handles()));
        rw.push(ns(f.read_write_arena()));
    }
    for v in [&mut ro, &mut rw, &mut legacy] {
        v.sort_by(f64::total_cmp);
    }
    common::header("every one of 2,000 tensors (8 GiB) open in a reader");
    common::row("read-only arena vs legacy", &ro, &legacy);
    common::row("read-only vs read-write", &ro, &rw);
    let _ = f.s.send(b"bye", &[], WAIT);
}
