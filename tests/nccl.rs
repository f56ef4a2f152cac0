//! NCCL communicators (`cuda_ipc::nccl`) on one GPU, as far as one GPU goes: a communicator of
//! one rank sends to itself, 1 MiB and 64 MiB, byte for byte; a peer outside it is refused; a
//! rank whose peer never joins ends in its time-out, aborted; two processes pairing on one GPU
//! (over the TCP bootstrap and over a Unix socket) get NCCL's own refusal, with its text, in
//! bounded time — not a hang. Two processes on two GPUs need a machine with two.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::time::{Duration, Instant};

use common::{fd_connect, fd_listener, gpu, pattern, spawn, watchdog};
use cuda_ipc::bootstrap::{BootstrapListener, Secret};
use cuda_ipc::nccl::{Communicator, UniqueId};
use cuda_ipc::{Error, IpcBuffer, RawStream};

const T: Duration = Duration::from_secs(30);

fn secret() -> Secret {
    Secret::new(b"cuda-ipc nccl test secret, 32 bytes".to_vec()).unwrap()
}

/// What a pairing that must fail ended with, as one word and NCCL's text.
fn outcome(r: cuda_ipc::Result<Communicator>) -> String {
    match r {
        Ok(c) => format!("joined {c:?}"),
        Err(Error::Nccl { name, detail, .. }) => format!("nccl {name} {detail}"),
        Err(e) => format!("other {e}"),
    }
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        let ctx = gpu();
        let start = Instant::now();
        let r = match role {
            "pair-tcp" => {
                let mut link =
                    cuda_ipc::bootstrap::connect(args[0].as_str(), &secret(), T).unwrap();
                Communicator::pair(&ctx, &mut link, T)
            }
            "pair-local" => Communicator::pair_local(&ctx, &fd_connect(&args[0]), 1, T),
            _ => return 2,
        };
        println!("RESULT {:.3} {}", start.elapsed().as_secs_f64(), outcome(r));
        0
    });
}

#[test]
#[ignore = "requires a CUDA device"]
fn one_rank_sends_to_itself_byte_for_byte() {
    let _dog = watchdog("nccl one rank", Duration::from_secs(120));
    let ctx = gpu();
    let (major, minor, patch) = cuda_ipc::nccl::version().unwrap();
    println!(
        "nccl: {} version {major}.{minor}.{patch}",
        cuda_ipc::nccl::library_path().unwrap()
    );
    assert!(major >= 2);
    let comm = Communicator::new(&ctx, &UniqueId::new().unwrap(), 1, 0, T).unwrap();
    assert_eq!((comm.rank(), comm.size()), (0, 1));
    for words in [1 << 18, 16 << 20] {
        let src = IpcBuffer::<u32>::new(&ctx, words).unwrap();
        let dst = IpcBuffer::<u32>::zeroed(&ctx, words).unwrap();
        let data = pattern(words, words as u32);
        src.copy_from_host(&data).unwrap();
        let bytes = words * 4;
        comm.group(|| {
            // SAFETY: both buffers live past the wait below; nothing else touches them.
            unsafe {
                comm.send(src.as_raw_ptr(), bytes, 0, &RawStream::LEGACY)?;
                comm.recv(dst.as_raw_ptr(), bytes, 0, &RawStream::LEGACY)
            }
        })
        .unwrap();
        comm.wait(&RawStream::LEGACY, T).unwrap();
        let mut host = vec![0u32; words];
        dst.copy_to_host(&mut host).unwrap();
        assert!(host == data, "{bytes} bytes sent to itself differ");
    }
    comm.async_error().unwrap();
}

