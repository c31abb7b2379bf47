//! Where the binary's `log` records go.
//!
//! As a CNI plugin: every record of level info and up is appended to the log
//! file (`logFile`, default [`DEFAULT_LOG_FILE`]), one line per record, and
//! errors are also written to stderr, which runtimes show with a failed
//! request. Nothing is ever written to stdout: stdout is the CNI result.
//! Each process writes each line with a single `write` on an `O_APPEND` file
//! descriptor, so lines of concurrent plugin runs never interleave.
//!
//! As the operator CLI: warnings and errors to stderr.
//!
//! [`crate::verbs::logged`] wraps the plugin so each ADD, DEL, CHECK and GC
//! leaves one line saying which container it was for and what came of it.

use std::{
    fs::{self, File, OpenOptions},
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::Path,
    sync::Mutex,
    time::{SystemTime, UNIX_EPOCH},
};

use log::{Level, Log, Metadata, Record};

/// Where the plugin logs when `logFile` is not set.
pub const DEFAULT_LOG_FILE: &str = "/var/log/ebpf-portmap.log";

/// `2026-05-20T08:15:02.123456Z`.
pub fn utc_timestamp(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let days = (since.as_secs() / 86_400) as i64;
    let (year, month, day) = civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}T{}Z", utc_time_of_day(time))
}

/// `08:15:02.123456` (UTC).
pub fn utc_time_of_day(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        since.subsec_micros()
    )
}

/// Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
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

/// One log line, newline included.
pub fn format_line(time: SystemTime, pid: u32, level: Level, message: &str) -> String {
    format!("{} {level:<5} [{pid}] {message}\n", utc_timestamp(time))
}

struct PluginLogger {
    file: Mutex<Option<File>>,
    pid: u32,
    level: Level,
}

/// The environment variable that turns on the plugin's debug records
/// (`EPM_LOG_LEVEL=debug`): among them each run's account of what it read
/// from the kernel. Runtimes pass their environment to plugins.
pub const LOG_LEVEL_ENV: &str = "EPM_LOG_LEVEL";

impl Log for PluginLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let message = record.args().to_string();
        if let Ok(mut file) = self.file.lock()
            && let Some(file) = file.as_mut()
        {
            let line = format_line(SystemTime::now(), self.pid, record.level(), &message);
            // Best effort: a full disk must not fail the CNI request.
            let _ = file.write_all(line.as_bytes());
        }
        if record.level() == Level::Error {
            eprintln!("ebpf-portmap: {message}");
        }
    }

    fn flush(&self) {}
}

/// The log file is rotated once it reaches this size: it becomes
/// `<logFile>.1` (replacing an older one) and a new file is started, so the
/// log never takes more than twice this on the node.
pub const LOG_ROTATE_BYTES: u64 = 16 * 1024 * 1024;

fn open_log_file(path: &Path) -> std::io::Result<File> {
    open_rotating(path, LOG_ROTATE_BYTES)
}

/// Opens `path` for appending, first rotating it if it holds `limit` bytes
/// or more. Every plugin run opens the file anew, so rotating on open needs
/// no long-lived writer; of several runs that find it full at once, only one
/// renames it (each renames only the file it opened, checked by inode), and
/// a run still writing to the renamed file finishes its lines there.
fn open_rotating(path: &Path, limit: u64) -> std::io::Result<File> {
    use std::os::unix::fs::MetadataExt;
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let open = || {
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o640)
            .open(path)
    };
    let file = open()?;
    let opened = file.metadata()?;
    if opened.len() < limit {
        return Ok(file);
    }
    let still_ours =
        fs::metadata(path).is_ok_and(|now| now.ino() == opened.ino() && now.dev() == opened.dev());
    if still_ours {
        let mut rotated = path.as_os_str().to_owned();
        rotated.push(".1");
        fs::rename(path, rotated)?;
    }
    open()
}

