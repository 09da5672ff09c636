//! The `idemhook` binary: everything lives in the library; see `cli`.

// Many threads each allocating a request's buffers: glibc's allocator
// spent ~15% of the CPU of a loaded server (benchmark profile); mimalloc's
// thread-local heaps make that a few percent.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    idemhook::cli::main()
}
