use super::*;

fn head(kind: u32, chunks: u32, here: u32, meta_len: u32) -> Head {
    Head {
        magic: HEAD_MAGIC,
        kind,
        chunks,
        offset: 4096,
        bytes: 1 << 20,
        device_uuid: [3; 16],
        meta_len,
        here,
    }
}

fn sizes(n: usize) -> Vec<u8> {
    (0..n).flat_map(|_| (20u64 << 20).to_ne_bytes()).collect()
}

#[test]
fn a_head_of_chunks_round_trips_with_its_metadata() {
    let payload = encode_head(head(KIND_CHUNKS, 40, 16, 5), &sizes(16), b"shape");
    let (h, body, meta) = decode_head(&payload).expect("valid");
    assert_eq!((h.chunks, h.here, h.offset), (40, 16, 4096));
    assert_eq!(decode_sizes(body).expect("sizes"), vec![20 << 20; 16]);
    assert_eq!(meta, b"shape");
}

#[test]
fn a_legacy_head_round_trips_and_must_agree_with_its_raw_export() {
    let mut raw = RawExport {
        handle: RawMemHandle([1; 64]),
        offset: 4096,
        bytes: 1 << 20,
        device_uuid: [3; 16],
        device_ordinal: 0,
        exporter_pid: 7,
    };
    let payload = encode_head(head(KIND_LEGACY, 0, 0, 0), bytemuck::bytes_of(&raw), b"");
    let (_, body, meta) = decode_head(&payload).expect("valid");
    assert_eq!(body, bytemuck::bytes_of(&raw));
    assert!(meta.is_empty());
    raw.bytes += 1;
    let payload = encode_head(head(KIND_LEGACY, 0, 0, 0), bytemuck::bytes_of(&raw), b"");
    assert!(matches!(
        decode_head(&payload),
        Err(Error::CorruptHandle {
            defect: HandleDefect::Layout { .. }
        })
    ));
}

#[test]
fn every_cut_and_every_bad_count_in_a_head_is_refused() {
    let payload = encode_head(head(KIND_CHUNKS, 3, 3, 2), &sizes(3), b"ok");
    for cut in 0..payload.len() {
        assert!(decode_head(&payload[..cut]).is_err(), "cut at {cut}");
    }
    let mut longer = payload.clone();
    longer.push(0);
    assert!(decode_head(&longer).is_err());
    for (chunks, here) in [(0, 0), (3, 0), (3, 4), (40, 17), (MAX_CHUNKS as u32 + 1, 1)] {
        let n = here as usize;
        let p = encode_head(head(KIND_CHUNKS, chunks, here, 0), &sizes(n), b"");
        assert!(decode_head(&p).is_err(), "{chunks} chunks, {here} here");
    }
    let p = encode_head(
        head(KIND_CHUNKS, 3, 3, MAX_META as u32 + 1),
        &sizes(3),
        &[0; 4097],
    );
    assert!(decode_head(&p).is_err());
    let p = encode_head(head(9, 3, 3, 0), &sizes(3), b"");
    assert!(matches!(
        decode_head(&p),
        Err(Error::CorruptHandle {
            defect: HandleDefect::Kind { .. }
        })
    ));
    // One byte changed on the way is the checksum's to catch.
    let mut p = encode_head(head(KIND_CHUNKS, 3, 3, 0), &sizes(3), b"");
    p[20] ^= 1;
    assert!(matches!(
        decode_head(&p),
        Err(Error::CorruptHandle {
            defect: HandleDefect::Checksum { .. }
        })
    ));
    let mut bad = head(KIND_CHUNKS, 3, 3, 0);
    bad.magic = *b"cuipcfm1"; // the format before the checksum
    assert!(matches!(
        decode_head(&encode_head(bad, &sizes(3), b"")),
        Err(Error::CorruptHandle {
            defect: HandleDefect::Magic { .. }
        })
    ));
}

#[test]
fn a_chunk_of_zero_bytes_is_refused() {
    let mut body = sizes(2);
    body[8..].fill(0);
    assert!(decode_sizes(&body).is_err());
}

