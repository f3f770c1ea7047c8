//! `mount.kt SERVER MOUNTPOINT [-sfnv] [-o OPTIONS]`, as mount(8) runs it (see README.md).

use std::process::ExitCode;
use std::time::Duration;

use mount_helper::invocation::USAGE;
use mount_helper::spawn::{self, DEFAULT_TIMEOUT};
use mount_helper::{parse_args, Invocation};

/// mount(8)'s exit codes.
const EX_USAGE: u8 = 1;
const EX_FAIL: u8 = 32;

fn main() -> ExitCode {
    let inv = match parse_args(std::env::args().skip(1)) {
        Ok(inv) if inv.help => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(inv) => inv,
        Err(e) => {
            eprintln!("mount.kt: {e}\n{USAGE}");
            return ExitCode::from(EX_USAGE);
        }
    };
    match run(&inv) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mount.kt: {e:#}");
            ExitCode::from(EX_FAIL)
        }
    }
}

fn run(inv: &Invocation) -> anyhow::Result<()> {
    let kt = spawn::find_kt(inv);
    let args = inv.kt_args();
    let log = inv.log_path();
    if inv.verbose || inv.fake {
        let shown: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        eprintln!(
            "mount.kt: {} {} >> {}",
            kt.display(),
            shown.join(" "),
            log.display()
        );
        if !inv.options.ignored.is_empty() {
            eprintln!(
                "mount.kt: ignored options: {}",
                inv.options.ignored.join(",")
            );
        }
    }
    if inv.fake {
        return Ok(());
    }
    let timeout = inv
        .options
        .timeout_secs
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT);
    let m = spawn::mount(&kt, &args, &inv.mountpoint, &log, timeout)?;
    if inv.verbose {
        eprintln!(
            "mount.kt: {} mounted at {} (kt pid {}, log {})",
            inv.server,
            m.mountpoint.display(),
            m.pid,
            m.log.display()
        );
    }
    Ok(())
}
