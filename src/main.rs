/// mimalloc instead of glibc's allocator: a burst's release allocates and
/// frees a few buffers per task on several threads, and glibc spent about a
/// fifth of the service's CPU there (BENCHMARKS.md, "Scale").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    delayline::cli::main()
}
