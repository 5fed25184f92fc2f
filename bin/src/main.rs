fn main() -> std::process::ExitCode {
    ssl::cli::main()
}
