//! A real firewalld in a test node's network namespace, never the root
//! namespace's: Debian's package (nftables backend, the stock zones from
//! `/usr/lib/firewalld`), its own D-Bus system bus on a private socket (a
//! path socket is the same in every network namespace) and its own
//! configuration directory, stopped by its pid (`CleanupOnExit=yes`
//! removes its rules). One at a time on the machine: every instance uses
//! `/run/firewalld`, which is removed afterwards only if this harness made
//! it.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::NetNs;
use crate::stop::terminate;
use crate::tmp::TempDir;

const RUN_DIR: &str = "/run/firewalld";
/// Held while an instance runs: they share [`RUN_DIR`].
const LOCK: &str = "/run/lock/ebpf-portmap-tests-firewalld.lock";
/// How long firewalld may take to say `running` (Python, a full ruleset).
const STARTS_WITHIN: Duration = Duration::from_secs(60);

/// A running firewalld and its bus.
pub struct Firewalld {
    daemon: Child,
    bus: Child,
    bus_address: String,
    made_run_dir: bool,
    dir: TempDir,
    _lock: File,
}

impl Firewalld {
    /// Starts firewalld in `ns` with `DefaultZone=public` and waits until
    /// `firewall-cmd --state` says it is running.
    ///
    /// # Panics
    /// If the package is missing (`cargo xtask setup` installs it) or it
    /// does not start.
    pub fn start(ns: &NetNs) -> Firewalld {
        let lock = File::create(LOCK).unwrap_or_else(|e| panic!("{LOCK}: {e}"));
        // SAFETY: flock on an fd we own.
        let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(rc, 0, "flock {LOCK}: {}", std::io::Error::last_os_error());
        let dir = TempDir::new("firewalld");
        let etc = dir.path().join("etc");
        std::fs::create_dir(&etc).expect("firewalld's config dir");
        std::fs::write(
            etc.join("firewalld.conf"),
            "DefaultZone=public\nFirewallBackend=nftables\nCleanupOnExit=yes\n",
        )
        .expect("firewalld.conf");
        let socket = dir.path().join("bus");
        let bus_config = dir.path().join("bus.conf");
        std::fs::write(&bus_config, bus_config_text(&socket)).expect("the bus's config");
        let bus = Command::new("dbus-daemon")
            .arg("--config-file")
            .arg(&bus_config)
            .args(["--nofork", "--nopidfile"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("dbus-daemon (package dbus-daemon): {e}"));
        let bus_address = format!("unix:path={}", socket.display());
        let deadline = Instant::now() + STARTS_WITHIN;
        while !socket.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let made_run_dir = !Path::new(RUN_DIR).exists();
        let daemon = ns
            .command("firewalld")
            .args(["--nofork", "--nopid", "--system-config"])
            .arg(&etc)
            .args(["--log-target", "file", "--log-file"])
            .arg(dir.path().join("log"))
            .env("DBUS_SYSTEM_BUS_ADDRESS", &bus_address)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("firewalld (package firewalld): {e}"));
        let firewalld = Firewalld {
            daemon,
            bus,
            bus_address,
            made_run_dir,
            dir,
            _lock: lock,
        };
        while Instant::now() < deadline {
            if firewalld
                .try_cmd(ns, &["--state"])
                .is_ok_and(|s| s.trim() == "running")
            {
                return firewalld;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "firewalld did not start within {STARTS_WITHIN:?}; its log:\n{}",
            std::fs::read_to_string(firewalld.log()).unwrap_or_default()
        );
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("log")
    }

    fn try_cmd(&self, ns: &NetNs, args: &[&str]) -> Result<String, String> {
        let out = ns
            .command("firewall-cmd")
            .args(args)
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.bus_address)
            .output()
            .map_err(|e| format!("firewall-cmd: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "firewall-cmd {args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// `firewall-cmd args` against this instance, from `ns`.
    ///
    /// # Panics
    /// If it fails.
    pub fn cmd(&self, ns: &NetNs, args: &[&str]) -> String {
        self.try_cmd(ns, args).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// A system bus that lets root own names and send anything, listening on
/// `socket` only.
fn bus_config_text(socket: &Path) -> String {
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="root"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"#,
        socket.display()
    )
}

impl Drop for Firewalld {
    fn drop(&mut self) {
        // SIGTERM: firewalld removes its ruleset (CleanupOnExit) first.
        terminate(&mut self.daemon, "firewalld", Duration::from_secs(10));
        terminate(
            &mut self.bus,
            "firewalld's dbus-daemon",
            Duration::from_secs(2),
        );
        if self.made_run_dir {
            let _ = std::fs::remove_dir_all(RUN_DIR);
        }
    }
}
