//! Timed plugin invocations for the control-plane measurements.
//!
//! The bench builds every stdin config with the harness's
//! [`plugin_config`] (libcni's `buildOneConfig`) and sets the same `CNI_*`
//! environment as [`portmap_tests::CniRunner`], in the node namespace. It does
//! not call `CniRunner::exec_plugin` for timing: that one polls `try_wait`
//! with a back-off of 1, 2, 4 … 20 ms, so a 2 ms plugin run is recorded as
//! 3 ms and a 4 ms one as 7 ms, which would distort every ratio. Here the
//! child is reaped with a blocking `wait`, and a single shared watchdog
//! thread kills a run that exceeds its timeout, so timing costs nothing
//! extra per call. `wait4` also reports the CPU time the plugin (and the
//! `iptables` processes it ran) used, the plugin's cost without the time it
//! queued for a CPU.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use portmap_tests::cni::{CniCommand, cni_args_string, parse_error_json, plugin_config};
use portmap_tests::netns::NsHandle;
use portmap_tests::{Conflist, RuntimeAttachment};
use serde_json::Value;

/// One plugin run may take this long before the watchdog kills it.
pub const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

/// A finished invocation: how long it took and what it answered.
#[derive(Debug, Clone)]
pub struct Timed {
    pub elapsed: Duration,
    /// CPU time (user + system) of the plugin process and every child it
    /// waited for (upstream portmap runs `iptables`): its own cost, free of
    /// the time it spent waiting for a CPU on a busy machine.
    pub cpu: Duration,
    /// The parsed stdout on success; on failure a one-line reason that
    /// starts with the failing plugin's name.
    pub result: Result<Value, String>,
}

impl Timed {
    pub fn ok(&self) -> bool {
        self.result.is_ok()
    }
}

/// What runs in front of a plugin, and the environment it gets on top of
/// the `CNI_*` variables (e.g. `strace` and `EPM_LOG_LEVEL=debug`).
pub struct Wrapper<'a> {
    /// The program and its arguments; the plugin's path goes last.
    pub prefix: &'a [OsString],
    pub env: &'a [(&'a str, &'a str)],
}

impl Wrapper<'_> {
    /// The plugin alone, as a runtime runs it.
    pub const NONE: Wrapper<'static> = Wrapper {
        prefix: &[],
        env: &[],
    };
}

/// Runs plugins from one directory inside one node namespace.
pub struct Invoker {
    dir: PathBuf,
    node: NsHandle,
    /// Environment every plugin run gets (e.g. the `PATH` holding `nft`).
    env: Vec<(OsString, OsString)>,
    watchdog: Watchdog,
}

impl Invoker {
    pub fn new(dir: PathBuf, node: NsHandle) -> Invoker {
        Invoker {
            dir,
            node,
            env: Vec::new(),
            watchdog: Watchdog::start(),
        }
    }

    /// The same, with `env` set for every plugin run.
    pub fn with_env(mut self, env: Vec<(OsString, OsString)>) -> Invoker {
        self.env = env;
        self
    }

    /// Runs `plugin` once with `config` on stdin and times it from spawn to reap.
    pub fn exec(
        &self,
        plugin: &str,
        command: CniCommand,
        rt: &RuntimeAttachment,
        config: &Value,
    ) -> Timed {
        self.exec_wrapped(plugin, command, rt, config, &Wrapper::NONE)
    }

    /// [`Invoker::exec`] through `wrapper` (a program in front of the
    /// plugin, extra environment): the untimed runs that count what a call
    /// does.
    pub fn exec_wrapped(
        &self,
        plugin: &str,
        command: CniCommand,
        rt: &RuntimeAttachment,
        config: &Value,
        wrapper: &Wrapper<'_>,
    ) -> Timed {
        let stdin_bytes = serde_json::to_vec(config).expect("a Value always serialises");
        let started = Instant::now();
        let mut cpu = Duration::ZERO;
        let outcome = self.run(plugin, command, rt, &stdin_bytes, wrapper, &mut cpu);
        let elapsed = started.elapsed();
        Timed {
            elapsed,
            cpu,
            result: outcome,
        }
    }

