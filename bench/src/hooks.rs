//! What the programs cost the traffic they see, beyond the rates: the
//! connect() rate of a node process with the socket hooks attached and
//! without (a child process of the bench, moved into the hooked cgroup or
//! left outside it), and each program's run time per run from the
//! kernel's BPF statistics.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use portmap_tests::netns::NsHandle;
use serde_json::Value;

/// The hidden argument that makes the bench binary a connect() loop (see
/// [`connect_loop`]).
pub const CONNECT_LOOP_ARG: &str = "--connect-loop";

/// connect() calls on one UDP socket to `target` for `duration`: each
/// call runs the connect4 hook and the kernel's route lookup, and sends
/// nothing (UDP), so the rate is the syscall's own. Returns the count.
pub fn connect_loop(target: SocketAddr, duration: Duration) -> std::io::Result<u64> {
    let socket = UdpSocket::bind(("0.0.0.0", 0))?;
    let started = Instant::now();
    let mut calls = 0u64;
    while started.elapsed() < duration {
        // Checking the clock every call would cost as much as the call.
        for _ in 0..256 {
            socket.connect(target)?;
        }
        calls += 256;
    }
    Ok(calls)
}

/// The connect() rate (calls/s) of a child process in `node`'s network
/// namespace, in cgroup `cgroup` (whose `cgroup.procs` it writes itself
/// before it runs anything), pinned to `cpu`.
pub fn connect_rate(
    node: &NsHandle,
    cgroup: &Path,
    target: SocketAddr,
    duration: Duration,
    cpu: Option<usize>,
) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the bench binary: {e}"))?;
    let mut command: Command = node.command(&exe);
    command
        .args([
            CONNECT_LOOP_ARG,
            &target.to_string(),
            &duration.as_millis().to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let procs = CString::new(cgroup.join("cgroup.procs").as_os_str().as_bytes())
        .map_err(|e| format!("cgroup path: {e}"))?;
    // SAFETY: between fork and exec only open/write/close, with no
    // allocation (the path is prepared above).
    unsafe {
        command.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let written = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
            if written != 1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    if let Some(cpu) = cpu {
        // SAFETY: sched_setaffinity on the child itself, no allocation.
        unsafe {
            command.pre_exec(move || {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set);
                Ok(())
            });
        }
    }
    let started = Instant::now();
    let out = command
        .output()
        .map_err(|e| format!("running the connect loop: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "connect loop failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let calls: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("connect loop output: {e}"))?;
    // The loop's own duration, not the process start-up around it.
    let seconds = duration.as_secs_f64().min(started.elapsed().as_secs_f64());
    Ok(calls as f64 / seconds)
}

/// Kernel BPF run-time statistics, on while this lives (`BPF_ENABLE_STATS`:
/// the kernel counts while any such file descriptor is open, and stops
/// when the last one closes, so nothing is left switched on).
pub struct BpfStats {
    _fd: OwnedFd,
}

impl BpfStats {
    pub fn enable() -> Result<BpfStats, String> {
        const BPF_ENABLE_STATS: libc::c_long = 32;
        // union bpf_attr { struct { __u32 type; } enable_stats; }, type
        // BPF_STATS_RUN_TIME (0); the rest of the union zero.
        let attr = [0u8; 128];
        // SAFETY: the bpf syscall reads `size` bytes of `attr`.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_ENABLE_STATS,
                attr.as_ptr(),
                attr.len() as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(format!(
                "BPF_ENABLE_STATS: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: a new descriptor the kernel handed us, owned from here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(BpfStats { _fd: fd })
    }
}

/// (runs, nanoseconds) a program has been charged so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunTime {
    pub runs: u64,
    pub ns: u64,
}

impl RunTime {
    /// Runs and ns/run since the reading `before`; `None` if it did not run.
    pub fn since(self, before: RunTime) -> Option<(u64, f64)> {
        let runs = self.runs.saturating_sub(before.runs);
        (runs > 0).then(|| {
            let ns = self.ns.saturating_sub(before.ns);
            (runs, ns as f64 / runs as f64)
        })
    }
}

/// Run counters of every program pinned under `progs_dir`, by program
/// name (the pin name without its build prefix).
pub fn run_times(progs_dir: &Path) -> BTreeMap<String, RunTime> {
    let mut times = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(progs_dir) else {
        return times;
    };
    for entry in dir.flatten() {
        let path = entry.path();
        let Some(pin) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        // `{build:016x}_{program}`.
        let name = pin.split_once('_').map_or(pin, |(_, name)| name).to_owned();
        if let Some(time) = bpftool_run_time(&["pinned".as_ref(), path.as_os_str()]) {
            times.insert(name, time);
        }
    }
    times
}

/// The run counters of the program with kernel id `id`.
pub fn run_time_of(id: u32) -> Option<RunTime> {
    bpftool_run_time(&["id".as_ref(), id.to_string().as_ref()])
}

/// `bpftool prog show <how>`'s run counters.
fn bpftool_run_time(how: &[&std::ffi::OsStr]) -> Option<RunTime> {
    let out = Command::new("bpftool")
        .args(["--json", "prog", "show"])
        .args(how)
        .output()
        .ok()?;
    let info = serde_json::from_slice::<Value>(&out.stdout).ok()?;
    Some(RunTime {
        runs: info["run_cnt"].as_u64().unwrap_or(0),
        ns: info["run_time_ns"].as_u64().unwrap_or(0),
    })
}

/// Runs and ns/run of each program between two readings; programs that did
/// not run are left out.
pub fn per_run(
    before: &BTreeMap<String, RunTime>,
    after: &BTreeMap<String, RunTime>,
) -> Vec<(String, u64, f64)> {
    after
        .iter()
        .filter_map(|(name, a)| {
            let (runs, ns_per_run) = a.since(before.get(name).copied().unwrap_or_default())?;
            Some((name.clone(), runs, ns_per_run))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_run_takes_differences_and_drops_idle_programs() {
        let before = BTreeMap::from([
            ("portmap_ingress".to_owned(), RunTime { runs: 10, ns: 1000 }),
            ("portmap_egress".to_owned(), RunTime { runs: 5, ns: 500 }),
        ]);
        let after = BTreeMap::from([
            (
                "portmap_ingress".to_owned(),
                RunTime {
                    runs: 110,
                    ns: 6000,
                },
            ),
            ("portmap_egress".to_owned(), RunTime { runs: 5, ns: 500 }),
            ("portmap_connect4".to_owned(), RunTime { runs: 4, ns: 100 }),
        ]);
        assert_eq!(
            per_run(&before, &after),
            vec![
                ("portmap_connect4".to_owned(), 4, 25.0),
                ("portmap_ingress".to_owned(), 100, 50.0),
            ]
        );
    }
}
