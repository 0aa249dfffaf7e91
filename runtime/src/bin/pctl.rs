fn main() -> std::process::ExitCode {
    dvmlab_tools::pctl::main()
}
