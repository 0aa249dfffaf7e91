fn main() -> std::process::ExitCode {
    dvmlab_tools::plaunch::main()
}
