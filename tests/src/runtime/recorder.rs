//! The one CNI call recorder every runtime's harness uses: a directory of
//! `/bin/sh` shims, one per plugin, each of which records what the runtime
//! sent (the `CNI_*` environment, stdin) and how the plugin answered (exit
//! code, stdout, stderr), then gives the runtime exactly that answer.
//! Delegated plugins are recorded too (bridge runs host-local itself), which
//! a runtime's own view never shows.
//!
//! A call is five files under `calls/`, `<ns-timestamp>-<pid>-<plugin>` with
//! the extensions `env`, `stdin`, `stdout`, `stderr` and `rc`; `rc` is
//! written last, so a call without it has not finished (or was killed).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// One plugin execution as a shim recorded it.
#[derive(Debug, Clone, PartialEq)]
pub struct CniCall {
    /// The plugin's file name (`bridge`, `ebpf-portmap`, ...).
    pub plugin: String,
    pub command: String,
    pub container_id: String,
    /// `CNI_NETNS` (empty on the DEL that RemovePodSandbox sends).
    pub netns: String,
    pub ifname: String,
    /// `CNI_ARGS` as sent (`K8S_POD_NAMESPACE=...;...`).
    pub args: String,
    /// The network configuration on stdin (`Null` if it was not JSON).
    pub config: Value,
    /// `None` while the plugin runs (or if it was killed).
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CniCall {
    /// Whether the configuration carried a `prevResult`.
    pub fn has_prev_result(&self) -> bool {
        self.config.get("prevResult").is_some_and(|v| !v.is_null())
    }

    /// The value of `key` in `CNI_ARGS`.
    pub fn cni_arg(&self, key: &str) -> Option<&str> {
        self.args
            .split(';')
            .filter_map(|pair| pair.split_once('='))
            .find_map(|(k, v)| (k == key).then_some(v))
    }

    /// `runtimeConfig.portMappings` as sent.
    pub fn port_mappings(&self) -> &Value {
        &self.config["runtimeConfig"]["portMappings"]
    }

    /// The `code` of the CNI error result the plugin printed, if it printed
    /// one.
    pub fn error_code(&self) -> Option<u64> {
        let result: Value = serde_json::from_str(&self.stdout).unwrap_or(Value::Null);
        result["code"].as_u64()
    }

    /// One line for failure messages.
    pub fn summary(&self) -> String {
        let code = self
            .exit_code
            .map_or_else(|| "running".to_owned(), |c| format!("exit {c}"));
        let mut line = format!(
            "{} {} {} netns={:?} prevResult={} {code}",
            self.plugin,
            self.command,
            short(&self.container_id),
            self.netns,
            self.has_prev_result()
        );
        if self.exit_code != Some(0) && self.exit_code.is_some() {
            let _ = write!(line, ": {}", self.error_message());
        }
        line
    }

    /// The `msg` of the CNI error result the plugin printed (else its
    /// stdout, then its stderr, on one line).
    pub fn error_message(&self) -> String {
        let result: Value = serde_json::from_str(&self.stdout).unwrap_or(Value::Null);
        match result["msg"].as_str() {
            Some(msg) => msg.trim().to_owned(),
            None if !self.stdout.trim().is_empty() => {
                self.stdout.split_whitespace().collect::<Vec<_>>().join(" ")
            }
            None => self.stderr.split_whitespace().collect::<Vec<_>>().join(" "),
        }
    }
}

/// The first 12 characters of an ID, as tools show it.
pub fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// A directory of recording shims (see the module docs). The directory
/// belongs to the caller, who removes it.
#[derive(Debug)]
pub struct Recorder {
    bin: PathBuf,
    calls: PathBuf,
}

impl Recorder {
    /// Writes into `dir/bin` one shim per `(name, real binary)` of
    /// `plugins`, recording into `dir/calls`. The shims are new files: a
    /// runtime writing to its bin directory never reaches `real`.
    ///
    /// # Panics
    /// If a directory or a shim cannot be written.
    pub fn install<'a>(
        dir: &Path,
        plugins: impl IntoIterator<Item = (&'a str, &'a Path)>,
    ) -> Recorder {
        let recorder = Recorder {
            bin: dir.join("bin"),
            calls: dir.join("calls"),
        };
        for sub in [&recorder.bin, &recorder.calls] {
            std::fs::create_dir_all(sub)
                .unwrap_or_else(|e| panic!("creating {}: {e}", sub.display()));
        }
        for (name, real) in plugins {
            let shim = recorder.bin.join(name);
            std::fs::write(&shim, shim_script(name, real, &recorder.calls))
                .unwrap_or_else(|e| panic!("writing shim {}: {e}", shim.display()));
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755))
                .unwrap_or_else(|e| panic!("chmod {}: {e}", shim.display()));
        }
        recorder
    }

    /// The directory of shims: the runtime's CNI bin directory.
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// Every call recorded so far, oldest first.
    pub fn calls(&self) -> Vec<CniCall> {
        read_calls(&self.calls)
    }

    /// The calls of `plugin` running `command` for the CNI ID `id`.
    pub fn calls_of(&self, plugin: &str, command: &str, id: &str) -> Vec<CniCall> {
        self.calls()
            .into_iter()
            .filter(|c| c.plugin == plugin && c.command == command && c.container_id == id)
            .collect()
    }
}

