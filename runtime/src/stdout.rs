//! Line output of the tools, which must not panic when their reader goes away.

use std::io::Write;

/// Writes one line to stdout. If the reader went away (`pctl jobs | head -1`), the tool ends
/// quietly with status 0, as a C tool killed by SIGPIPE would end its pipeline; Rust ignores
/// SIGPIPE, and `println!` would panic instead.
pub fn line(args: std::fmt::Arguments) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
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
