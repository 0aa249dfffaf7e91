fn main() -> std::process::ExitCode {
    dvmlab_prted::cli::main()
}
