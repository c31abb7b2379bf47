//! The fake node of the deploy tests: a node's root filesystem in a temp
//! dir, `install.sh` run on it under dash or busybox, its `watch` loop, and
//! the configurations a node starts with.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use portmap_tests::plugin_bin;
use portmap_tests::plugins::workspace_root;
use portmap_tests::tmp::TempDir;
use serde_json::{Value, json};

/// Upper bound for the watch loop to react (it runs every second here);
/// never a timing assertion.
pub(crate) const BOUND: Duration = Duration::from_secs(20);

pub(crate) const BIN_DIR: &str = "opt/cni/bin";
pub(crate) const NET_DIR: &str = "etc/cni/net.d";
pub(crate) const PIN_ROOT: &str = "sys/fs/bpf/ebpf-portmap";

/// util-linux's setpriv, by path: the busybox runs have their own PATH.
pub(crate) const SETPRIV: &str = "/usr/bin/setpriv";

/// The applets install.sh may use; under busybox PATH holds only these.
pub(crate) const APPLETS: [&str; 8] = ["sh", "cp", "cmp", "mv", "chmod", "rm", "ls", "sleep"];

pub(crate) fn script() -> PathBuf {
    workspace_root().join("deploy/install.sh")
}

pub(crate) fn busybox() -> PathBuf {
    ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
        .expect("busybox is missing: `cargo xtask setup` installs busybox-static")
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Shell {
    /// Debian's /bin/sh.
    Dash,
    /// The image's shell and tools.
    Busybox,
}

pub(crate) const SHELLS: [Shell; 2] = [Shell::Dash, Shell::Busybox];

/// A node's root filesystem in a temp dir: the CNI directories, bpffs.
pub(crate) struct FakeNode {
    root: TempDir,
    /// PATH for the busybox runs: links to busybox's applets only.
    applets: TempDir,
}

impl FakeNode {
    pub(crate) fn new() -> FakeNode {
        let node = FakeNode::bare();
        for dir in [BIN_DIR, NET_DIR, "sys/fs/bpf"] {
            fs::create_dir_all(node.path(dir)).expect("creating the node's directories");
        }
        node
    }

    /// No directories at all (nothing mounted).
    pub(crate) fn bare() -> FakeNode {
        let applets = TempDir::new("deploy-applets");
        let busybox = busybox();
        for applet in APPLETS {
            std::os::unix::fs::symlink(&busybox, applets.path().join(applet))
                .expect("linking a busybox applet");
        }
        FakeNode {
            root: TempDir::new("deploy-node"),
            applets,
        }
    }

    pub(crate) fn path(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    pub(crate) fn config(&self, name: &str) -> PathBuf {
        self.path(NET_DIR).join(name)
    }

    pub(crate) fn plugin(&self) -> PathBuf {
        self.path(BIN_DIR).join("ebpf-portmap")
    }

    /// Writes a configuration the way a main plugin does (temp + rename).
    pub(crate) fn write_config(&self, name: &str, text: &str) {
        let temp = self.path(NET_DIR).join(format!(".{name}.writing"));
        fs::write(&temp, text).expect("writing a config");
        fs::rename(&temp, self.config(name)).expect("renaming a config into place");
    }

    pub(crate) fn read_json(&self, name: &str) -> Value {
        let bytes = fs::read(self.config(name))
            .unwrap_or_else(|e| panic!("reading {name}: {e}\n{:#?}", self.snapshot()));
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"))
    }

    /// Every file and directory under the root: mode and contents.
    pub(crate) fn snapshot(&self) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
        snapshot_of(self.root.path())
    }

    /// Every file and directory of the configuration directory.
    pub(crate) fn net_snapshot(&self) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
        snapshot_of(&self.path(NET_DIR))
    }

    /// `sh install.sh <action>` as the container runs it, with `env` on top.
    pub(crate) fn command(&self, shell: Shell, action: &str, env: &[(&str, &str)]) -> Command {
        let mut command = match shell {
            Shell::Dash => {
                let mut command = Command::new("/bin/sh");
                command.env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
                command
            }
            Shell::Busybox => {
                let mut command = Command::new(self.applets.path().join("sh"));
                command.env("PATH", self.applets.path());
                command
            }
        };
        command
            .arg(script())
            .arg(action)
            .env_remove("EPM_ACTION")
            .env_remove("EPM_PLUGIN_CONF")
            .env_remove("EPM_CNI_NETWORK")
            .env_remove("CNI_COMMAND")
            .env("HOST_ROOT", self.root.path())
            .env("EPM_BINARY", plugin_bin());
        for (key, value) in env {
            command.env(key, value);
        }
        command
    }

    pub(crate) fn run(&self, shell: Shell, action: &str, env: &[(&str, &str)]) -> Run {
        let out = self
            .command(shell, action, env)
            .output()
            .unwrap_or_else(|e| panic!("running install.sh {action} under {shell:?}: {e}"));
        Run {
            what: format!("install.sh {action} under {shell:?}"),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

pub(crate) fn snapshot_of(dir: &Path) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in fs::read_dir(&current).expect("listing the fake node") {
            let path = entry.expect("a directory entry").path();
            let meta = fs::symlink_metadata(&path).expect("stat");
            let contents = if meta.is_dir() {
                pending.push(path.clone());
                Vec::new()
            } else {
                fs::read(&path).expect("reading a file")
            };
            let relative = path.strip_prefix(dir).expect("under dir").to_path_buf();
            files.insert(relative, (meta.mode(), contents));
        }
    }
    files
}

/// (inode, mtime): a file rewritten by rename gets a new inode.
pub(crate) fn identity(path: &Path) -> (u64, i64, i64) {
    let meta = fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (meta.ino(), meta.mtime(), meta.mtime_nsec())
}

pub(crate) struct Run {
    pub(crate) what: String,
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Run {
    pub(crate) fn expect_code(&self, code: i32) -> &Run {
        assert_eq!(
            self.code,
            Some(code),
            "{} exited {:?}, expected {code}\nstdout:\n{}stderr:\n{}",
            self.what,
            self.code,
            self.stdout,
            self.stderr
        );
        self
    }

    pub(crate) fn ok(&self) -> &Run {
        self.expect_code(0)
    }

    pub(crate) fn says(&self, text: &str) -> &Run {
        assert!(
            self.stdout.contains(text) || self.stderr.contains(text),
            "{} should say {text:?}\nstdout:\n{}stderr:\n{}",
            self.what,
            self.stdout,
            self.stderr
        );
        self
    }
}

pub(crate) fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).expect("JSON") + "\n"
}

