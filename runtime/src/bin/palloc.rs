fn main() -> std::process::ExitCode {
    dvmlab_tools::palloc::main()
}
