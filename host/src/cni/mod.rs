//! CNI mode: what the binary does when a runtime runs it as a plugin (whenever
//! `CNI_COMMAND` is set). stdout carries exactly one result or error document;
//! logs go to stderr or the configured `log_file`.

pub mod claims;
pub mod commands;
pub mod env;
pub mod error;
pub mod result;

use std::io::{IsTerminal, Read, Write};

use error::{CniError, code};

/// Runs one CNI call and returns the process exit status.
pub fn run() -> i32 {
    let env = match env::from_lookup(|name| std::env::var(name).ok()) {
        Ok(env) => env,
        Err(e) => return fail(&e, None),
    };
    let stdin = match read_stdin(env.command) {
        Ok(text) => text,
        Err(e) => return fail(&e, None),
    };
    match commands::execute(&env, &stdin) {
        Ok(output) => {
            if let Some(text) = output {
                let mut out = std::io::stdout().lock();
                if out.write_all(text.as_bytes()).and_then(|()| out.flush()).is_err() {
                    crate::logging::error(format!("{}: could not write the result to stdout", env.command));
                    return 1;
                }
            }
            0
        }
        Err(e) => {
            crate::logging::error(format!("{} container={} ifname={}: [code {}] {}", env.command, env.container_id, env.ifname, e.code, e.msg));
            fail(&e, commands::cni_version_of(&stdin).as_deref())
        }
    }
}

/// VERSION must work without stdin (and must not hang on a terminal); every
/// other command needs the network config.
fn read_stdin(command: env::Command) -> Result<String, CniError> {
    let mut stdin = std::io::stdin();
    if command == env::Command::Version && stdin.is_terminal() {
        return Ok(String::new());
    }
    let mut text = String::new();
    match stdin.read_to_string(&mut text) {
        Ok(_) => Ok(text),
        Err(_) if command == env::Command::Version => Ok(String::new()),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => Err(CniError::new(code::DECODE, "network config on stdin is not UTF-8")),
        Err(e) => Err(CniError::new(code::IO_FAILURE, format!("error reading from stdin: {e}"))),
    }
}

fn fail(e: &CniError, cni_version: Option<&str>) -> i32 {
    let _ = std::io::stdout().lock().write_all(e.to_json(cni_version).as_bytes());
    1
}
