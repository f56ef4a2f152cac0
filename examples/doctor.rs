//! What this machine allows for sharing GPU memory between processes, and what to do about
//! each "no" (`cuda_ipc::probe::probe()`); with `--live`, who holds what right now
//! (`cuda_ipc::inspect::snapshot()`: exporters, their exports and importers, deferred frees,
//! channels, stale names). Each printed for people, or as JSON.
//!
//! ```text
//! cargo run --release --example doctor [-- --json]
//! cargo run --release --example doctor -- --live [--json] [--watch [SECONDS]]
//! ```
//!
//! Exit status: 0 when legacy IPC works on at least one device (with `--live`: when the
//! snapshot was read), 1 when it works on none, there is no driver or device (with `--live`:
//! `/dev/shm` could not be listed), 2 for a bad argument.

use std::process::ExitCode;
use std::time::Duration;

use cuda_ipc::probe::Status;

const USAGE: &str = "usage: doctor [--json] | doctor --live [--json] [--watch [SECONDS]]";

/// What the command line asks for.
struct Args {
    live: bool,
    json: bool,
    /// Refresh every this long (`--watch`), until interrupted.
    watch: Option<Duration>,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut a = Args {
        live: false,
        json: false,
        watch: None,
    };
    let mut pending: Option<String> = args.next();
    while let Some(arg) = pending.take() {
        match arg.as_str() {
            "--json" => a.json = true,
            "--live" => a.live = true,
            "--watch" => {
                let next = args.next();
                let secs = match next.as_deref().map(str::parse::<f64>) {
                    Some(Ok(s)) if s > 0.0 && s <= 3600.0 => s,
                    Some(Ok(_)) => return Err("--watch takes 0 < SECONDS <= 3600".to_owned()),
                    Some(Err(_)) => {
                        pending = next;
                        2.0
                    }
                    None => 2.0,
                };
                a.watch = Some(Duration::from_secs_f64(secs));
                if pending.is_some() {
                    continue;
                }
            }
            "--help" | "-h" => return Ok(None),
            other => return Err(format!("unknown argument {other:?}")),
        }
        pending = args.next();
    }
    if a.watch.is_some() && !a.live {
        return Err("--watch needs --live".to_owned());
    }
    Ok(Some(a))
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!(
                "doctor: what this machine allows for sharing GPU memory between processes, \
                 and (--live) who holds what now\n\n{USAGE}\n\
                 \x20 --json            as JSON (`Probe::to_json`, `Snapshot::to_json`)\n\
                 \x20 --live            this user's exports, importers, deferred frees, channels\n\
                 \x20 --watch [SECONDS] with --live: refresh every SECONDS (2), until interrupted, \
                 saying how long each channel has made no progress\n\n\
                 exit status: 0 when legacy IPC works on a device (--live: the snapshot was \
                 read), 1 when on none (--live: /dev/shm unreadable), 2 for a bad argument"
            );
            return ExitCode::SUCCESS;
        }
        Err(why) => {
            eprintln!("doctor: {why} ({USAGE})");
            return ExitCode::from(2);
        }
    };
    if args.live {
        live(&args)
    } else {
        probe(args.json)
    }
}

/// The snapshot, once or every `--watch` period (then with each channel's time without
/// progress).
fn live(args: &Args) -> ExitCode {
    let mut watch = cuda_ipc::inspect::Watch::new();
    loop {
        let snap = if args.watch.is_some() {
            watch.snapshot()
        } else {
            cuda_ipc::inspect::snapshot()
        };
        let snap = match snap {
            Ok(snap) => snap,
            Err(e) => {
                eprintln!("doctor: {e}");
                return ExitCode::from(1);
            }
        };
        if args.json {
            println!("{}", snap.to_json());
        } else {
            if args.watch.is_some() {
                print!("\x1b[2J\x1b[H"); // clear the terminal, cursor home
            }
            print!("{snap}");
        }
        match args.watch {
            Some(period) => std::thread::sleep(period),
            None => return ExitCode::SUCCESS,
        }
    }
}

fn probe(json: bool) -> ExitCode {
    let report = cuda_ipc::probe::probe();
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{report}");
        let problems = report.problems().count();
        println!(
            "{problems} check(s) said no{}",
            if problems > 0 {
                " (see `breaks` and `do` above)"
            } else {
                ""
            }
        );
    }
    let usable = report
        .checks()
        .iter()
        .any(|c| c.key == "legacy_ipc" && c.status == Status::Yes);
    if usable {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Result<Option<Args>, String> {
        parse(line.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn the_command_line_is_read_or_refused() {
        let a = args("--live --json --watch 0.5").unwrap().unwrap();
        assert!(a.live && a.json && a.watch == Some(Duration::from_millis(500)));
        let a = args("--live --watch --json").unwrap().unwrap();
        assert!(a.json && a.watch == Some(Duration::from_secs(2)));
        let a = args("--watch --live").unwrap().unwrap();
        assert!(a.live && a.watch == Some(Duration::from_secs(2)));
        assert!(args("").unwrap().is_some_and(|a| !a.live && !a.json));
        assert!(args("--help").unwrap().is_none());
        for bad in [
            "--watch",
            "--live --watch 0",
            "--live --watch -1",
            "--live --frob",
        ] {
            assert!(args(bad).is_err(), "{bad}");
        }
    }
}
