//! The conformance suite's test binary (libtest-compatible: filters, `--list`, `--exact`,
//! `--skip`, `--ignored`, and nextest all work). See `conformance/README.md`.

fn main() -> std::process::ExitCode {
    conformance::runner::main()
}
