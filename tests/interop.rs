//! Raw legacy IPC handles against the real libraries: PyTorch exports tensors that Rust opens
//! (at offset zero and inside a caching-allocator block), Rust exports buffers that CuPy and
//! PyTorch open, a range past the block and a dead Python exporter are refused. The Python side
//! is `examples/interop/cuda_ipc_peer.py`, embedded in this binary (the GPU machine has no
//! source tree). GPU tests: on a GPU machine a missing python3, torch or cupy is a failure.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use common::{from_hex, gpu, watchdog};
use cuda_ipc::error::{ArgumentDefect, HandleDefect, PeerRole};
use cuda_ipc::raw::{RawImport, RawMemHandle};
use cuda_ipc::{Error, ImportedBuffer, IpcBuffer};

const PEER: &str = include_str!("../examples/interop/cuda_ipc_peer.py");

/// The peer script written to a temporary file (once per test).
fn peer_script() -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "cuda-ipc-peer-{}-{:?}.py",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&path, PEER).unwrap();
    path
}

/// A running Python peer with line-based stdin/stdout.
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    script: std::path::PathBuf,
}

impl Peer {
    fn start(args: &[&str]) -> Self {
        let script = peer_script();
        let mut child = Command::new("python3")
            .arg(&script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("these tests need python3 with torch and cupy on the GPU machine: {e}")
            });
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
            script,
        }
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).unwrap();
        assert!(
            n > 0,
            "the Python peer ended without answering (is torch/cupy installed? see its stderr)"
        );
        line.trim_end().to_owned()
    }

    fn say(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn finish(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the Python peer failed: {status}");
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.script);
    }
}

/// What `torch-export` printed.
struct TorchExport {
    handle: Vec<u8>,
    offset: u64,
    bytes: u64,
    pid: u32,
    storage_bytes: u64,
}

fn parse_export(line: &str) -> TorchExport {
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f.first(), Some(&"EXPORT"), "{line}");
    TorchExport {
        handle: from_hex(f[1]),
        offset: f[2].parse().unwrap(),
        bytes: f[3].parse().unwrap(),
        pid: f[5].parse().unwrap(),
        storage_bytes: f[6].parse().unwrap(),
    }
}

fn torch_peer(n: usize, value: i32, mode: &str) -> (Peer, TorchExport) {
    let mut peer = Peer::start(&["torch-export", &n.to_string(), &value.to_string(), mode]);
    let export = parse_export(&peer.line());
    assert_eq!(
        export.handle.len(),
        66,
        "PyTorch's handle: version, type, 64 bytes"
    );
    (peer, export)
}

fn import_of(e: &TorchExport) -> RawImport {
    RawImport::new(
        RawMemHandle::from_torch(&e.handle).unwrap(),
        e.offset,
        usize::try_from(e.bytes / 4).unwrap(),
    )
    .exporter_pid(e.pid)
}

/// Open, check every element is `want`, write `write` everywhere, have Python check it.
fn open_check_write(peer: &mut Peer, e: &TorchExport, want: i32, write: i32) {
    let ctx = gpu();
    // SAFETY: the Python peer keeps the tensor alive until its stdin closes, after this view
    // is dropped; the synchronous copies leave no queued work.
    let tensor = unsafe { ImportedBuffer::<i32>::open_raw(&ctx, &import_of(e)) }.unwrap();
    assert_eq!(tensor.len() as u64, e.bytes / 4);
    let mut host = vec![0i32; tensor.len()];
    tensor.copy_to_host(&mut host).unwrap();
    assert!(
        host.iter().all(|&v| v == want),
        "Rust read something else than PyTorch wrote"
    );
    tensor.copy_from_host(&vec![write; tensor.len()]).unwrap();
    drop(tensor);
    peer.say(&format!("check {write}"));
    assert_eq!(peer.line(), "OK", "PyTorch did not see Rust's write");
}