/// Logging for a CNI invocation: to `log_file`, errors also to stderr.
/// A log file that cannot be opened is reported on stderr once; the request
/// goes on without it.
pub fn init_plugin(log_file: &Path) {
    let file = match open_log_file(log_file) {
        Ok(file) => Some(file),
        Err(error) => {
            eprintln!(
                "ebpf-portmap: cannot open log file {}: {error}",
                log_file.display()
            );
            None
        }
    };
    let level = match std::env::var(LOG_LEVEL_ENV) {
        Ok(value) if value.eq_ignore_ascii_case("debug") => Level::Debug,
        _ => Level::Info,
    };
    let logger = PluginLogger {
        file: Mutex::new(file),
        pid: std::process::id(),
        level,
    };
    if log::set_boxed_logger(Box::new(logger)).is_ok() {
        log::set_max_level(level.to_level_filter());
    }
}

struct CliLogger {
    level: Level,
}

impl Log for CliLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &Record) {
        if self.enabled(record.metadata()) {
            eprintln!(
                "ebpf-portmap: {}: {}",
                record.level().as_str().to_lowercase(),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

/// Logging for the operator CLI: warnings and errors (everything from info
/// with `verbose`) to stderr.
pub fn init_cli(verbose: bool) {
    let level = if verbose { Level::Info } else { Level::Warn };
    if log::set_boxed_logger(Box::new(CliLogger { level })).is_ok() {
        log::set_max_level(level.to_level_filter());
    }
}

/// The node agent's log: stderr (the container runtime or journald keeps
/// it), one timestamped line per record, info and up (debug with
/// `verbose`).
struct AgentLogger {
    level: Level,
}

impl Log for AgentLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &Record) {
        if self.enabled(record.metadata()) {
            eprintln!(
                "{} {:<5} {}",
                utc_timestamp(SystemTime::now()),
                record.level(),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

/// Logging for the node agent (see [`AgentLogger`]).
pub fn init_agent(verbose: bool) {
    let level = if verbose { Level::Debug } else { Level::Info };
    if log::set_boxed_logger(Box::new(AgentLogger { level })).is_ok() {
        log::set_max_level(level.to_level_filter());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_full_log_is_rotated_to_dot_one_and_a_new_one_started() {
        let dir = std::env::temp_dir().join(format!("epm-log-rotate-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let path = dir.join("sub/plugin.log");
        {
            let mut file = open_rotating(&path, 64).expect("created with its directory");
            file.write_all(&[b'x'; 63]).expect("write");
        }
        let mut file = open_rotating(&path, 64).expect("under the limit: appended");
        file.write_all(b"y\n").expect("write");
        drop(file);
        assert_eq!(fs::metadata(&path).expect("log").len(), 65);
        let mut file = open_rotating(&path, 64).expect("rotated");
        file.write_all(b"new\n").expect("write");
        drop(file);
        let rotated = dir.join("sub/plugin.log.1");
        assert_eq!(fs::metadata(&rotated).expect("the old log").len(), 65);
        assert_eq!(fs::read(&path).expect("the new log"), b"new\n");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn timestamps_are_utc_rfc3339() {
        let at = |secs: u64, micros: u64| {
            UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros)
        };
        assert_eq!(utc_timestamp(at(0, 0)), "1970-01-01T00:00:00.000000Z");
        // 2000-02-29 (leap day) 12:34:56.789012
        assert_eq!(
            utc_timestamp(at(951_827_696, 789_012)),
            "2000-02-29T12:34:56.789012Z"
        );
        // 2026-12-31 23:59:59
        assert_eq!(
            utc_timestamp(at(1_798_761_599, 0)),
            "2026-12-31T23:59:59.000000Z"
        );
        assert_eq!(utc_time_of_day(at(3_723, 4)), "01:02:03.000004");
    }

    #[test]
    fn lines_carry_time_level_pid_and_message() {
        let line = format_line(UNIX_EPOCH, 42, Level::Info, "ADD container=abc: ok");
        assert_eq!(
            line,
            "1970-01-01T00:00:00.000000Z INFO  [42] ADD container=abc: ok\n"
        );
    }
}