/// The shim for plugin `name`: records the call under `calls` as
/// `<ns-timestamp>-<pid>-<name>.{env,stdin,stdout,stderr,rc}` (`rc` last:
/// a call without it has not finished), runs `real` with the same stdin and
/// arguments and gives the runtime its stdout, stderr and exit code.
pub fn shim_script(name: &str, real: &Path, calls: &Path) -> String {
    let quote = |path: &Path| {
        let text = path
            .to_str()
            .unwrap_or_else(|| panic!("{} is not UTF-8", path.display()));
        assert!(!text.contains('\''), "{text} contains a single quote");
        format!("'{text}'")
    };
    assert!(
        name.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "plugin name {name:?}"
    );
    format!(
        r#"#!/bin/sh
# Records one CNI call for the end-to-end tests, then runs the plugin.
rec={calls}/$(date +%s%N)-$$-{name}
cat > "$rec.stdin"
{{
  printf 'CNI_COMMAND=%s\n' "$CNI_COMMAND"
  printf 'CNI_CONTAINERID=%s\n' "$CNI_CONTAINERID"
  printf 'CNI_NETNS=%s\n' "$CNI_NETNS"
  printf 'CNI_IFNAME=%s\n' "$CNI_IFNAME"
  printf 'CNI_ARGS=%s\n' "$CNI_ARGS"
}} > "$rec.env"
{real} "$@" < "$rec.stdin" > "$rec.stdout" 2> "$rec.stderr"
rc=$?
cat "$rec.stdout"
cat "$rec.stderr" >&2
echo "$rc" > "$rec.rc"
exit "$rc"
"#,
        calls = quote(calls),
        real = quote(real),
    )
}

/// Reads every call the shims recorded in `dir`, oldest first.
pub fn read_calls(dir: &Path) -> Vec<CniCall> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut records: Vec<((u128, u32), String, PathBuf)> = entries
        .flatten()
        .filter_map(|entry| {
            let file = entry.file_name().into_string().ok()?;
            let stem = file.strip_suffix(".env")?;
            let mut parts = stem.splitn(3, '-');
            let at: u128 = parts.next()?.parse().ok()?;
            let pid: u32 = parts.next()?.parse().ok()?;
            let plugin = parts.next()?.to_owned();
            Some(((at, pid), plugin, dir.join(stem)))
        })
        .collect();
    records.sort();
    records
        .into_iter()
        .map(|(_, plugin, stem)| {
            let read =
                |ext: &str| std::fs::read_to_string(stem.with_extension(ext)).unwrap_or_default();
            parse_call(
                plugin,
                &read("env"),
                &read("stdin"),
                &read("rc"),
                read("stdout"),
                read("stderr"),
            )
        })
        .collect()
}

