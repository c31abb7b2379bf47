//! The node agent (`ebpf-portmap-agent`) as the tests run it: in the test
//! node's network namespace, reconciling with the world's conflist (written
//! to a file, as `/etc/cni/net.d` would hold it), serving on the node's
//! loopback; and a small HTTP client and exposition reader for what it
//! serves.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::plugins::plugin_bin;
use crate::traffic::parse_http_response;
use crate::world::World;

/// Overrides where the agent binary is (default: next to the plugin).
pub const AGENT_BIN_ENV: &str = "EBPF_PORTMAP_AGENT_BIN";

/// Where the agent listens in the node namespace.
pub const AGENT_LISTEN: &str = "127.0.0.1:9965";

pub fn agent_bin() -> PathBuf {
    match std::env::var_os(AGENT_BIN_ENV) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => plugin_bin().with_file_name("ebpf-portmap-agent"),
    }
}

/// `GET path` over HTTP/1.0 from inside the namespace of `ns`: (status,
/// body).
pub fn http_get(
    ns: &crate::netns::NsHandle,
    addr: SocketAddr,
    path: &str,
) -> Result<(u16, String), String> {
    let path = path.to_owned();
    ns.run(move || {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        stream.set_read_timeout(Some(Duration::from_secs(30))).ok();
        stream.set_write_timeout(Some(Duration::from_secs(10))).ok();
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .map_err(|e| format!("send to {addr}: {e}"))?;
        let mut raw = Vec::new();
        stream
            .read_to_end(&mut raw)
            .map_err(|e| format!("read from {addr}: {e}"))?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        parse_http_response(&text)
            .map(|response| (response.status, response.body))
            .ok_or_else(|| format!("not an HTTP response from {addr}: {text:?}"))
    })
}

/// A running agent; killed on drop.
pub struct Agent {
    child: Option<Child>,
    ns: crate::netns::NsHandle,
    pub listen: SocketAddr,
    pub conf: PathBuf,
    pub log: PathBuf,
}

impl Agent {
    /// Starts the agent for `world` (its conflist written next to the
    /// node's data) and waits until `/healthz` answers.
    pub fn start(world: &World) -> Agent {
        Agent::start_with(world, &[])
    }

    /// [`Agent::start`] with extra arguments.
    pub fn start_with(world: &World, args: &[&str]) -> Agent {
        Agent::spawn(world, None, args)
    }

    /// [`Agent::start_with`] reading the CNI configuration `conf` (a
    /// file the test changes, as an installer does) instead of a copy of
    /// the world's.
    pub fn start_with_conf(world: &World, conf: &std::path::Path, args: &[&str]) -> Agent {
        Agent::spawn_with(world, None, Some(conf), args)
    }

    /// [`Agent::start`] with only the capabilities `caps` (setpriv's
    /// spelling, e.g. `bpf,net_admin`): the bounding set of a root process.
    pub fn start_confined(world: &World, caps: &str) -> Agent {
        Agent::spawn(world, Some(caps), &[])
    }

    fn spawn(world: &World, caps: Option<&str>, args: &[&str]) -> Agent {
        Agent::spawn_with(world, caps, None, args)
    }

