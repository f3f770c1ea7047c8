//! `kt`: the command line of ktfs (see `cli`).

mod cli;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() {
    // Blocks are 4 MiB buffers allocated and freed on many threads (FUSE workers, tokio's
    // blocking pool); with an arena per thread, glibc keeps freed blocks in each and memory
    // grows with the thread count. Two arenas reuse them. (A low mmap threshold was tried and
    // measured: it bounds memory too but page-faults every block, halving throughput.) Fixed
    // thresholds above the block size keep freed blocks in the arenas: with glibc's sliding
    // ones, memory went back to the kernel and came back page by page (measured: 90,000 page
    // faults in a 1 GiB `kt get`, 11,000 with these).
    // SAFETY: mallopt only tunes the allocator.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
    let cli = cli::Cli::parse();
    let (daemon, verbose, json) = cli::mode(&cli.cmd);
    let default = if daemon || verbose { "info" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default)),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = cli::prepare(&cli.cmd).and_then(|()| cli::trust(&cli.tls)) {
        eprintln!("kt: {e:#}");
        std::process::exit(1);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kt: starting the runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(cli::run(cli.cmd, json));
    if code != 0 {
        std::process::exit(code);
    }
}
