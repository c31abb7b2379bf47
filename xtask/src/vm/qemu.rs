//! Booting one kernel in QEMU and judging the run from its serial log.
//!
//! TCG only (`-accel tcg -cpu max`): `/dev/kvm` on these machines is a
//! paravirtual kind that runs guests far slower than TCG. No network device
//! (`-nodefaults`): the tests build their own namespaces inside the guest.
//! QEMU exits 0 whatever happened in the guest, so only the guest's
//! explicit result marker counts; a panic (the guest reboots, `-no-reboot`
//! turns that into an exit), a hang and a timeout are failures.
//!
//! Two limits, both wall-clock: one for each stage of the guest (the boot up
//! to the first test binary, then each test binary from its `EPM-VM:
//! running` line to its `EPM-VM-TEST` line), which finds a hang early and
//! names it, and one for the whole VM. A fixed limit for the whole VM alone
//! either fails a slow machine whose guest is only slow or waits long for a
//! hung one: TCG's speed follows the host's, and the suite grows.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::guest::{RESULT_MARKER, RUNNING_MARKER, TEST_MARKER};

pub const QEMU: &str = "qemu-system-x86_64";

/// How a VM run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// The guest printed `EPM-VM-RESULT <series> FAIL`.
    Fail,
    /// QEMU exited without a result marker: a panic, a crash of init, ...
    NoMarker,
    /// A limit passed: what ran, and for how long it was allowed to.
    Timeout {
        stage: String,
        limit: Duration,
    },
}