    fn spawn_with(
        world: &World,
        caps: Option<&str>,
        conf: Option<&std::path::Path>,
        args: &[&str],
    ) -> Agent {
        let conf = match conf {
            Some(conf) => conf.to_path_buf(),
            None => {
                let conf = world.node.data_dir().join("10-agent.conflist");
                std::fs::write(&conf, world.list.json().to_string())
                    .expect("write the agent's conflist");
                conf
            }
        };
        let log = world.node.data_dir().join("agent.log");
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("agent log file");
        let mut command = match caps {
            None => world.node.ns.command(agent_bin()),
            Some(caps) => {
                let bounding = caps
                    .split(',')
                    .map(|cap| format!(",+{cap}"))
                    .collect::<String>();
                let mut command = world.node.ns.command("/usr/bin/setpriv");
                command
                    .arg(format!("--bounding-set=-all{bounding}"))
                    .args(["--inh-caps=-all", "--no-new-privs", "--"])
                    .arg(agent_bin());
                command
            }
        };
        let child = command
            .args(["--verbose", "--listen", AGENT_LISTEN, "--cni-conf"])
            .arg(&conf)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", agent_bin().display()));
        let mut agent = Agent {
            child: Some(child),
            ns: world.node.ns.handle(),
            listen: AGENT_LISTEN.parse().expect("an address"),
            conf,
            log,
        };
        agent.wait_healthy();
        agent
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("the agent exited with {status}:\n{}", self.log_text());
            }
            if matches!(self.get("/healthz"), Ok((200, _))) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the agent's /healthz did not answer 200 within 20 s:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// `GET path` on the agent, from the node namespace.
    pub fn get(&self, path: &str) -> Result<(u16, String), String> {
        http_get(&self.ns, self.listen, path)
    }

    /// The exposition (Prometheus text format), which must be served.
    pub fn metrics(&self) -> String {
        match self.get("/metrics") {
            Ok((200, body)) => body,
            other => panic!("GET /metrics: {other:?}\n{}", self.log_text()),
        }
    }

    /// `/readyz`: `Ok(())` when ready, else the problems it lists.
    pub fn readiness(&self) -> Result<(), String> {
        match self.get("/readyz") {
            Ok((200, _)) => Ok(()),
            Ok((503, body)) => Err(body),
            other => panic!("GET /readyz: {other:?}\n{}", self.log_text()),
        }
    }

    /// Polls `/readyz` until it answers 200, within `within`.
    pub fn wait_ready(&self, within: Duration, when: &str) {
        let deadline = Instant::now() + within;
        loop {
            match self.readiness() {
                Ok(()) => return,
                Err(problems) if Instant::now() >= deadline => panic!(
                    "{when}: /readyz not ready after {within:?}:\n{problems}\n{}",
                    self.log_text()
                ),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    pub fn log_text(&self) -> String {
        format!(
            "--- agent log ({}) ---\n{}",
            self.log.display(),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        )
    }

    /// Sends `signal` and waits for the process; its exit status.
    pub fn signal(&mut self, signal: libc::c_int) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("the agent runs");
        // SAFETY: kill(2) on our own child's pid, which we have not reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        child.wait().expect("wait for the agent")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The value of the sample `name{labels...}` in a Prometheus text
/// exposition (labels given must all match; others may be present).
pub fn sample(exposition: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    exposition.lines().find_map(|line| {
        if line.starts_with('#') {
            return None;
        }
        let (series, value) = line.rsplit_once(' ')?;
        let (metric, label_text) = match series.split_once('{') {
            Some((metric, rest)) => (metric, rest.strip_suffix('}')?),
            None => (series, ""),
        };
        if metric != name {
            return None;
        }
        let all = labels
            .iter()
            .all(|(key, want)| label_text.contains(&format!("{key}=\"{want}\"")));
        if all { value.parse().ok() } else { None }
    })
}

/// The lock the plugin's verbs (and the agent) take for `pin_root`, held
/// until dropped: what a CNI verb in progress looks like to the agent.
pub fn hold_pin_root_lock(pin_root: &std::path::Path) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let path = crate::bpffs::lock_file(pin_root);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    // SAFETY: flock on an fd we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(
        rc,
        0,
        "flock {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    file
}

/// `promtool check metrics` on `exposition`: its complaints, if any.
pub fn promtool_check(exposition: &str) -> Result<(), String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("run promtool (apt-get install prometheus): {e}"))?;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(exposition.as_bytes())
        .map_err(|e| format!("feed promtool: {e}"))?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && text.trim().is_empty() {
        Ok(())
    } else {
        Err(text)
    }
}
