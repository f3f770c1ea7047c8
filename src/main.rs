use clap::Parser;
use ktfs::cli::{self, Cli, Cmd};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() {
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
    let cli = Cli::parse();
    let (daemon, verbose) = match &cli.cmd {
        Cmd::Server(_) | Cmd::Agent(_) | Cmd::Mount(_) | Cmd::Up(_) | Cmd::Keeper(_) => {
            (true, false)
        }
        Cmd::Put(a) => (false, a.common.verbose),
        Cmd::Get(a) => (false, a.common.verbose),
        Cmd::Ls(a) => (false, a.common.verbose),
        Cmd::Rm(a) => (false, a.common.verbose),
        Cmd::Window(a) => (false, a.common.verbose),
        Cmd::Attach(a) => (false, a.common.verbose),
        Cmd::Detach(a) => (false, a.common.verbose),
    };
    let default = if daemon || verbose { "info" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default)),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.cmd {
        Cmd::Put(a) => cli::put(a).await,
        Cmd::Get(a) => cli::get(a).await,
        Cmd::Ls(a) => cli::ls(a).await,
        Cmd::Rm(a) => cli::rm(a).await,
        Cmd::Server(a) => cli::server(a).await,
        Cmd::Agent(a) => cli::agent(a).await,
        Cmd::Mount(a) => cli::mount(a).await,
        Cmd::Up(a) => cli::up(a).await,
        Cmd::Window(a) => cli::window(a).await,
        Cmd::Attach(a) => cli::attach(a).await,
        Cmd::Detach(a) => cli::detach(a).await,
        Cmd::Keeper(a) => cli::keeper(a).await,
    };
    if let Err(e) = result {
        let msg = format!("{e:#}").replace('\n', " ");
        eprintln!("kt: error: {msg}");
        std::process::exit(1);
    }
}
