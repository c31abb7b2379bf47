//! Network namespaces owned by a test.
//!
//! A [`NetNs`] is created with `ip netns add` (so it shows up in `ip netns list`
//! while it exists) and deleted on drop. Code runs inside it in two ways, both
//! switching the network namespace only:
//! - [`NetNs::run`]: a closure on a fresh thread that first calls
//!   `setns(fd, CLONE_NEWNET)`; sockets created there belong to the namespace
//!   and stay in it when handed back to the caller;
//! - [`NetNs::command`]: a [`Command`] whose child calls `setns` in `pre_exec`.
//!
//! Never `ip netns exec`: it also unshares the mount namespace and remounts
//! `/sys`, which hides the bpffs mounted at `/sys/fs/bpf` from the child.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::naming::{NETNS_RUN_DIR, reap_stale, unique_name};

/// Serialises `ip netns add/del` inside this process: the first `add` sets up
/// the shared `/run/netns` mount, and two racing first calls can stack mounts.
static NETNS_LOCK: Mutex<()> = Mutex::new(());

/// A named network namespace, deleted when dropped.
#[derive(Debug)]
pub struct NetNs {
    path: PathBuf,
    handle: NsHandle,
}

/// A cheap, cloneable way into a namespace: holds an open fd of it, so the
/// namespace stays usable for as long as any handle lives (even after the
/// [`NetNs`] removed its name).
#[derive(Debug, Clone)]
pub struct NsHandle {
    name: Arc<str>,
    fd: Arc<OwnedFd>,
}

impl NetNs {
    /// Creates the namespace `<prefix>-<role>-<pid>-<n>` with its loopback up.
    ///
    /// # Panics
    /// If `ip netns add` fails (not root, no iproute2).
    pub fn new(role: &str) -> NetNs {
        reap_stale();
        let name = unique_name(role);
        {
            let _guard = NETNS_LOCK
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            add_netns(&name);
        }
        let path = Path::new(NETNS_RUN_DIR).join(&name);
        // From here on, a panic drops `ns`, which deletes the namespace again.
        let ns = match File::open(&path) {
            Ok(file) => NetNs {
                path,
                handle: NsHandle {
                    name: name.into(),
                    fd: Arc::new(OwnedFd::from(file)),
                },
            },
            Err(e) => {
                delete_netns(&name);
                panic!("opening {}: {e}", path.display());
            }
        };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// The name shown by `ip netns list`.
    pub fn name(&self) -> &str {
        &self.handle.name
    }

    /// `/run/netns/<name>`: what CNI_NETNS and `ip ... netns <name>` expect.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A handle that keeps the namespace reachable independently of `self`.
    pub fn handle(&self) -> NsHandle {
        self.handle.clone()
    }

    /// Runs `f` on a fresh thread inside this namespace and returns its value.
    /// A panic in `f` is propagated. See [`NsHandle::run`].
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.handle.run(f)
    }

    /// A command whose child runs inside this namespace. See [`NsHandle::command`].
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        self.handle.command(program)
    }

    /// Runs `program args` inside the namespace and returns its stdout.
    ///
    /// # Panics
    /// If it cannot be started or exits non-zero; the message has its stderr.
    pub fn exec(&self, program: &str, args: &[&str]) -> String {
        self.handle.exec(program, args)
    }

    /// `ip args...` inside the namespace; returns stdout, panics with stderr
    /// on failure. See [`NsHandle::ip`].
    pub fn ip(&self, args: &[&str]) -> String {
        self.handle.ip(args)
    }

    /// Makes veth `name` here, its peer `peer` in `other`: both down.
    pub fn add_veth_to(&self, name: &str, peer: &str, other: &NetNs) {
        self.ip(&[
            "link",
            "add",
            name,
            "type",
            "veth",
            "peer",
            "name",
            peer,
            "netns",
            other.name(),
        ]);
    }

    /// Sets a sysctl of this namespace (`net.ipv4.ip_forward` or `net/ipv4/ip_forward`).
    pub fn sysctl(&self, key: &str, value: &str) {
        self.handle.sysctl(key, value);
    }

    /// Reads a sysctl of this namespace.
    pub fn read_sysctl(&self, key: &str) -> String {
        self.handle.read_sysctl(key)
    }

    /// Best-effort state dump for failure messages: links, addresses, routes,
    /// sockets. Never panics.
    pub fn diagnostics(&self) -> String {
        self.handle.diagnostics(&[
            &["ip", "-d", "link", "show"],
            &["ip", "addr", "show"],
            &["ip", "route", "show"],
            &["ip", "-6", "route", "show"],
            &["ss", "-tuanH"],
        ])
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        delete_netns(&self.handle.name);
    }
}

