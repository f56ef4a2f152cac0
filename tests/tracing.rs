//! The `tracing` feature on a GPU, across two processes: the exporter's trace says the export
//! (kind, device, bytes), its retire while held, the deferred free and its completion; the
//! importer's says each open (a span with what the handle names) with its import-cache miss,
//! then hit, and the close of its last view.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{spawn, unique_name, wait_for, watchdog};
use cuda_ipc::__private::trace::Catch;
use cuda_ipc::shm::{ShmCell, ShmOptions, ShmRegion};
use cuda_ipc::{ImportedBuffer, IpcBuffer, IpcMemHandle, ShmSafe};

const BYTES: usize = 1 << 20;

#[derive(ShmSafe)]
#[repr(C)]
struct Shared {
    handle: ShmCell<IpcMemHandle<u8>>,
    /// 1: the importer holds its views; 2: the exporter dropped the buffer (let go now).
    step: AtomicU32,
}

/// What `catch` caught since its last take, one line each (`Caught`'s text: `span NAME k=v
/// ...` or `event MESSAGE k=v ... in SPAN`).
fn lines(catch: &Catch) -> Vec<String> {
    catch.take().iter().map(ToString::to_string).collect()
}

/// The index of the first line at or after `from` that starts with `start` and contains every
/// one of `parts`.
fn find(lines: &[String], from: usize, start: &str, parts: &[&str]) -> usize {
    lines
        .iter()
        .enumerate()
        .skip(from)
        .find(|(_, l)| l.starts_with(start) && parts.iter().all(|p| l.contains(p)))
        .map(|(i, _)| i)
        .unwrap_or_else(|| {
            panic!(
                "no {start:?} with {parts:?} from line {from} in\n{}",
                lines.join("\n")
            )
        })
}

#[test]
fn child_process() {
    common::child_main(|role, args| {
        assert_eq!(role, "importer");
        let catch = Catch::default();
        tracing::subscriber::set_global_default(catch.clone()).unwrap();
        let s = ShmOptions::new(&args[0]).open::<Shared>().unwrap();
        let ctx = common::gpu();
        let handle = s.handle.load();
        let first = ImportedBuffer::open(&ctx, &handle).unwrap();
        let second = ImportedBuffer::open(&ctx, &handle).unwrap();
        s.step.store(1, Ordering::Release);
        while s.step.load(Ordering::Acquire) != 2 {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop((first, second));
        for line in lines(&catch) {
            common::report(line);
        }
        0
    });
}

#[test]
#[ignore = "requires a CUDA device"]
fn an_export_its_opens_and_its_deferred_free_are_traced_on_both_sides() {
    let _dog = watchdog("tracing on a GPU", Duration::from_secs(120));
    let ctx = common::gpu();
    let shared: ShmRegion<Shared> = ShmOptions::new(unique_name("tracing")).create().unwrap();
    let catch = Catch::default();
    let (buf, handle) = tracing::subscriber::with_default(catch.clone(), || {
        let buf = IpcBuffer::<u8>::zeroed(&ctx, BYTES).unwrap();
        let handle = buf.handle().unwrap();
        (buf, handle)
    });
    shared.handle.store(handle);
    let importer = spawn("importer", &[shared.name()]);
    wait_for("the importer's views", Duration::from_secs(60), || {
        shared.step.load(Ordering::Acquire) == 1
    });
    tracing::subscriber::with_default(catch.clone(), || {
        drop(buf); // held by the importer: retired, the free deferred
        shared.step.store(2, Ordering::Release);
        let theirs = importer.expect_success(Duration::from_secs(60));
        let uuid = handle.device_uuid();
        let device = format!(
            "GPU-{:02x}{:02x}{:02x}{:02x}",
            uuid[0], uuid[1], uuid[2], uuid[3]
        );
        let me = std::process::id().to_string();
        let bytes = format!("bytes={BYTES}");

        // The importer: two opens (a miss, then a hit) and the close of its last view.
        let open = find(
            &theirs,
            0,
            "span open",
            &[&format!("exporter={me}"), &bytes],
        );
        let miss = find(&theirs, open, "event import cache miss", &["in open"]);
        let again = find(&theirs, miss, "span open", &[&format!("exporter={me}")]);
        find(&theirs, again, "event import cache hit", &["in open"]);
        find(&theirs, again, "event import closed", &["unmapped=true"]);

        // The exporter: the export, its retire while held, and, once the importer let go, the
        // deferred free done by a collect.
        assert_eq!(cuda_ipc::collect_deferred().pending, 0);
        let ours = lines(&catch);
        let published = find(&ours, 0, "event export published", &[&device, &bytes]);
        let retired = find(&ours, published, "event export retired", &["held=true"]);
        find(&ours, retired, "event free deferred", &[&bytes]);
        find(
            &ours,
            retired,
            "event deferred free done",
            &[&bytes, "freed=true"],
        );
        eprintln!(
            "exporter:\n{}\nimporter:\n{}",
            ours.join("\n"),
            theirs.join("\n")
        );
    });
}
