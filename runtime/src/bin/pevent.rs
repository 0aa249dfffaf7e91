fn main() -> std::process::ExitCode {
    dvmlab_tools::pevent::main()
}