/// One recorded call from its files' contents.
pub fn parse_call(
    plugin: String,
    env: &str,
    stdin: &str,
    rc: &str,
    stdout: String,
    stderr: String,
) -> CniCall {
    let vars: BTreeMap<&str, &str> = env.lines().filter_map(|l| l.split_once('=')).collect();
    let var = |key: &str| vars.get(key).copied().unwrap_or_default().to_owned();
    CniCall {
        plugin,
        command: var("CNI_COMMAND"),
        container_id: var("CNI_CONTAINERID"),
        netns: var("CNI_NETNS"),
        ifname: var("CNI_IFNAME"),
        args: var("CNI_ARGS"),
        config: serde_json::from_str(stdin).unwrap_or(Value::Null),
        exit_code: rc.trim().parse().ok(),
        stdout,
        stderr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tmp::TempDir;

    #[test]
    fn shims_record_then_answer_as_the_plugin() {
        let script = shim_script(
            "ebpf-portmap",
            Path::new("/tmp/c/real/ebpf-portmap"),
            Path::new("/tmp/c/calls"),
        );
        assert!(script.starts_with("#!/bin/sh\n"));
        assert!(
            script.contains("rec='/tmp/c/calls'/$(date +%s%N)-$$-ebpf-portmap\n"),
            "{script}"
        );
        assert!(
            script.contains(
                "'/tmp/c/real/ebpf-portmap' \"$@\" < \"$rec.stdin\" > \"$rec.stdout\" 2> \"$rec.stderr\"\n"
            ),
            "{script}"
        );
        assert!(script.ends_with("echo \"$rc\" > \"$rec.rc\"\nexit \"$rc\"\n"));
    }

    #[test]
    fn recorded_calls_parse() {
        let call = parse_call(
            "ebpf-portmap".into(),
            "CNI_COMMAND=DEL\nCNI_CONTAINERID=abc\nCNI_NETNS=\nCNI_IFNAME=eth0\nCNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=e2e;K8S_POD_NAME=web\n",
            r#"{"type":"ebpf-portmap","runtimeConfig":{"portMappings":[{"HostPort":8080}]}}"#,
            "0\n",
            String::new(),
            String::new(),
        );
        assert_eq!(call.command, "DEL");
        assert_eq!(call.container_id, "abc");
        assert_eq!(call.netns, "");
        assert_eq!(call.exit_code, Some(0));
        assert!(!call.has_prev_result());
        assert_eq!(call.cni_arg("K8S_POD_NAME"), Some("web"));
        assert_eq!(call.cni_arg("K8S_POD_UID"), None);
        assert_eq!(call.port_mappings()[0]["HostPort"], 8080);
        let running = parse_call(
            "bridge".into(),
            "",
            "not json",
            "",
            String::new(),
            String::new(),
        );
        assert_eq!((running.exit_code, running.config), (None, Value::Null));
        let refused = parse_call(
            "ebpf-portmap".into(),
            "CNI_COMMAND=ADD\n",
            "{}",
            "1\n",
            r#"{"code":100,"msg":"port taken"}"#.into(),
            String::new(),
        );
        assert_eq!(
            (refused.error_code(), refused.error_message().as_str()),
            (Some(100), "port taken")
        );
    }

    #[test]
    fn calls_are_read_in_the_order_they_started() {
        let dir = TempDir::new("rec-unit");
        for (stem, command) in [
            ("1700000000000000002-10-ebpf-portmap", "DEL"),
            ("1700000000000000001-11-bridge", "ADD"),
        ] {
            std::fs::write(
                dir.path().join(format!("{stem}.env")),
                format!("CNI_COMMAND={command}\n"),
            )
            .unwrap();
            std::fs::write(dir.path().join(format!("{stem}.rc")), "0\n").unwrap();
        }
        std::fs::write(dir.path().join("unrelated.txt"), "").unwrap();
        let calls = read_calls(dir.path());
        let seen: Vec<(&str, &str)> = calls
            .iter()
            .map(|c| (c.plugin.as_str(), c.command.as_str()))
            .collect();
        assert_eq!(seen, [("bridge", "ADD"), ("ebpf-portmap", "DEL")]);
    }

    /// A real shim in front of a small script: the caller gets the plugin's
    /// answer (stdout, stderr, exit code), the recorder the whole call.
    #[test]
    fn a_shim_records_a_real_execution() {
        let dir = TempDir::new("rec-unit");
        let real = dir.path().join("real-plugin");
        std::fs::write(
            &real,
            "#!/bin/sh\nread -r line\necho \"out:$line\"\necho err >&2\nexit 3\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).unwrap();
        let recorder = Recorder::install(dir.path(), [("host-local", real.as_path())]);
        let mut child = std::process::Command::new(recorder.bin_dir().join("host-local"))
            .env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", "c1")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        child.stdin.take().unwrap().write_all(b"{}\n").unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "out:{}\n");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
        let calls = recorder.calls_of("host-local", "ADD", "c1");
        assert_eq!(calls.len(), 1, "{:?}", recorder.calls());
        assert_eq!(calls[0].exit_code, Some(3));
        assert_eq!(calls[0].stdout, "out:{}\n");
        assert_eq!(calls[0].config, serde_json::json!({}));
    }
}
