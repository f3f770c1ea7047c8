//! One runtime for every async target, built once: a runtime a run would take milliseconds,
//! and libFuzzer runs a body thousands of times a second.

use std::sync::OnceLock;

pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// A listener on a loopback address of this project's range, kept for the whole process.
pub fn listener(ip: &str) -> tokio::net::TcpListener {
    let _guard = runtime().enter();
    let l = std::net::TcpListener::bind(format!("{ip}:0")).expect("a loopback listener");
    l.set_nonblocking(true).expect("a non-blocking listener");
    tokio::net::TcpListener::from_std(l).expect("a tokio listener")
}
