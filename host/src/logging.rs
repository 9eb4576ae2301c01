//! Logging for the plugin: never on stdout (that is the runtime's result channel).
//! Lines look like whereabouts' (`<RFC3339> [<level>] <message>`) so existing
//! log scraping keeps working. Destination and level come from the network
//! config's `log_file` (appended to) and `log_level`; until a config is read,
//! errors go to stderr.

use std::fs::OpenOptions;
use std::io::Write;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug,
    Verbose,
    Error,
    Panic,
}

impl Level {
    pub fn parse(text: &str) -> Option<Level> {
        Some(match text.to_ascii_lowercase().as_str() {
            "debug" => Level::Debug,
            "verbose" => Level::Verbose,
            "error" => Level::Error,
            "panic" => Level::Panic,
            _ => return None,
        })
    }
    fn name(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Verbose => "verbose",
            Level::Error => "error",
            Level::Panic => "panic",
        }
    }
}

struct Logger {
    threshold: Level,
    /// `None` = stderr.
    file: Option<std::fs::File>,
}

static LOGGER: Mutex<Logger> = Mutex::new(Logger { threshold: Level::Error, file: None });

/// Applies `log_level` and `log_file` from a normalized config. Problems with
/// either are reported on stderr and otherwise ignored: logging must never fail a
/// CNI call.
pub fn configure(level: Option<&str>, file: Option<&str>) {
    let Ok(mut logger) = LOGGER.lock() else { return };
    if let Some(text) = level.filter(|l| !l.is_empty()) {
        match Level::parse(text) {
            Some(level) => logger.threshold = level,
            None => eprintln!("{} [error] unknown log_level {text:?}; keeping {}", timestamp(), logger.threshold.name()),
        }
    }
    if let Some(path) = file.filter(|f| !f.is_empty()) {
        // Relative to the runtime's working directory, which nobody chose: a
        // file there would turn up anywhere. Not worth failing a pod over.
        if !path.starts_with('/') {
            eprintln!("{} [error] log_file {path:?} is not an absolute path; ignored, logging to stderr", timestamp());
            return;
        }
        match OpenOptions::new().create(true).append(true).open(path) {
            Ok(f) => logger.file = Some(f),
            Err(e) => eprintln!("{} [error] cannot open log_file {path}: {e}; logging to stderr", timestamp()),
        }
    }
}

pub fn log(level: Level, message: impl std::fmt::Display) {
    let Ok(mut logger) = LOGGER.lock() else { return };
    if level < logger.threshold {
        return;
    }
    let line = format!("{} [{}] {}\n", timestamp(), level.name(), message);
    match logger.file.as_mut() {
        Some(f) => {
            let _ = f.write_all(line.as_bytes());
        }
        None => {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

pub fn debug(message: impl std::fmt::Display) {
    log(Level::Debug, message)
}
pub fn verbose(message: impl std::fmt::Display) {
    log(Level::Verbose, message)
}
pub fn error(message: impl std::fmt::Display) {
    log(Level::Error, message)
}

/// Current UTC time as RFC 3339 with seconds (no dependency on a date library).
pub fn timestamp() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format_utc(secs)
}

fn format_utc(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian calendar
/// (Howard Hinnant's well-known algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339_utc() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_798_675_261), "2026-12-31T00:01:01Z");
    }

    #[test]
    fn levels_parse_case_insensitively() {
        assert_eq!(Level::parse("VERBOSE"), Some(Level::Verbose));
        assert_eq!(Level::parse("nope"), None);
        assert!(Level::Debug < Level::Error);
    }
}
