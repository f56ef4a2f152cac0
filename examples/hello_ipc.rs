//! The smallest cross-process program: this process writes numbers into GPU memory, a second
//! process maps the same memory, checks them and doubles them, and this one reads the result.
//! `cargo run --release --example hello_ipc`; exit 0 on success, 2 without a GPU, 1 on failure.

use std::process::{Command, ExitCode};

use cuda_ipc::{GpuContext, ImportedBuffer, IpcBuffer, IpcMemHandle};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;
const NUMBERS: std::ops::Range<u32> = 0..1024;

fn main() -> ExitCode {
    let outcome = match std::env::args().nth(1) {
        Some(arg) => child(&arg),
        None => match GpuContext::new(0) {
            Ok(ctx) => parent(&ctx),
            Err(e) => {
                println!("hello_ipc: no CUDA device ({e}): waived");
                return ExitCode::from(2);
            }
        },
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hello_ipc: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parent(ctx: &GpuContext) -> Result {
    let buf = IpcBuffer::<u32>::new(ctx, NUMBERS.len())?;
    buf.copy_from_host(&NUMBERS.collect::<Vec<_>>())?;
    // A handle is plain bytes: send it any way you like (here, as a command-line argument).
    let hex: String = buf
        .handle()?
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let status = Command::new(std::env::current_exe()?).arg(hex).status()?;
    let mut host = vec![0u32; buf.len()];
    buf.copy_to_host(&mut host)?;
    if !status.success() || host != NUMBERS.map(|x| 2 * x).collect::<Vec<_>>() {
        return Err(format!("the child ({status}) did not double the numbers").into());
    }
    println!("hello_ipc: another process read {NUMBERS:?} from our GPU memory and doubled it");
    Ok(())
}

fn child(hex: &str) -> Result {
    if hex.starts_with('-') {
        println!("usage: hello_ipc (no options)"); // --help
        return Ok(());
    }
    let bytes = (hex.as_bytes().chunks(2))
        .map(|pair| Ok(u8::from_str_radix(std::str::from_utf8(pair)?, 16)?))
        .collect::<Result<Vec<u8>>>()?;
    let ctx = GpuContext::new(0)?;
    let buf = ImportedBuffer::open(&ctx, &IpcMemHandle::<u32>::from_bytes(&bytes)?)?;
    let mut host = vec![0u32; buf.len()];
    buf.copy_to_host(&mut host)?;
    if host != NUMBERS.collect::<Vec<_>>() {
        return Err("the child read the wrong numbers".into());
    }
    buf.copy_from_host(&host.iter().map(|x| 2 * x).collect::<Vec<_>>())?;
    Ok(())
}
