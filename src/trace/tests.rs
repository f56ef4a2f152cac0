//! What the tracing points say, caught by a subscriber of this thread: each export, retire,
//! quarantine and reap of a ledger, each wait (what, how long, how it ended, a cancelled one
//! included), each peer death seen, and a scope (an open's span) with the events inside it.

#![allow(clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

use std::sync::Arc;
use std::time::Duration;

use super::Waiting;
use super::catch::{Catch, Caught};
use crate::error::{Error, PeerRole};
use crate::ledger::testing::Importer;
use crate::ledger::{Label, Ledger};
use crate::poll::Backoff;

/// What `f` traced, in order.
fn catch(f: impl FnOnce()) -> Vec<Caught> {
    let catch = Catch::default();
    tracing::subscriber::with_default(catch.clone(), f);
    catch.take()
}

fn events<'a>(caught: &'a [Caught], message: &str) -> Vec<&'a Caught> {
    caught
        .iter()
        .filter(|c| !c.span && c.name == message)
        .collect()
}

fn token() -> [u8; 16] {
    let mut token = [7u8; 16];
    token[..8].copy_from_slice(&crate::os::random_u64().unwrap().to_le_bytes());
    token
}

#[test]
fn a_ledger_says_each_export_retire_quarantine_and_reap() {
    let token = token();
    let ledger = Ledger::create(&token, 1 << 20, 8).unwrap();
    let importer = Importer::open(&token, 1 << 20).unwrap();
    let label = Label::new(
        crate::ledger::ExportKind::Arena,
        &[0x4a, 0x3b, 0, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        true,
    );
    let caught = catch(|| {
        let a = ledger.alloc(4096, label).unwrap();
        let b = ledger.alloc(512, label).unwrap();
        assert!(
            importer
                .enter_pausing(a.index, a.generation, || {})
                .is_some()
        );
        assert!(ledger.free(a), "held by the importer");
        assert!(!ledger.free(b));
        importer.leave(a.index);
        assert_eq!(ledger.collect(), 0);
    });
    let published = events(&caught, "export published");
    assert_eq!(published.len(), 2, "{caught:#?}");
    let first = published[0];
    assert_eq!(
        (
            first.field("kind"),
            first.field("device"),
            first.field("read_only"),
            first.field("bytes"),
            first.field("generation")
        ),
        ("arena", "GPU-4a3b00ff", "true", "4096", "1"),
        "{first:#?}"
    );
    // As one line (what `tests/tracing.rs`'s child reports to its parent).
    let line = first.to_string();
    assert!(
        line.starts_with("event export published ") && line.contains(" bytes=4096"),
        "{line}"
    );
    let retired = events(&caught, "export retired");
    let held: Vec<&str> = retired.iter().map(|c| c.field("held")).collect();
    assert_eq!(held, ["true", "false"], "{caught:#?}");
    let over = events(&caught, "quarantine over: the block's importers are gone");
    assert_eq!(over.len(), 1, "{caught:#?}");
    assert_eq!(over[0].field("bytes"), "4096");
}

#[test]
fn a_full_table_says_the_export_was_refused() {
    let ledger = Ledger::create(&token(), 1 << 12, 1).unwrap();
    let caught = catch(|| {
        let _kept = ledger.alloc(256, Label::FOR_TESTS).unwrap();
        assert!(ledger.alloc(256, Label::FOR_TESTS).is_err());
    });
    let refused = events(&caught, "export refused: the table is full");
    assert_eq!(refused.len(), 1, "{caught:#?}");
    assert_eq!(refused[0].field("buffers"), "1");
}

#[test]
fn an_importers_last_view_says_the_import_closed() {
    let table = crate::ledger::BlockTable::create(&token(), 0).unwrap();
    table.blocks[3].publish(5, 0, 64, Label::FOR_TESTS);
    let holdings = crate::ledger::Holdings::<u32>::new(Arc::new(table), 1);
    let caught = catch(|| {
        match holdings.enter(3, 5, || {}) {
            Ok(crate::ledger::Holding::Entered(first)) => first.fill(1),
            _ => panic!("a first view enters"),
        }
        holdings.leave(3, |_| true);
    });
    let closed = events(&caught, "import closed: its last view let go");
    assert_eq!(closed.len(), 1, "{caught:#?}");
    assert_eq!(
        (
            closed[0].field("block"),
            closed[0].field("generation"),
            closed[0].field("unmapped")
        ),
        ("3", "5", "true")
    );
}

#[test]
fn a_wait_says_what_it_waited_for_how_long_and_how_it_ended() {
    let caught = catch(|| {
        let timed_out =
            Backoff::for_importers(Duration::from_millis(5)).until_unheld(|| false, || vec![7]);
        assert!(matches!(timed_out, Err(Error::LeasesOutstanding { .. })));
        Backoff::for_importers(Duration::from_secs(5))
            .until_unheld(|| true, Vec::new)
            .unwrap();
        drop(Waiting::start("a future dropped while pending"));
        let gone: crate::Result<()> = Waiting::start("a peer").end(Err(Error::peer_gone(
            4_000_000,
            PeerRole::Importer("signal"),
        )));
        assert!(gone.is_err());
    });
    let spans: Vec<&str> = caught
        .iter()
        .filter(|c| c.span && c.name == "wait")
        .map(|c| c.field("what"))
        .collect();
    assert_eq!(
        spans,
        [
            "importers to let go of an export",
            "importers to let go of an export",
            "a future dropped while pending",
            "a peer"
        ]
    );
    let ended = events(&caught, "wait ended");
    let how: Vec<(&str, &str)> = ended
        .iter()
        .map(|c| (c.within.as_deref().unwrap_or(""), c.field("ended")))
        .collect();
    assert_eq!(
        how,
        [
            ("wait", "error"),
            ("wait", "done"),
            ("wait", "cancelled"),
            ("wait", "peer_gone")
        ],
        "{caught:#?}"
    );
    // The 5 ms deadline runs from the back-off's making, a moment before the wait's span.
    let waited: u64 = ended[0].field("waited_us").parse().unwrap();
    assert!(
        (4_000..5_000_000).contains(&waited),
        "the timed-out wait took {waited} µs"
    );
    let gone = events(&caught, "peer gone");
    assert_eq!(gone.len(), 1, "{caught:#?}");
    assert_eq!(gone[0].field("pid"), "4000000");
    assert!(gone[0].field("role").contains("signal"), "{:?}", gone[0]);
}

#[test]
fn a_dead_exporter_seen_is_a_peer_gone_event() {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    let dead = crate::ProcessIdentity::from_parts(child.id(), 1);
    let caught = catch(|| {
        let seen = crate::process::check_exporter_alive(&dead, false);
        assert!(matches!(seen, Err(Error::PeerGone { .. })), "{seen:?}");
    });
    let gone = events(&caught, "peer gone");
    assert_eq!(gone.len(), 1, "{caught:#?}");
    assert_eq!(gone[0].field("pid"), child.id().to_string());
    assert_eq!(gone[0].field("role"), "Exporter");
}

#[test]
fn a_scope_is_a_span_the_events_inside_it_nest_under() {
    let open = |bytes: u64| {
        let _open = super::scope!("open", kind = "legacy", bytes);
        super::event!("import cache hit");
    };
    let caught = catch(|| open(64));
    let spans: Vec<(&str, &str)> = caught
        .iter()
        .filter(|c| c.span)
        .map(|c| (c.name.as_str(), c.field("bytes")))
        .collect();
    assert_eq!(spans, [("open", "64")], "{caught:#?}");
    let hits = events(&caught, "import cache hit");
    assert_eq!(hits.len(), 1, "{caught:#?}");
    assert_eq!(hits[0].within.as_deref(), Some("open"));
    // After the scope's end, an event is in no span.
    let after = catch(|| {
        open(1);
        super::event!("after");
    });
    assert_eq!(events(&after, "after")[0].within, None, "{after:#?}");
}