#[test]
fn continuations_must_come_in_order_and_stay_within_the_total() {
    let more = |first: u32, here: u32, n: usize| {
        let m = More {
            magic: MORE_MAGIC,
            first,
            here,
        };
        encode_more(m, &sizes(n))
    };
    assert_eq!(
        decode_more(&more(16, 4, 4), 16, 20).expect("valid").len(),
        4
    );
    assert!(
        decode_more(&more(15, 4, 4), 16, 20).is_err(),
        "out of order"
    );
    assert!(
        decode_more(&more(16, 5, 5), 16, 20).is_err(),
        "past the total"
    );
    assert!(decode_more(&more(16, 4, 3), 16, 20).is_err(), "sizes short");
    assert!(decode_more(&more(16, 0, 0), 16, 20).is_err(), "empty");
    assert!(
        decode_more(&more(16, 17, 17), 16, 40).is_err(),
        "too many descriptors"
    );
    let p = more(16, 4, 4);
    for cut in 0..p.len() {
        assert!(decode_more(&p[..cut], 16, 20).is_err(), "cut at {cut}");
    }
}

#[test]
fn descriptors_must_match_the_sizes_one_for_one() {
    assert!(check_fds(3, 3).is_ok());
    assert!(check_fds(3, 2).is_err());
    assert!(check_fds(0, 1).is_err());
}

#[test]
fn the_element_type_must_divide_the_bytes_and_suit_the_offset() {
    assert_eq!(elements::<f32>(4096, 1 << 20).expect("valid"), 1 << 18);
    assert!(elements::<f32>(4096, 6).is_err());
    assert!(elements::<f32>(2, 8).is_err());
    assert!(elements::<u8>(0, 0).is_err());
}

/// Whether every copy of the pipe's write end is closed (its read end hangs up).
fn writers_all_closed(read: &std::io::PipeReader) -> bool {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd {
        fd: read.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd of a descriptor we own, no wait.
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    rc == 1 && pfd.revents & libc::POLLHUP != 0
}

/// A forged head: `chunks` in all, `sizes` in this message.
fn forged(chunks: u32, sizes: &[u64]) -> Vec<u8> {
    let mut h = head(KIND_CHUNKS, chunks, sizes.len() as u32, 0);
    h.offset = 0;
    h.bytes = 4096;
    let body: Vec<u8> = sizes.iter().flat_map(|s| s.to_ne_bytes()).collect();
    encode_head(h, &body, b"")
}

/// Messages a peer could forge, over a real socket: each refused, every descriptor that
/// came with them closed (a pipe's write end sent in each: its read end hangs up once the
/// receiver holds no copy), and a sender gone between continuations is `PeerClosed`.
#[test]
fn forged_messages_are_refused_with_every_descriptor_closed() {
    use crate::fd::{FdListener, PeerPolicy, SocketName};
    let t = Duration::from_secs(10);
    let name = SocketName::Abstract(format!("cuda-ipc-foreign-test-{}", std::process::id()));
    let listener = FdListener::bind(name.clone(), PeerPolicy::SameUid).expect("bind");
    let (read, write) = std::io::pipe().expect("pipe");
    let forger = std::thread::spawn(move || {
        let peer = listener.accept(t).expect("accept");
        let w = write.as_fd();
        // Two sizes, one descriptor.
        peer.send(&forged(2, &[2 << 20, 2 << 20]), &[w], t)
            .expect("send");
        // Not a head at all.
        peer.send(b"cuipcfm2, short", &[w, w], t).expect("send");
        // A valid first part, then a continuation that starts at the wrong chunk.
        peer.send(&forged(3, &[2 << 20]), &[w], t).expect("send");
        let more = More {
            magic: MORE_MAGIC,
            first: 5,
            here: 2,
        };
        peer.send(&encode_more(more, &[0; 16]), &[w, w], t)
            .expect("send");
        // Chunks that do not hold the data: 4096 bytes at offset 0 in one chunk of 1 byte.
        peer.send(&forged(1, &[1]), &[w], t).expect("send");
        // Twenty chunks announced, sixteen sent, then the sender goes away.
        peer.send(&forged(20, &[2 << 20; 16]), &[w; 16], t)
            .expect("send");
        drop(write);
    });
    let socket = FdSocket::connect(&name, &PeerPolicy::SameUid, t).expect("connect");
    let next = || socket.receive_foreign(t).map(drop).expect_err("refused");
    assert!(matches!(
        next(),
        Error::CorruptHandle {
            defect: HandleDefect::Memory { .. }
        }
    ));
    assert!(matches!(next(), Error::CorruptHandle { .. }));
    assert!(matches!(
        next(),
        Error::CorruptHandle {
            defect: HandleDefect::Layout { .. }
        }
    ));
    assert!(matches!(
        next(),
        Error::CorruptHandle {
            defect: HandleDefect::Layout { .. }
        }
    ));
    let gone = next();
    assert!(matches!(gone, Error::PeerClosed { .. }), "{gone:?}");
    forger.join().expect("forger");
    assert!(
        writers_all_closed(&read),
        "a received descriptor was kept open"
    );
}