impl Verdict {
    pub fn describe(&self) -> String {
        match self {
            Verdict::Pass => "PASS".into(),
            Verdict::Fail => "FAIL (a test failed)".into(),
            Verdict::NoMarker => "FAIL (the guest stopped without a result: panic or crash)".into(),
            Verdict::Timeout { stage, limit } => {
                format!("FAIL (timeout: {stage} ran past {}s)", limit.as_secs())
            }
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
    /// The kernel series, as the guest's result line names it.
    pub series: &'a str,
    /// This VM's name in the streamed log: the series, or the series and
    /// its part when the series is split over several VMs (`6.1/2`).
    pub label: &'a str,
    pub vmlinuz: &'a Path,
    pub initramfs: &'a Path,
    pub log: &'a Path,
    pub cpus: u32,
    pub memory_mib: u32,
    /// The whole VM, boot to power-off.
    pub timeout: Duration,
    /// Each stage: the boot, then each test binary.
    pub stage_timeout: Duration,
}

/// Which stage of the guest is running, and since when: the boot until the
/// first `EPM-VM: running <name>` line, then that test binary until its
/// `EPM-VM-TEST` line, then the guest until the next one starts (or until
/// it prints its result and powers off, after the last).
#[derive(Debug)]
struct Stage {
    name: String,
    since: Instant,
}

impl Stage {
    fn new(name: &str, now: Instant) -> Stage {
        Stage {
            name: name.to_owned(),
            since: now,
        }
    }

    /// Moves on if `line` starts or ends a test binary.
    fn follow(&mut self, line: &str, now: Instant) {
        if let Some(name) = running_line(line) {
            *self = Stage::new(&format!("test binary {name}"), now);
        } else if let Some((name, _, _)) = test_line(line) {
            *self = Stage::new(&format!("the guest after test binary {name}"), now);
        }
    }

    /// The limit that has passed at `now`, if one has.
    fn overrun(&self, started: Instant, now: Instant, boot: &Boot<'_>) -> Option<Verdict> {
        if now.duration_since(self.since) > boot.stage_timeout {
            return Some(Verdict::Timeout {
                stage: self.name.clone(),
                limit: boot.stage_timeout,
            });
        }
        if now.duration_since(started) > boot.timeout {
            return Some(Verdict::Timeout {
                stage: format!("the VM (in {})", self.name),
                limit: boot.timeout,
            });
        }
        None
    }
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

/// The test binary a `EPM-VM: running <name> <args>` line starts.
fn running_line(line: &str) -> Option<&str> {
    let mut words = line.split_whitespace();
    if words.next()? != RUNNING_MARKER || words.next()? != "running" {
        return None;
    }
    words.next()
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
    let mut timed_out = None;
    let mut stage = Stage::new("the boot", started);
    // Each line carries the seconds since the boot: the time of one test
    // is the gap to the line before it.
    let prefix = || format!("[{} {:>4}s]", boot.label, started.elapsed().as_secs());
    loop {
        let exited = child.try_wait()?.is_some();
        let mut chunk = Vec::new();
        log.read_to_end(&mut chunk)?;
        pending.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = pending.find('\n') {
            let line: String = pending.drain(..=end).collect();
            let line = line.trim_end();
            println!("{} {line}", prefix());
            if let Some(result) = result_of(line, boot.series) {
                passed = Some(result);
            }
            if let Some(test) = test_line(line) {
                tests.push(test);
            }
            stage.follow(line, Instant::now());
        }
        if exited {
            if !pending.is_empty() {
                println!("{} {pending}", prefix());
            }
            break;
        }
        if let Some(overrun) = stage.overrun(started, Instant::now(), boot) {
            timed_out = Some(overrun);
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
        (None, Some(timeout)) => timeout,
        (None, None) => Verdict::NoMarker,
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
        assert_eq!(
            running_line("EPM-VM: running plugin --skip x"),
            Some("plugin")
        );
        assert_eq!(running_line("EPM-VM: kernel 6.1.0-57-amd64"), None);
        assert_eq!(running_line("[6.1] EPM-VM: running plugin"), None);
    }

    fn boot_of(timeout: u64, stage_timeout: u64) -> Boot<'static> {
        Boot {
            series: "6.1",
            label: "6.1/1",
            vmlinuz: Path::new("/k/vmlinuz"),
            initramfs: Path::new("/k/initramfs.cpio"),
            log: Path::new("/k/serial.log"),
            cpus: 2,
            memory_mib: 1024,
            timeout: Duration::from_secs(timeout),
            stage_timeout: Duration::from_secs(stage_timeout),
        }
    }

    #[test]
    fn each_test_binary_gets_the_stage_limit_afresh() {
        let boot = boot_of(2400, 600);
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        let mut stage = Stage::new("the boot", t0);
        assert_eq!(stage.overrun(t0, at(600), &boot), None);
        stage.follow("EPM-VM: running kernel --test-threads=1", at(80));
        // Other progress lines do not start a stage.
        stage.follow("EPM-VM: insmod veth failed", at(90));
        assert!(stage.overrun(t0, at(681), &boot).is_some());
        stage.follow("EPM-VM-TEST kernel PASS 500s", at(580));
        assert_eq!(
            stage.overrun(t0, at(1181), &boot).map(|v| v.describe()),
            Some("FAIL (timeout: the guest after test binary kernel ran past 600s)".into())
        );
        stage.follow("EPM-VM: running churn --test-threads=1", at(590));
        // 1100 s into the VM, past the old 900 s for the whole VM, and no
        // stage has run 600 s: not hung.
        assert_eq!(stage.overrun(t0, at(1100), &boot), None);
        assert_eq!(
            stage.overrun(t0, at(1191), &boot),
            Some(Verdict::Timeout {
                stage: "test binary churn".into(),
                limit: Duration::from_secs(600),
            })
        );
    }

    #[test]
    fn a_hung_boot_and_a_long_vm_are_timeouts_too() {
        let boot = boot_of(1000, 600);
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        let mut stage = Stage::new("the boot", t0);
        assert_eq!(
            stage.overrun(t0, at(601), &boot).map(|v| v.describe()),
            Some("FAIL (timeout: the boot ran past 600s)".into())
        );
        stage.follow("EPM-VM: running plugin --test-threads=1", at(500));
        assert_eq!(
            stage.overrun(t0, at(1001), &boot).map(|v| v.describe()),
            Some("FAIL (timeout: the VM (in test binary plugin) ran past 1000s)".into())
        );
    }

    #[test]
    fn qemu_runs_tcg_without_network_and_without_reboot() {
        let command = qemu_command(&boot_of(1, 1));
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
