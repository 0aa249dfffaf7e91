fn main() -> std::process::ExitCode {
    dvmlab_tools::prun::main()
}