/// A bridge + host-local network with no port plugin, as `cni.dev` shows it.
pub(crate) fn bridge_list() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "mynet",
        "plugins": [{
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": true,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]],
                     "routes": [{"dst": "0.0.0.0/0"}]}
        }]
    })
}

/// kindnet's conflist (as a kind node has it), tab-indented like the real one.
pub(crate) const KINDNET: &str = "{\n\t\"cniVersion\": \"0.3.1\",\n\t\"name\": \"kindnet\",\n\t\"plugins\": [\n\t{\n\t\t\"type\": \"ptp\",\n\t\t\"ipMasq\": false,\n\t\t\"ipam\": {\n\t\t\t\"type\": \"host-local\",\n\t\t\t\"dataDir\": \"/run/cni-ipam-state\",\n\t\t\t\"routes\": [ { \"dst\": \"0.0.0.0/0\" } ],\n\t\t\t\"ranges\": [ [ { \"subnet\": \"10.244.1.0/24\" } ] ]\n\t\t},\n\t\t\"mtu\": 1500\n\t},\n\t{\n\t\t\"type\": \"portmap\",\n\t\t\"capabilities\": {\n\t\t\t\"portMappings\": true\n\t\t}\n\t}\n\t]\n}\n";

pub(crate) fn our_default_entry() -> Value {
    json!({"type": "ebpf-portmap", "capabilities": {"portMappings": true}})
}

pub(crate) struct Watch {
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
}

impl Watch {
    pub(crate) fn log_text(&self) -> String {
        let mut text = String::new();
        fs::File::open(&self.log)
            .and_then(|mut file| file.read_to_string(&mut text))
            .expect("reading the watch log");
        text
    }

    /// Waits until the log says `text` once more than it did and `done()`.
    pub(crate) fn wait_for(&mut self, shell: Shell, text: &str, done: impl Fn() -> bool) {
        let started = Instant::now();
        let already = self.log_text().matches(text).count();
        loop {
            let log = self.log_text();
            if log.matches(text).count() > already && done() {
                return;
            }
            if let Some(status) = self.child.try_wait().expect("wait") {
                panic!("{shell:?}: watch exited {status}:\n{log}");
            }
            assert!(
                started.elapsed() < BOUND,
                "{shell:?}: watch did not say {text:?}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
