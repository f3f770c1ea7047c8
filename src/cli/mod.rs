//! The `kt` command line: its arguments ([`args`]), the client commands ([`commands`]), the
//! daemons ([`daemons`], with the `daemons` feature) and what it prints and exits with
//! ([`output`]). It is the binary's own code: the library below it knows no command line.

mod args;
mod commands;
#[cfg(feature = "daemons")]
mod daemons;
mod output;

pub use args::{Cli, Cmd};

/// Whether a command is a daemon (logs at info), asked for `-v`, and asked for `--json`.
pub fn mode(cmd: &Cmd) -> (bool, bool, bool) {
    let client = |c: &args::Common| (false, c.verbose, c.json);
    match cmd {
        #[cfg(feature = "daemons")]
        Cmd::Server(_)
        | Cmd::Agent(_)
        | Cmd::Mount(_)
        | Cmd::Up(_)
        | Cmd::Keeper(_)
        | Cmd::GpuWorker(_) => (true, false, false),
        Cmd::Put(a) => client(&a.common),
        Cmd::Get(a) => client(&a.common),
        Cmd::Ls(a) => client(&a.common),
        Cmd::Rm(a) => client(&a.common),
        Cmd::Window(a) => client(&a.common),
        Cmd::Attach(a) => client(&a.common),
        Cmd::Detach(a) => client(&a.common),
        Cmd::Status(a) => client(&a.common),
        Cmd::NodeToken(_) => (false, false, false),
    }
}

/// What a command must do while the process is still single-threaded, before the runtime
/// starts: a GPU worker joins its caller's namespaces and drops its privileges.
/// What this process trusts, set before its first connection (so a bad CA file fails at once).
pub fn trust(a: &args::ClientTlsArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    let Some(ca) = &a.tls_ca else {
        return Ok(());
    };
    let tls = ktfs::auth::tls::ClientTls::from_ca_file(
        ca,
        a.tls_server_name.as_deref(),
        a.tls_node_name.as_deref(),
    )
    .with_context(|| format!("--tls-ca {}", ca.display()))?;
    ktfs::auth::tls::configure_client(Some(tls));
    Ok(())
}

/// A daemon may hold a descriptor per peer, per cached block file being served and per
/// caller: its soft limit on open files (often 1,024) goes up to the hard one.
#[cfg(feature = "daemons")]
fn raise_open_files() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write only `lim`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                tracing::debug!("could not raise the limit on open files");
            }
        }
    }
}

pub fn prepare(cmd: &Cmd) -> anyhow::Result<()> {
    match cmd {
        #[cfg(feature = "daemons")]
        Cmd::GpuWorker(a) => daemons::gpu_worker_prepare(a),
        #[cfg(feature = "daemons")]
        Cmd::Server(_) | Cmd::Agent(_) | Cmd::Mount(_) | Cmd::Up(_) | Cmd::Keeper(_) => {
            // What a daemon writes (blocks, staged files, its databases, its sockets) is its
            // own: other users' data sits in it. Its directories are 0700 as well.
            // SAFETY: umask has no preconditions.
            unsafe { libc::umask(0o077) };
            raise_open_files();
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Runs a command; returns its exit code (see [`output::EXIT_CODES_HELP`]).
pub async fn run(cmd: Cmd, json: bool) -> i32 {
    let result = match cmd {
        Cmd::Put(a) => commands::put(a).await,
        Cmd::Get(a) => commands::get(a).await,
        Cmd::Ls(a) => commands::ls(a).await,
        Cmd::Rm(a) => commands::rm(a).await,
        Cmd::Window(a) => commands::window(a).await,
        Cmd::Attach(a) => commands::attach(a).await,
        Cmd::Detach(a) => commands::detach(a).await,
        Cmd::Status(a) => commands::status(a).await,
        Cmd::NodeToken(a) => commands::node_token(a),
        #[cfg(feature = "daemons")]
        Cmd::Server(a) => daemons::server(a).await,
        #[cfg(feature = "daemons")]
        Cmd::Agent(a) => daemons::agent(a).await,
        #[cfg(feature = "daemons")]
        Cmd::Mount(a) => daemons::mount(a).await,
        #[cfg(feature = "daemons")]
        Cmd::Up(a) => daemons::up(a).await,
        #[cfg(feature = "daemons")]
        Cmd::Keeper(a) => daemons::keeper(a).await,
        #[cfg(feature = "daemons")]
        Cmd::GpuWorker(a) => daemons::gpu_worker(a).await,
    };
    match result {
        Ok(()) => 0,
        Err(e) => output::report_failure(&e, json),
    }
}
