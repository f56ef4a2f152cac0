//! The smallest cross-process program: this process writes numbers into GPU memory, a second
//! process maps the same memory, checks them and doubles them, and this one reads the result.
//! `cargo run --release --example hello_ipc`; exit 0 on success, 2 without a GPU, 1 on failure.

use std::io::{Read, Write};
use std::process::{Command, ExitCode, Stdio};

use cuda_ipc::{Error, GpuContext, ImportedBuffer, IpcBuffer, IpcMemHandle};

type Result = std::result::Result<(), Box<dyn std::error::Error>>;
const NUMBERS: std::ops::Range<u32> = 0..1024;

fn main() -> ExitCode {
    let arg = std::env::args().nth(1);
    if arg.as_deref().is_some_and(|a| a.starts_with('-')) {
        println!("usage: hello_ipc (no options: it runs its own second process)");
        return ExitCode::SUCCESS;
    }
    let ctx = match GpuContext::new(0) {
        Ok(ctx) => ctx,
        // No driver library, or no device: this machine cannot run it.
        Err(e @ (Error::DriverNotFound { .. } | Error::NoDevice { .. })) => {
            eprintln!("hello_ipc: waived: {e}");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("hello_ipc: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = arg.map_or_else(|| parent(&ctx), |_| child(&ctx)) {
        eprintln!("hello_ipc: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn parent(ctx: &GpuContext) -> Result {
    let buf = IpcBuffer::<u32>::new(ctx, NUMBERS.len())?;
    buf.copy_from_host(&NUMBERS.collect::<Vec<_>>())?;
    // A handle is plain bytes: send it any way you like (here, through the child's stdin).
    let mut command = Command::new(std::env::current_exe()?);
    let mut child = command.arg("child").stdin(Stdio::piped()).spawn()?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    stdin.write_all(buf.handle()?.as_bytes())?;
    let status = child.wait()?;
    let mut host = vec![0u32; buf.len()];
    buf.copy_to_host(&mut host)?;
    if !status.success() || host != NUMBERS.map(|x| 2 * x).collect::<Vec<_>>() {
        return Err(format!("the child ({status}) did not double the numbers").into());
    }
    println!("hello_ipc: another process read {NUMBERS:?} from our GPU memory and doubled it");
    Ok(())
}

fn child(ctx: &GpuContext) -> Result {
    let mut bytes = [0u8; IpcMemHandle::<u32>::SIZE];
    std::io::stdin().read_exact(&mut bytes)?;
    let buf = ImportedBuffer::open(ctx, &IpcMemHandle::<u32>::from_bytes(&bytes)?)?;
    let mut host = vec![0u32; buf.len()];
    buf.copy_to_host(&mut host)?;
    if host != NUMBERS.collect::<Vec<_>>() {
        return Err("the child read the wrong numbers".into());
    }
    buf.copy_from_host(&host.iter().map(|x| 2 * x).collect::<Vec<_>>())?;
    Ok(())
}
