//! Dead importers never lock the next one out of an export registry, even when the exporter
//! sits idle: 64 importer processes (as many as the registry has slots) enter one export and
//! are killed holding it; a 65th importer must get in without the exporter calling anything.
//! Once it got `TooManyImporters`: dead importers' slots were reaped only by the
//! exporter's collect, which an idle exporter never runs. Its own test binary: the registry is
//! one per process, and no other test may take its slots.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use std::time::Duration;

use common::{die, exited_or_killed, from_hex, report, spawn, to_hex, watchdog};
use cuda_ipc::__private::registry::{Export, enter_pausing};
use cuda_ipc::ProcessIdentity;

const SLOTS: usize = cuda_ipc::IpcBuffer::<u8>::MAX_IMPORTERS;

#[test]
fn child_process() {
    common::child_main(|role, args| {
        let token: [u8; 16] = from_hex(&args[0]).try_into().unwrap();
        let generation: u64 = args[1].parse().unwrap();
        let exporter =
            ProcessIdentity::from_parts(args[2].parse().unwrap(), args[3].parse().unwrap());
        let held = enter_pausing(&token, generation, exporter, || {});
        match role {
            "enter_and_die" => {
                let _held = held.unwrap(); // held (with its lease) until the kill
                die();
            }
            "enter" => {
                match held {
                    Ok(h) => report(format!("entered, live {}", h.is_live())),
                    Err(e) => report(format!("refused: {e}")),
                }
                0
            }
            other => panic!("unknown role {other}"),
        }
    });
}

#[test]
fn sixty_four_dead_importers_do_not_lock_out_the_next_while_the_exporter_is_idle() {
    let _dog = watchdog("registry reap", Duration::from_secs(120));
    let export = Export::publish().unwrap();
    let me = ProcessIdentity::current();
    let token = to_hex(&export.token());
    let generation = export.generation().to_string();
    let (pid, start) = (me.pid().to_string(), me.start_time().to_string());
    let args = [token.as_str(), &generation, &pid, &start];
    for k in 0..SLOTS {
        let (status, _) = spawn("enter_and_die", &args).wait(Duration::from_secs(30));
        assert!(
            exited_or_killed(status) && status.code().is_none(),
            "importer {k} did not die holding its slot: {status}"
        );
    }
    // No collect, no new export, no close: the exporter does nothing from here on.
    let got = spawn("enter", &args).expect_success(Duration::from_secs(30));
    assert_eq!(got, vec!["entered, live true"], "the 65th importer");
    let got = spawn("enter", &args).expect_success(Duration::from_secs(30));
    assert_eq!(
        got,
        vec!["entered, live true"],
        "and the 66th (a slot given back)"
    );
    drop(export);
}