    fn run(
        &self,
        plugin: &str,
        command: CniCommand,
        rt: &RuntimeAttachment,
        stdin_bytes: &[u8],
        wrapper: &Wrapper<'_>,
        cpu: &mut Duration,
    ) -> Result<Value, String> {
        let path = self.dir.join(plugin);
        let mut spawned = match wrapper.prefix.split_first() {
            Some((program, args)) => {
                let mut spawned = Command::new(program);
                spawned.args(args).arg(&path);
                spawned
            }
            None => Command::new(&path),
        };
        spawned.envs(self.env.iter().map(|(k, v)| (k, v)));
        for (key, value) in wrapper.env {
            spawned.env(key, value);
        }
        spawned
            .env("CNI_COMMAND", command.as_str())
            .env("CNI_CONTAINERID", &rt.container_id)
            .env("CNI_NETNS", &rt.netns_path)
            .env("CNI_ARGS", cni_args_string(&rt.cni_args))
            .env("CNI_IFNAME", &rt.ifname)
            .env("CNI_PATH", &self.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // Not forked: the child's CPU time is then the plugin's alone (see
        // `NsHandle::spawn`).
        let mut child = self
            .node
            .spawn(&mut spawned)
            .map_err(|e| format!("{plugin} could not start ({}): {e}", path.display()))?;
        let pid = child.id();
        self.watchdog.watch(pid, Instant::now() + PLUGIN_TIMEOUT);
        let mut stdin = child.stdin.take().expect("stdin is piped");
        // Configs are a few KiB, well below the 64 KiB pipe buffer: the write
        // never blocks, whether or not the plugin reads.
        let _ = stdin.write_all(stdin_bytes);
        drop(stdin);
        let output = drain_and_reap(&mut child);
        let timed_out = self.watchdog.unwatch(pid);
        let output = output.map_err(|e| format!("{plugin} could not be waited for: {e}"))?;
        *cpu = output.cpu;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if timed_out {
            return Err(format!(
                "{plugin} {command} killed after {PLUGIN_TIMEOUT:?}"
            ));
        }
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let reason = parse_error_json(&stdout)
                .and_then(|e| e.get("msg").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_else(|| format!("{} {}", stdout.trim(), stderr.trim()));
            return Err(format!(
                "{plugin} {command} failed ({}): {}",
                output.status,
                one_line(&reason)
            ));
        }
        if stdout.trim().is_empty() {
            // DEL prints nothing.
            return Ok(Value::Null);
        }
        serde_json::from_str(&stdout)
            .map_err(|e| format!("{plugin} {command}: stdout is not JSON ({e})"))
    }

    /// The port-mapping plugin alone (the last plugin of `list`), with a
    /// fixed `prevResult`, as the last step of a runtime's ADD or DEL.
    pub fn port_plugin(
        &self,
        list: &Conflist,
        command: CniCommand,
        rt: &RuntimeAttachment,
        prev_result: &Value,
    ) -> Timed {
        let plugin = list.plugins().last().expect("a list with plugins");
        let config = plugin_config(list, plugin, &rt.capability_args, Some(prev_result));
        let kind = plugin["type"].as_str().expect("validated conflist");
        self.exec(kind, command, rt, &config)
    }

    /// [`Invoker::port_plugin`] through `wrapper`.
    pub fn port_plugin_wrapped(
        &self,
        list: &Conflist,
        command: CniCommand,
        rt: &RuntimeAttachment,
        prev_result: &Value,
        wrapper: &Wrapper<'_>,
    ) -> Timed {
        let plugin = list.plugins().last().expect("a list with plugins");
        let config = plugin_config(list, plugin, &rt.capability_args, Some(prev_result));
        let kind = plugin["type"].as_str().expect("validated conflist");
        self.exec_wrapped(kind, command, rt, &config, wrapper)
    }

    /// ADD through the whole list, as libcni: in order, each plugin gets the
    /// previous one's result. Returns the total time and the final result.
    pub fn chain_add(&self, list: &Conflist, rt: &RuntimeAttachment) -> Timed {
        let started = Instant::now();
        let mut cpu = Duration::ZERO;
        let mut prev: Option<Value> = None;
        for plugin in list.plugins() {
            let config = plugin_config(list, plugin, &rt.capability_args, prev.as_ref());
            let kind = plugin["type"].as_str().expect("validated conflist");
            let step = self.exec(kind, CniCommand::Add, rt, &config);
            cpu += step.cpu;
            match step.result {
                Ok(result) => prev = Some(result),
                Err(e) => {
                    return Timed {
                        elapsed: started.elapsed(),
                        cpu,
                        result: Err(e),
                    };
                }
            }
        }
        Timed {
            elapsed: started.elapsed(),
            cpu,
            result: Ok(prev.unwrap_or(Value::Null)),
        }
    }

    /// DEL through the whole list in reverse order with the cached ADD
    /// result as `prevResult` (none if the ADD failed, as in libcni); every
    /// plugin runs, the first failure is reported.
    pub fn chain_del(
        &self,
        list: &Conflist,
        rt: &RuntimeAttachment,
        cached: Option<&Value>,
    ) -> Timed {
        let started = Instant::now();
        let mut cpu = Duration::ZERO;
        let mut failure = None;
        for plugin in list.plugins().iter().rev() {
            let config = plugin_config(list, plugin, &rt.capability_args, cached);
            let kind = plugin["type"].as_str().expect("validated conflist");
            let step = self.exec(kind, CniCommand::Del, rt, &config);
            cpu += step.cpu;
            if let Err(e) = step.result {
                failure.get_or_insert(e);
            }
        }
        Timed {
            elapsed: started.elapsed(),
            cpu,
            result: failure.map_or(Ok(Value::Null), Err),
        }
    }
}

/// What a reaped plugin left behind.
struct Reaped {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    cpu: Duration,
}

/// Reads stdout and stderr to their end (polling both, so a chatty stderr
/// cannot block the plugin), then reaps the child with `wait4` for its
/// resource usage (std's `wait` does not report it).
fn drain_and_reap(child: &mut Child) -> io::Result<Reaped> {
    /// One output pipe being drained.
    struct Pipe {
        reader: Box<dyn Read>,
        fd: i32,
        buf: Vec<u8>,
        done: bool,
    }
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut pipes = [
        Pipe {
            fd: stdout.as_raw_fd(),
            reader: Box::new(stdout),
            buf: Vec::new(),
            done: false,
        },
        Pipe {
            fd: stderr.as_raw_fd(),
            reader: Box::new(stderr),
            buf: Vec::new(),
            done: false,
        },
    ];
    let mut chunk = [0u8; 16 * 1024];
    while pipes.iter().any(|pipe| !pipe.done) {
        let mut fds: Vec<libc::pollfd> = pipes
            .iter()
            .map(|pipe| libc::pollfd {
                fd: if pipe.done { -1 } else { pipe.fd },
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of pollfd of the given length. No
        // timeout: the watchdog kills a hung plugin's process group, which
        // closes the pipes.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if rc < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        for (pipe, pollfd) in pipes.iter_mut().zip(&fds) {
            if pipe.done || pollfd.revents == 0 {
                continue;
            }
            match pipe.reader.read(&mut chunk) {
                Ok(0) => pipe.done = true,
                Ok(n) => pipe.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
    let pid = libc::pid_t::try_from(child.id()).map_err(io::Error::other)?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: reaps our own child; both out pointers are valid.
        let rc = unsafe { libc::wait4(pid, &raw mut status, 0, &raw mut usage) };
        if rc == pid {
            break;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    let [stdout, stderr] = pipes;
    Ok(Reaped {
        status: ExitStatus::from_raw(status),
        stdout: stdout.buf,
        stderr: stderr.buf,
        cpu: time(usage.ru_utime) + time(usage.ru_stime),
    })
}

fn one_line(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.len() > 300 {
        format!("{}...", &line[..line.floor_char_boundary(300)])
    } else {
        line
    }
}

/// One thread that kills the process group of any watched plugin past its
/// deadline. Deadlines are generous (a minute): it only fires on a hang.
struct Watchdog {
    deadlines: Arc<Mutex<HashMap<u32, (Instant, bool)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    fn start() -> Watchdog {
        let deadlines: Arc<Mutex<HashMap<u32, (Instant, bool)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let deadlines = Arc::clone(&deadlines);
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("bench-watchdog".into())
                .spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(100));
                        let now = Instant::now();
                        let mut watched = deadlines
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        for (pid, (deadline, fired)) in watched.iter_mut() {
                            if !*fired && now >= *deadline {
                                *fired = true;
                                if let Ok(pgid) = i32::try_from(*pid) {
                                    // SAFETY: signals a process group we created.
                                    // It is unwatched right after its reap; a
                                    // deadline a minute away makes hitting that
                                    // microsecond window a non-issue.
                                    unsafe { libc::kill(-pgid, libc::SIGKILL) };
                                }
                            }
                        }
                    }
                })
                .expect("spawning the watchdog")
        };
        Watchdog {
            deadlines,
            stop,
            thread: Some(thread),
        }
    }

    fn watch(&self, pid: u32, deadline: Instant) {
        self.deadlines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(pid, (deadline, false));
    }

    /// Stops watching `pid`; returns whether the watchdog killed it.
    fn unwatch(&self, pid: u32) -> bool {
        self.deadlines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&pid)
            .is_some_and(|(_, fired)| fired)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
