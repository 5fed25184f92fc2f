use ssl_plugin_objective as _;
fn main() -> std::process::ExitCode {
    ssl::cli::main()
}
