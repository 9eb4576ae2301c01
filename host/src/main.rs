//! `thereabouts` (also installed as `whereabouts`; the name it runs under does not
//! matter): a CNI IPAM plugin when `CNI_COMMAND` is set, a small CLI otherwise.

use clap::Parser;

/// See host/Cargo.toml: musl's allocator returns memory to the kernel eagerly.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

fn main() -> std::process::ExitCode {
    if std::env::var_os("CNI_COMMAND").is_some() {
        let status = thereabouts::cni::run();
        return std::process::ExitCode::from(u8::try_from(status).unwrap_or(1));
    }
    let cli = thereabouts::cli::Cli::parse();
    match thereabouts::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", thereabouts::causes::describe(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