/// Set once `/run/netns` is known to be a mount point of its own, which
/// the first `ip netns add` on the machine makes it (and shared, so that
/// namespaces mounted later show in every mount namespace).
static RUN_DIR_MOUNTED: AtomicBool = AtomicBool::new(false);

/// `ip netns add name`, in the process once `ip` has set up `/run/netns`
/// (see [`crate::rtnl`] for why): the file, a thread in a new network
/// namespace, and the bind mount of that namespace onto the file, as `ip`
/// does them.
fn add_netns(name: &str) {
    if !RUN_DIR_MOUNTED.load(Ordering::Relaxed) && !run_dir_is_mount_point() {
        run_checked(
            Command::new("ip").args(["netns", "add", name]),
            "in the root namespace",
        );
        RUN_DIR_MOUNTED.store(run_dir_is_mount_point(), Ordering::Relaxed);
        return;
    }
    RUN_DIR_MOUNTED.store(true, Ordering::Relaxed);
    // As `ip` does on every add: the mount stays shared, so that the
    // namespace shows in mount namespaces made after it (runtimes').
    if let Err(e) = mount(
        Path::new("none"),
        Path::new(NETNS_RUN_DIR),
        libc::MS_SHARED | libc::MS_REC,
    ) {
        panic!("making {NETNS_RUN_DIR} a shared mount (as ip netns add does) failed: {e}");
    }
    let path = Path::new(NETNS_RUN_DIR).join(name);
    let made = File::options()
        .write(true)
        .create_new(true)
        .mode(0o0)
        .open(&path)
        .and_then(|_| {
            std::thread::scope(|scope| {
                scope
                    .spawn(|| {
                        // SAFETY: unshare(2) changes this thread's network
                        // namespace only; the thread ends right after.
                        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                            return Err(io::Error::last_os_error());
                        }
                        mount(Path::new("/proc/thread-self/ns/net"), &path, libc::MS_BIND)
                    })
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
        });
    if let Err(e) = made {
        let _ = std::fs::remove_file(&path);
        panic!("ip netns add {name} (in the process) failed: {e}");
    }
}

/// Whether `/proc/self/mountinfo` has a mount at `/run/netns`.
fn run_dir_is_mount_point() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|table| {
        table
            .lines()
            .any(|line| line.split(' ').nth(4) == Some(NETNS_RUN_DIR))
    })
}

