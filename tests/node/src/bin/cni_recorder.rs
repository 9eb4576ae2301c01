//! A CNI IPAM plugin in front of the node's `thereabouts` that records every
//! call for the history checker (tests/e2e/src/history.rs): what was asked,
//! when it started and ended, what it answered. A network opts in with
//! `"ipam": {"type": "thereabouts-recorded", ...}` (the node tests'
//! `Installed::nad_recorded`); the recorder passes the call on with the
//! `ipam.type` the plugin expects, and its answer back unchanged.
//!
//! Each call is one JSON line appended to `<this binary>.history.jsonl` with one
//! write (O_APPEND: concurrent calls never interleave their lines).

use std::io::{Read, Write};
use std::process::{Command, ExitCode, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default()
}

fn main() -> ExitCode {
    let start = now_ns();
    let mut stdin = Vec::new();
    if std::io::stdin().read_to_end(&mut stdin).is_err() {
        return ExitCode::from(1);
    }
    let Ok(exe) = std::env::current_exe() else { return ExitCode::from(1) };
    let plugin = exe.with_file_name("thereabouts");
    // The plugin refuses an ipam type other than its own: the recorder's name goes.
    let mut config: Value = serde_json::from_slice(&stdin).unwrap_or(Value::Null);
    if let Some(ipam) = config.get_mut("ipam").and_then(Value::as_object_mut) {
        ipam.insert("type".into(), json!("thereabouts"));
    }
    let forwarded = if config.is_null() { stdin } else { config.to_string().into_bytes() };
    let child = Command::new(&plugin).args(std::env::args_os().skip(1)).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn();
    let Ok(mut child) = child else { return ExitCode::from(1) };
    if let Some(mut input) = child.stdin.take() {
        let _ = input.write_all(&forwarded);
    }
    let Ok(output) = child.wait_with_output() else { return ExitCode::from(1) };
    let end = now_ns();
    let env = |key: &str| std::env::var(key).unwrap_or_default();
    let record = json!({
        "command": env("CNI_COMMAND"),
        "container_id": env("CNI_CONTAINERID"),
        "ifname": env("CNI_IFNAME"),
        "args": env("CNI_ARGS"),
        "network": config.get("name").cloned().unwrap_or(Value::Null),
        "start_ns": start.to_string(),
        "end_ns": end.to_string(),
        "code": output.status.code(),
        "stdout": String::from_utf8_lossy(&output.stdout),
    });
    let history = exe.with_extension("history.jsonl");
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(&history) {
        let _ = file.write_all(format!("{record}\n").as_bytes());
    }
    let _ = std::io::stdout().write_all(&output.stdout);
    ExitCode::from(output.status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1))
}
