//! What this machine allows for sharing GPU memory between processes, and what to do about
//! each "no": `cuda_ipc::probe::probe()` printed for people, or as JSON.
//!
//! ```text
//! cargo run --release --example doctor [-- --json]
//! ```
//!
//! Exit status: 0 when legacy IPC works on at least one device, 1 when it works on none (or
//! there is no driver or device), 2 for a bad argument.

use std::process::ExitCode;

use cuda_ipc::probe::Status;

fn main() -> ExitCode {
    let json = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--json") => true,
        Some("--help" | "-h") => {
            println!(
                "doctor: what this machine allows for sharing GPU memory between processes\n\n\
                 usage: doctor [--json]\n\
                 \x20 --json   the report as JSON (`cuda_ipc::probe::Probe::to_json`)\n\n\
                 exit status: 0 when legacy IPC works on a device, 1 when on none, 2 for a bad \
                 argument"
            );
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprintln!("doctor: unknown argument {other:?} (usage: doctor [--json])");
            return ExitCode::from(2);
        }
    };
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