/// mount(2) with no file system type and no data: a bind mount
/// (`MS_BIND`) or a change of `target`'s propagation (`source` "none").
fn mount(source: &Path, target: &Path, flags: libc::c_ulong) -> io::Result<()> {
    let source = path_cstring(source)?;
    let target = path_cstring(target)?;
    let none = c"none";
    // SAFETY: every pointer is a NUL-terminated string that outlives the
    // call; neither a bind mount nor a propagation change reads data.
    let done = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            none.as_ptr(),
            flags,
            std::ptr::null(),
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn path_cstring(path: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a path"))
}

/// `ip netns del name` in the process: the lazy unmount of the namespace's
/// file and its removal, as `ip` does them.
fn delete_netns(name: &str) {
    let _guard = NETNS_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let path = Path::new(NETNS_RUN_DIR).join(name);
    let unmounted = path_cstring(&path).and_then(|target| {
        // SAFETY: `target` is a NUL-terminated string that outlives the call.
        if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    });
    match unmounted.and_then(|()| std::fs::remove_file(&path)) {
        Ok(()) => {}
        Err(e) => eprintln!("harness: `ip netns del {name}` (in the process) failed: {e}"),
    }
}

/// Moves the calling thread into the network namespace `fd`. Only a syscall, so
/// it is safe to call between fork and exec.
fn enter(fd: RawFd) -> io::Result<()> {
    // SAFETY: setns only reads the fd and changes this thread's namespace.
    if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl NsHandle {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `f` on a fresh thread that first enters this namespace (network
    /// namespace only). Sockets created by `f` belong to the namespace; return a
    /// bound listener to start a server there. A panic in `f` is propagated.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let fd = self.fd.as_raw_fd();
        let name = &*self.name;
        std::thread::scope(|scope| {
            let thread = std::thread::Builder::new()
                .name("netns-run".to_owned())
                .spawn_scoped(scope, move || {
                    enter(fd).unwrap_or_else(|e| panic!("setns into netns {name}: {e}"));
                    f()
                })
                .unwrap_or_else(|e| panic!("spawning a thread for netns {name}: {e}"));
            match thread.join() {
                Ok(value) => value,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Starts `command` in this namespace without forking the caller: the
    /// calling thread enters the namespace, spawns (std uses `posix_spawn`,
    /// a `CLONE_VM | CLONE_VFORK` clone, when the command has no `pre_exec`
    /// hook and names its program by path), and returns to its own. A
    /// forked child of a large process spends milliseconds of CPU time
    /// tearing down its copy of the parent's address space at exec, which
    /// `wait4` charges to the child: a measurement of a plugin's CPU time
    /// would then grow with the measuring process's memory.
    ///
    /// # Panics
    /// If the thread cannot return to its own namespace (it would go on in
    /// the wrong one).
    pub fn spawn(&self, command: &mut Command) -> io::Result<Child> {
        let home = File::open("/proc/thread-self/ns/net")?;
        enter(self.fd.as_raw_fd())?;
        let child = command.spawn();
        enter(home.as_raw_fd())
            .unwrap_or_else(|e| panic!("setns back from netns {}: {e}", self.name));
        child
    }

    /// A command whose child enters this namespace (network only) before exec.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new(program);
        let fd = Arc::clone(&self.fd);
        // SAFETY: the hook only calls setns(2), which is async-signal-safe, and
        // allocates nothing.
        unsafe {
            command.pre_exec(move || enter(fd.as_raw_fd()));
        }
        command
    }

    /// `ip args...` inside the namespace, from a thread in it; returns
    /// stdout, panics with stderr on failure. The forms
    /// [`crate::rtnl::Request`] takes (links up, addresses, routes, veths)
    /// are sent over rtnetlink instead of running `ip` (see
    /// [`crate::rtnl::ip_here`]).
    pub fn ip(&self, args: &[&str]) -> String {
        let place = format!("in netns {}", self.name);
        self.run(|| crate::rtnl::ip_here(args, &place))
    }

    /// Runs `program args` inside the namespace and returns its stdout.
    ///
    /// # Panics
    /// If it cannot be started or exits non-zero; the message has its stderr.
    pub fn exec(&self, program: &str, args: &[&str]) -> String {
        let out = run_checked(
            self.command(program).args(args),
            &format!("in netns {}", self.name),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Writes `/proc/sys/<key>` from a thread inside the namespace (net sysctls
    /// are resolved against the opening thread's namespace).
    pub fn sysctl(&self, key: &str, value: &str) {
        let path = sysctl_path(key);
        self.run(|| std::fs::write(&path, value))
            .unwrap_or_else(|e| panic!("sysctl {key}={value} in netns {}: {e}", self.name));
    }

    /// Reads `/proc/sys/<key>` inside the namespace, trimmed.
    pub fn read_sysctl(&self, key: &str) -> String {
        let path = sysctl_path(key);
        self.run(|| std::fs::read_to_string(&path))
            .unwrap_or_else(|e| panic!("reading sysctl {key} in netns {}: {e}", self.name))
            .trim()
            .to_owned()
    }

    /// Runs each command in the namespace and concatenates headers, stdout and
    /// stderr. Never panics: meant for failure messages.
    pub fn diagnostics(&self, commands: &[&[&str]]) -> String {
        let mut report = String::new();
        for argv in commands {
            let Some((program, args)) = argv.split_first() else {
                continue;
            };
            report.push_str(&format!("--- [{}] {}\n", self.name, argv.join(" ")));
            match self.command(program).args(args).output() {
                Ok(out) => {
                    report.push_str(&String::from_utf8_lossy(&out.stdout));
                    report.push_str(&String::from_utf8_lossy(&out.stderr));
                }
                Err(e) => report.push_str(&format!("(could not run: {e})\n")),
            }
        }
        report
    }
}

/// `net.ipv4.ip_forward` → `/proc/sys/net/ipv4/ip_forward`; a key that already
/// contains `/` is taken as a path below `/proc/sys` (interface names may
/// contain dots).
pub fn sysctl_path(key: &str) -> PathBuf {
    let relative = if key.contains('/') {
        key.to_owned()
    } else {
        key.replace('.', "/")
    };
    Path::new("/proc/sys").join(relative.trim_start_matches('/'))
}

fn run_checked(command: &mut Command, place: &str) -> Output {
    let shown = format!("{command:?}");
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("could not run {shown} {place}: {e}"));
    if !out.status.success() {
        panic!(
            "{shown} {place} failed ({}):\nstderr: {}\nstdout: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysctl_keys_map_to_proc_paths() {
        assert_eq!(
            sysctl_path("net.ipv4.ip_forward"),
            Path::new("/proc/sys/net/ipv4/ip_forward")
        );
        assert_eq!(
            sysctl_path("net/ipv6/conf/eth0.100/accept_dad"),
            Path::new("/proc/sys/net/ipv6/conf/eth0.100/accept_dad")
        );
    }
}