/// An enqueue NCCL refuses inside a group (a receive into a null pointer): the group returns
/// that error and the communicator is aborted only after `ncclGroupEnd` ran (not under it);
/// later calls are refused without reaching NCCL, and the process goes on (a new communicator
/// works). NCCL reports the null receive either at the enqueue — then the send after it,
/// inside the group, is refused at once — or at `ncclGroupEnd` (NCCL 2.28 on an H100: the
/// send after it is queued with the group and cancelled by the abort).
#[test]
#[ignore = "requires a CUDA device"]
fn an_enqueue_refused_inside_a_group_aborts_the_communicator_after_the_group() {
    let _dog = watchdog("nccl group error", Duration::from_secs(120));
    let ctx = gpu();
    let comm = Communicator::new(&ctx, &UniqueId::new().unwrap(), 1, 0, T).unwrap();
    let src = IpcBuffer::<u8>::zeroed(&ctx, 4096).unwrap();
    let mut seen = None;
    let r = comm.group(|| {
        // SAFETY: `src` outlives the communicator's abort below, which cancels the sends; the
        // null receive is refused by NCCL, never run.
        unsafe {
            comm.send(src.as_raw_ptr(), 4096, 0, &RawStream::LEGACY)?;
            let refused = comm.recv(0, 4096, 0, &RawStream::LEGACY);
            let after = comm.send(src.as_raw_ptr(), 4096, 0, &RawStream::LEGACY);
            seen = Some((refused.is_err(), after));
            refused
        }
    });
    assert!(matches!(r, Err(Error::Nccl { .. })), "{r:?}");
    let (at_enqueue, after) = seen.unwrap();
    println!(
        "nccl: the null receive refused at the {}",
        if at_enqueue { "enqueue" } else { "group's end" }
    );
    if at_enqueue {
        assert!(
            matches!(after, Err(Error::Nccl { code: 5, .. })),
            "a send after the refusal, inside the group: {after:?}"
        );
    } else {
        assert!(after.is_ok(), "{after:?}");
    }
    let later = comm.async_error();
    assert!(
        matches!(later, Err(Error::Nccl { code: 5, .. })),
        "{later:?}"
    );
    drop(comm);
    let again = Communicator::new(&ctx, &UniqueId::new().unwrap(), 1, 0, T).unwrap();
    again.async_error().unwrap();
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_peer_outside_the_communicator_is_refused() {
    let ctx = gpu();
    let comm = Communicator::new(&ctx, &UniqueId::new().unwrap(), 1, 0, T).unwrap();
    let buf = IpcBuffer::<u8>::zeroed(&ctx, 4096).unwrap();
    // SAFETY: refused before anything is enqueued.
    let r = unsafe { comm.send(buf.as_raw_ptr(), 4096, 1, &RawStream::LEGACY) };
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    assert!(matches!(
        Communicator::new(&ctx, &UniqueId::new().unwrap(), 1, 1, T),
        Err(Error::InvalidArgument { .. })
    ));
    comm.async_error().unwrap();
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_rank_whose_peer_never_joins_ends_in_its_time_out() {
    let _dog = watchdog("nccl lonely rank", Duration::from_secs(60));
    let ctx = gpu();
    let start = Instant::now();
    let r = Communicator::new(
        &ctx,
        &UniqueId::new().unwrap(),
        2,
        0,
        Duration::from_secs(3),
    );
    let took = start.elapsed();
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(took < Duration::from_secs(6), "ended after {took:?}");
}

/// Two ranks on one GPU: NCCL refuses the pair (measured: `ncclInvalidUsage`); each side must
/// end with NCCL's error, in bounded time.
fn two_ranks_on_one_gpu(role: &str) {
    let _dog = watchdog("nccl two ranks, one GPU", Duration::from_secs(120));
    let ctx = gpu();
    let start = Instant::now();
    let (mine, child) = match role {
        "pair-tcp" => {
            let listener = BootstrapListener::bind("127.0.0.1:0", secret()).unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let child = spawn(role, &[&addr]);
            let mut link = listener.accept(T).unwrap();
            (Communicator::pair(&ctx, &mut link, T), child)
        }
        _ => {
            let (listener, name) = fd_listener("nccl-pair");
            let child = spawn(role, &[&name]);
            let socket = listener.accept(T).unwrap();
            (Communicator::pair_local(&ctx, &socket, 0, T), child)
        }
    };
    let took = start.elapsed();
    let mine = outcome(mine);
    let (status, results) = child.wait(Duration::from_secs(60));
    println!("{role}: this side after {took:?}: {mine}; the child: {results:?}");
    assert!(status.success(), "child {status:?}");
    assert!(mine.starts_with("nccl ncclInvalidUsage"), "{mine}");
    assert!(
        mine.len() > "nccl ncclInvalidUsage ".len(),
        "NCCL's text is kept: {mine}"
    );
    assert!(took < T, "{took:?}");
    let theirs = results.first().expect("the child's result");
    assert!(theirs.contains("nccl ncclInvalidUsage"), "{theirs}");
}

#[test]
#[ignore = "requires a CUDA device"]
fn two_ranks_on_one_gpu_over_the_tcp_bootstrap_get_nccls_refusal() {
    two_ranks_on_one_gpu("pair-tcp");
}

#[test]
#[ignore = "requires a CUDA device"]
fn two_ranks_on_one_gpu_over_a_unix_socket_get_nccls_refusal() {
    two_ranks_on_one_gpu("pair-local");
}
