//! The tools: the client side of the wire ([`client`]), the events client library
//! ([`events`]), `pctl`, `prun`, `pevent`, `palloc` and `plaunch`
//! (the launch service for hosts without ssh). Each command's
//! `main` is called by the thin binary of the same name in `dvmlab-runtime`.

pub mod client;
pub mod events;
pub mod palloc;
pub mod pctl;
pub mod pevent;
pub mod plaunch;
pub mod prun;

/// Runs a tool's work on a current-thread runtime: exits with its code, or prints
/// `NAME: message` and exits with the code of its failure (3 if there is no runtime).
pub(crate) fn run_tool(
    name: &str,
    work: impl std::future::Future<Output = Result<u8, (u8, String)>>,
) -> std::process::ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: {e}");
            return std::process::ExitCode::from(3);
        }
    };
    match rt.block_on(work) {
        Ok(code) => std::process::ExitCode::from(code),
        Err((code, msg)) => {
            eprintln!("{name}: {msg}");
            std::process::ExitCode::from(code)
        }
    }
}