#[test]
#[ignore = "requires a CUDA device"]
fn the_python_side_is_there() {
    let mut peer = Peer::start(&["versions"]);
    let line = peer.line();
    eprintln!("interop: {line}");
    assert!(line.starts_with("VERSIONS "), "{line}");
    peer.finish();
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_torch_tensor_opens_in_rust_and_sees_rusts_write() {
    let _dog = watchdog("torch_to_rust", Duration::from_secs(120));
    let (mut peer, e) = torch_peer(1 << 20, 7, "plain");
    open_check_write(&mut peer, &e, 7, 9);
    peer.finish();
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_tensor_inside_a_caching_allocator_block_opens_at_its_offset() {
    let _dog = watchdog("torch_offset", Duration::from_secs(120));
    let (mut peer, e) = torch_peer(4096, 11, "offset");
    assert!(
        e.offset > 0,
        "the tensor should lie inside a block: offset {}",
        e.offset
    );
    eprintln!(
        "interop: tensor at byte {} of a {}-byte storage",
        e.offset, e.storage_bytes
    );
    open_check_write(&mut peer, &e, 11, 12);
    // A second open of another range of the same block shares the mapping (import cache).
    let ctx = gpu();
    let imp = import_of(&e);
    // SAFETY: as in open_check_write; both views drop before the peer's stdin closes.
    let (a, b) = unsafe {
        (
            ImportedBuffer::<i32>::open_raw(&ctx, &imp).unwrap(),
            ImportedBuffer::<i32>::open_raw(&ctx, &RawImport::new(imp.handle, imp.offset + 64, 16))
                .unwrap(),
        )
    };
    assert_eq!(b.as_raw_ptr(), a.as_raw_ptr() + 64);
    drop((a, b));
    peer.finish();
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_range_past_the_block_or_misaligned_is_refused() {
    let _dog = watchdog("torch_past_block", Duration::from_secs(120));
    let (mut peer, e) = torch_peer(4096, 3, "plain");
    let ctx = gpu();
    let handle = RawMemHandle::from_torch(&e.handle).unwrap();
    // The handle maps the whole caching-allocator block; ask for 1 GiB past its start.
    let past = RawImport::new(handle, e.offset, 1 << 28);
    // SAFETY: refused before any view exists.
    match unsafe { ImportedBuffer::<i32>::open_raw(&ctx, &past) } {
        Err(Error::CorruptHandle {
            defect: defect @ HandleDefect::Memory { .. },
        }) => {
            assert!(
                defect.to_string().contains("cuPointerGetAttributes"),
                "{defect}"
            );
            eprintln!("interop: refused: {defect}");
        }
        other => panic!("expected CorruptHandle, got {:?}", other.map(|b| b.len())),
    }
    let misaligned = RawImport::new(handle, e.offset + 2, 16);
    // SAFETY: refused before the driver is asked.
    let r = unsafe { ImportedBuffer::<i32>::open_raw(&ctx, &misaligned) };
    assert!(matches!(
        r,
        Err(Error::InvalidArgument {
            defect: ArgumentDefect::Misaligned { align: 4, .. },
            ..
        })
    ));
    // Nothing was written: PyTorch still sees its values.
    peer.say("check 3");
    assert_eq!(peer.line(), "OK");
    peer.finish();
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_rust_buffer_opens_in_cupy_and_torch() {
    let _dog = watchdog("rust_to_python", Duration::from_secs(120));
    let ctx = gpu();
    let buf = IpcBuffer::<i32>::new(&ctx, 1 << 20).unwrap();
    buf.copy_from_host(&vec![5; 1 << 20]).unwrap();
    let e = buf.raw_export().unwrap();
    assert_eq!((e.offset, e.bytes), (0, 4 << 20));
    let handle: String = e.handle.0.iter().map(|b| format!("{b:02x}")).collect();
    let mut peer = Peer::start(&[
        "cupy-import",
        &handle,
        &e.offset.to_string(),
        &e.bytes.to_string(),
        "5",
        "6",
    ]);
    assert_eq!(peer.line(), "OK", "CuPy or PyTorch read something else");
    peer.finish(); // the peer closed its mapping: the buffer may be freed now
    let mut host = vec![0i32; buf.len()];
    buf.copy_to_host(&mut host).unwrap();
    assert!(host.iter().all(|&v| v == 6), "PyTorch's write did not land");
}

#[test]
#[ignore = "requires a CUDA device"]
fn a_dead_python_exporter_is_a_clear_error() {
    let _dog = watchdog("dead_python", Duration::from_secs(120));
    let (peer, e) = torch_peer(4096, 1, "exit");
    peer.finish(); // exited: its memory is gone
    let ctx = gpu();
    // Named: refused before the driver is asked.
    // SAFETY: refused (nothing is mapped).
    match unsafe { ImportedBuffer::<i32>::open_raw(&ctx, &import_of(&e)) } {
        Err(Error::PeerGone {
            pid,
            role: PeerRole::Exporter,
        }) => assert_eq!(pid, e.pid),
        other => panic!(
            "expected PeerGone (exporter), got {:?}",
            other.map(|b| b.len())
        ),
    }
    // Not named: the driver's own error, at once (no hang: the watchdog bounds it).
    let t = std::time::Instant::now();
    let unnamed = RawImport::new(RawMemHandle::from_torch(&e.handle).unwrap(), e.offset, 16);
    // SAFETY: expected to fail; if the driver mapped something, the view drops at once.
    let r = unsafe { ImportedBuffer::<i32>::open_raw(&ctx, &unnamed) };
    eprintln!(
        "interop: unnamed dead exporter after {:?}: {:?}",
        t.elapsed(),
        r.as_ref().map(|b| b.len())
    );
    assert!(
        matches!(r, Err(Error::Cuda { .. })),
        "{:?}",
        r.map(|b| b.len())
    );
}

#[test]
#[ignore = "requires a CUDA device"]
fn opening_this_processs_own_raw_export_is_refused() {
    let ctx = gpu();
    let buf = IpcBuffer::<u32>::new(&ctx, 1024).unwrap();
    let e = buf.raw_export().unwrap();
    let import = RawImport::from_export::<u32>(&e).unwrap();
    // SAFETY: refused before the driver is asked.
    let r = unsafe { ImportedBuffer::<u32>::open_raw(&ctx, &import) };
    assert!(matches!(r, Err(Error::SameProcess { .. })));
}
