fn main() -> std::process::ExitCode {
    delayline::cli::main()
}
