//! Booting one kernel in QEMU and judging the run from its serial log.
//!
//! TCG only (`-accel tcg -cpu max`): `/dev/kvm` on these machines is a
//! paravirtual kind that runs guests far slower than TCG. No network device
//! (`-nodefaults`): the tests build their own namespaces inside the guest.
//! QEMU exits 0 whatever happened in the guest, so only the guest's
//! explicit result marker counts; a panic (the guest reboots, `-no-reboot`
//! turns that into an exit), a hang and a timeout are failures.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::guest::{RESULT_MARKER, TEST_MARKER};

pub const QEMU: &str = "qemu-system-x86_64";

/// How a VM run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// The guest printed `EPM-VM-RESULT <series> FAIL`.
    Fail,
    /// QEMU exited without a result marker: a panic, a crash of init, ...
    NoMarker,
    Timeout,
}

impl Verdict {
    pub fn describe(&self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL (a test failed)",
            Verdict::NoMarker => "FAIL (the guest stopped without a result: panic or crash)",
            Verdict::Timeout => "FAIL (timeout)",
        }
    }
}

#[derive(Debug)]
pub struct Run {
    pub verdict: Verdict,
    pub elapsed: Duration,
    /// `(test binary, PASS|FAIL, duration text)` from the guest's lines.
    pub tests: Vec<(String, String, String)>,
    pub log: PathBuf,
}

pub struct Boot<'a> {
    pub series: &'a str,
    pub vmlinuz: &'a Path,
    pub initramfs: &'a Path,
    pub log: &'a Path,
    pub cpus: u32,
    pub memory_mib: u32,
    pub timeout: Duration,
}

/// What the guest's result line says for `series`, if `line` is one.
pub fn result_of(line: &str, series: &str) -> Option<bool> {
    let mut words = line.split_whitespace();
    if words.next()? != RESULT_MARKER || words.next()? != series {
        return None;
    }
    match (words.next()?, words.next()) {
        ("PASS", None) => Some(true),
        ("FAIL", None) => Some(false),
        _ => None,
    }
}

fn test_line(line: &str) -> Option<(String, String, String)> {
    let mut words = line.split_whitespace();
    if words.next()? != TEST_MARKER {
        return None;
    }
    Some((
        words.next()?.to_owned(),
        words.next()?.to_owned(),
        words.next().unwrap_or("").to_owned(),
    ))
}

pub fn qemu_command(boot: &Boot<'_>) -> Command {
    let mut command = Command::new(QEMU);
    command
        .args(["-nodefaults", "-no-user-config", "-display", "none"])
        .args(["-accel", "tcg", "-cpu", "max"])
        .args(["-smp", &boot.cpus.to_string()])
        .args(["-m", &format!("{}M", boot.memory_mib)])
        .arg("-no-reboot")
        .arg("-kernel")
        .arg(boot.vmlinuz)
        .arg("-initrd")
        .arg(boot.initramfs)
        .args([
            "-append",
            "console=ttyS0 panic=-1 oops=panic loglevel=4 mitigations=off random.trust_cpu=on",
        ])
        .arg("-serial")
        .arg(format!("file:{}", boot.log.display()))
        .args(["-monitor", "none"])
        .stdin(Stdio::null());
    command
}

/// Boots, streams the serial log with a `[series]` prefix, and returns once
/// QEMU exits or the timeout passes (QEMU is then killed).
pub fn boot(boot: &Boot<'_>) -> Result<Run> {
    let _ = std::fs::remove_file(boot.log);
    std::fs::write(boot.log, b"")?;
    let mut command = qemu_command(boot);
    println!("+ {}", crate::cmd::show(&command));
    let started = Instant::now();
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {QEMU} (apt-get install qemu-system-x86)"))?;
    let mut log = std::fs::File::open(boot.log)?;
    let mut pending = String::new();
    let mut passed = None;
    let mut tests = Vec::new();
    let mut timed_out = false;
    let prefix = format!("[{}]", boot.series);
    loop {
        let exited = child.try_wait()?.is_some();
        let mut chunk = Vec::new();
        log.read_to_end(&mut chunk)?;
        pending.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = pending.find('\n') {
            let line: String = pending.drain(..=end).collect();
            let line = line.trim_end();
            println!("{prefix} {line}");
            if let Some(result) = result_of(line, boot.series) {
                passed = Some(result);
            }
            if let Some(test) = test_line(line) {
                tests.push(test);
            }
        }
        if exited {
            if !pending.is_empty() {
                println!("{prefix} {pending}");
            }
            break;
        }
        if started.elapsed() > boot.timeout {
            timed_out = true;
            // Our own child, by its handle.
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let verdict = match (passed, timed_out) {
        (Some(true), _) => Verdict::Pass,
        (Some(false), _) => Verdict::Fail,
        (None, true) => Verdict::Timeout,
        (None, false) => Verdict::NoMarker,
    };
    Ok(Run {
        verdict,
        elapsed: started.elapsed(),
        tests,
        log: boot.log.to_path_buf(),
    })
}

/// The last `count` lines of a log, for failure reports.
pub fn tail(log: &Path, count: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_result_line_counts() {
        assert_eq!(result_of("EPM-VM-RESULT 6.1 PASS\r", "6.1"), Some(true));
        assert_eq!(result_of("EPM-VM-RESULT 6.1 FAIL", "6.1"), Some(false));
        assert_eq!(result_of("EPM-VM-RESULT 6.12 PASS", "6.1"), None);
        assert_eq!(result_of("EPM-VM-RESULT 6.1 PASS extra", "6.1"), None);
        assert_eq!(
            result_of(
                "[    0.000000] Command line: console=ttyS0 EPM-VM-RESULT 6.1 PASS",
                "6.1"
            ),
            None
        );
        assert_eq!(result_of("echo EPM-VM-RESULT 6.1 PASS", "6.1"), None);
    }

    #[test]
    fn per_binary_lines_are_collected() {
        assert_eq!(
            test_line("EPM-VM-TEST plugin PASS 73s"),
            Some(("plugin".into(), "PASS".into(), "73s".into()))
        );
        assert_eq!(test_line("EPM-VM: running plugin"), None);
    }

    #[test]
    fn qemu_runs_tcg_without_network_and_without_reboot() {
        let command = qemu_command(&Boot {
            series: "6.1",
            vmlinuz: Path::new("/k/vmlinuz"),
            initramfs: Path::new("/k/initramfs.cpio"),
            log: Path::new("/k/serial.log"),
            cpus: 2,
            memory_mib: 1024,
            timeout: Duration::from_secs(1),
        });
        let args: Vec<String> = command
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let joined = args.join(" ");
        for expected in [
            "-nodefaults",
            "-accel tcg -cpu max",
            "-no-reboot",
            "-serial file:/k/serial.log",
            "panic=-1",
        ] {
            assert!(joined.contains(expected), "{expected} in {joined}");
        }
        assert!(!joined.contains("kvm"), "{joined}");
    }
}
