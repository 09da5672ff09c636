//! The `idemhook` binary: everything lives in the library; see `cli`.

fn main() -> std::process::ExitCode {
    idemhook::cli::main()
}
