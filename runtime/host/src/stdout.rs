//! Line output of the tools, which must not panic when their reader goes away.

use std::io::Write;

/// Writes one line to stdout. If the reader went away (`pctl jobs | head -1`), the tool ends
/// quietly with status 0, as a C tool killed by SIGPIPE would end its pipeline; Rust ignores
/// SIGPIPE, and `println!` would panic instead.
pub fn line(args: std::fmt::Arguments) {
    let mut out = std::io::stdout().lock();
    finish(out.write_fmt(args).and_then(|()| out.write_all(b"\n")));
}

/// Writes `data` to stdout as it is (output streamed from elsewhere), flushed; as [`line`].
pub fn bytes(data: &[u8]) {
    let mut out = std::io::stdout().lock();
    finish(out.write_all(data).and_then(|()| out.flush()));
}

fn finish(r: std::io::Result<()>) {
    if let Err(e) = r {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// `println!` for the tools: see [`line`].
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::stdout::line(format_args!($($arg)*))
    };
}
