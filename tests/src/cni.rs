//! A conflist runner that invokes plugins the way libcni (the library inside
//! containerd, CRI-O and Podman) does.
//!
//! For each plugin of a list the runner builds the plugin's stdin config:
//! the plugin object, plus `cniVersion` and `name` from the list, plus
//! `runtimeConfig` holding only the capability args the plugin declares in its
//! `capabilities` map, plus `prevResult`. It sets `CNI_COMMAND`,
//! `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS` and `CNI_PATH` on top
//! of the inherited environment (empty where the command has no value, as
//! libcni does) and runs the binary found in the plugin directories inside the
//! node namespace.
//!
//! Verbs:
//! - ADD: in list order, `prevResult` = previous plugin's result, stops at the
//!   first failure; the final result is cached in memory per
//!   (network, container ID, ifname), as libcni caches it on disk.
//! - DEL: reverse order with `prevResult` = the cached ADD result (if any).
//!   Unlike libcni, which stops at the first failing plugin, every plugin runs
//!   and all failures are reported, so a test sees every teardown problem.
//!   The cache entry is dropped only when all plugins succeeded.
//! - CHECK: list order, `prevResult` = cached result (omitted if none, as in
//!   libcni); skipped if the list sets `disableCheck`; needs version >= 0.4.0.
//! - GC (1.1.0): first DEL of every cached attachment of this network that is
//!   not in the valid set (with its cached runtime args), then, for lists at
//!   version >= 1.1.0, GC to every plugin with `cni.dev/valid-attachments`;
//!   every step runs, all failures are reported. Skipped if `disableGC`.
//! - STATUS (1.1.0): every plugin in order, stops at the first failure; a no-op
//!   below version 1.1.0, as in libcni.
//! - VERSION: one plugin, stdin `{"cniVersion":"1.1.0"}`.
//!
//! Every invocation is recorded ([`CniRunner::calls`]) so tests can assert
//! that a plugin really ran. Each plugin run has a timeout (default
//! [`DEFAULT_PLUGIN_TIMEOUT`]) after which it is killed and reported.

// A CniFailure carries everything needed to debug a failed call (output,
// stderr, config sent); failures are rare, so its size does not matter.
#![allow(clippy::result_large_err, reason = "rich failure values, see above")]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use crate::netns::{NetNs, NsHandle};

/// How long one plugin run may take before it is killed: a hang detector,
/// not a speed limit.
pub const DEFAULT_PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

/// Sets the plugin timeout in whole seconds instead of
/// [`DEFAULT_PLUGIN_TIMEOUT`]. The VM tests set it: under emulation the
/// kernel's verifier takes tens of seconds over the programs a first ADD
/// loads, more while the host runs the rest of `cargo xtask test` beside.
pub const PLUGIN_TIMEOUT_ENV: &str = "EPM_PLUGIN_TIMEOUT_SECS";

/// The plugin timeout: [`PLUGIN_TIMEOUT_ENV`] if set, else the default.
///
/// # Panics
/// If the variable is set to anything but a positive whole number.
pub fn plugin_timeout() -> Duration {
    match std::env::var(PLUGIN_TIMEOUT_ENV) {
        Err(_) => DEFAULT_PLUGIN_TIMEOUT,
        Ok(text) => match text.parse::<u64>() {
            Ok(secs) if secs > 0 => Duration::from_secs(secs),
            _ => panic!("{PLUGIN_TIMEOUT_ENV}={text:?}: expected a positive number of seconds"),
        },
    }
}

/// The version libcni announces on stdin for VERSION.
pub const RUNNER_CNI_VERSION: &str = "1.1.0";

/// The key libcni uses to hand GC the attachments that must survive.
pub const VALID_ATTACHMENTS_KEY: &str = "cni.dev/valid-attachments";

/// A CNI verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CniCommand {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

impl CniCommand {
    /// The `CNI_COMMAND` value.
    pub fn as_str(self) -> &'static str {
        match self {
            CniCommand::Add => "ADD",
            CniCommand::Del => "DEL",
            CniCommand::Check => "CHECK",
            CniCommand::Gc => "GC",
            CniCommand::Status => "STATUS",
            CniCommand::Version => "VERSION",
        }
    }
}

impl fmt::Display for CniCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a conflist was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConflistError {
    #[error("a conflist must be a JSON object")]
    NotAnObject,
    #[error("conflist field `{field}` is missing or not a {expected}")]
    Field {
        field: &'static str,
        expected: &'static str,
    },
    #[error("plugin #{index} of the conflist is not an object with a string `type`")]
    Plugin { index: usize },
}

/// A validated network configuration list.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflist {
    json: Value,
}

impl Conflist {
    /// Checks the fields the runner relies on: `name`, `cniVersion` (strings)
    /// and `plugins` (an array of objects with a string `type`).
    pub fn from_json(json: Value) -> Result<Conflist, ConflistError> {
        let object = json.as_object().ok_or(ConflistError::NotAnObject)?;
        for field in ["name", "cniVersion"] {
            if !object.get(field).is_some_and(Value::is_string) {
                return Err(ConflistError::Field {
                    field,
                    expected: "string",
                });
            }
        }
        let plugins =
            object
                .get("plugins")
                .and_then(Value::as_array)
                .ok_or(ConflistError::Field {
                    field: "plugins",
                    expected: "array",
                })?;
        for (index, plugin) in plugins.iter().enumerate() {
            if !plugin.get("type").is_some_and(Value::is_string) || !plugin.is_object() {
                return Err(ConflistError::Plugin { index });
            }
        }
        Ok(Conflist { json })
    }

    pub fn name(&self) -> &str {
        self.json["name"].as_str().expect("validated in from_json")
    }

    pub fn cni_version(&self) -> &str {
        self.json["cniVersion"]
            .as_str()
            .expect("validated in from_json")
    }

    /// The plugin objects, in list order.
    pub fn plugins(&self) -> &[Value] {
        self.json["plugins"]
            .as_array()
            .expect("validated in from_json")
    }

    /// The `type` of each plugin, in list order.
    pub fn plugin_types(&self) -> Vec<&str> {
        self.plugins().iter().map(plugin_type).collect()
    }

    pub fn disable_check(&self) -> bool {
        self.json
            .get("disableCheck")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    pub fn disable_gc(&self) -> bool {
        self.json
            .get("disableGC")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    pub fn json(&self) -> &Value {
        &self.json
    }

    /// The same list at another `cniVersion`.
    pub fn with_cni_version(mut self, version: &str) -> Conflist {
        self.json["cniVersion"] = Value::from(version);
        self
    }
}

fn plugin_type(plugin: &Value) -> &str {
    plugin["type"]
        .as_str()
        .expect("validated in Conflist::from_json")
}

/// What the runtime knows about one attachment of a container to a network.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeAttachment {
    pub container_id: String,
    /// `CNI_NETNS`, e.g. `/run/netns/<name>`.
    pub netns_path: PathBuf,
    pub ifname: String,
    /// Capability args by capability name, e.g. `{"portMappings": [...]}`.
    /// `Null` means none.
    pub capability_args: Value,
    /// `CNI_ARGS` pairs (`K=V;K2=V2`), e.g. `K8S_POD_NAME`.
    pub cni_args: Vec<(String, String)>,
}

/// An attachment that GC must keep (`cni.dev/valid-attachments` entry).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GcAttachment {
    pub container_id: String,
    pub ifname: String,
}

impl From<&RuntimeAttachment> for GcAttachment {
    fn from(rt: &RuntimeAttachment) -> Self {
        GcAttachment {
            container_id: rt.container_id.clone(),
            ifname: rt.ifname.clone(),
        }
    }
}

impl GcAttachment {
    fn to_json(&self) -> Value {
        json!({ "containerID": self.container_id, "ifname": self.ifname })
    }
}

/// Builds the stdin config of one plugin for ADD, DEL and CHECK, as libcni's
/// `buildOneConfig`: plugin object + list `name` and `cniVersion` + optional
/// `prevResult` + `runtimeConfig` with the declared capabilities only (set only
/// when at least one declared capability has an arg; it then replaces any
/// `runtimeConfig` already in the plugin object).
pub fn plugin_config(
    list: &Conflist,
    plugin: &Value,
    capability_args: &Value,
    prev_result: Option<&Value>,
) -> Value {
    let mut config = inject_identity(list, plugin);
    let object = config.as_object_mut().expect("plugins are objects");
    if let Some(prev) = prev_result {
        object.insert("prevResult".to_owned(), prev.clone());
    }
    let runtime_config = runtime_config(plugin, capability_args);
    if !runtime_config.is_empty() {
        object.insert("runtimeConfig".to_owned(), Value::Object(runtime_config));
    }
    config
}

/// The capability args `plugin` declares with `true` in its `capabilities` map.
pub fn runtime_config(plugin: &Value, capability_args: &Value) -> Map<String, Value> {
    let mut runtime_config = Map::new();
    let (Some(capabilities), Some(args)) = (
        plugin.get("capabilities").and_then(Value::as_object),
        capability_args.as_object(),
    ) else {
        return runtime_config;
    };
    for (capability, enabled) in capabilities {
        if enabled.as_bool() == Some(true)
            && let Some(value) = args.get(capability)
        {
            runtime_config.insert(capability.clone(), value.clone());
        }
    }
    runtime_config
}

/// The stdin config of one plugin for GC: identity + valid attachments.
pub fn gc_plugin_config(list: &Conflist, plugin: &Value, valid: &[GcAttachment]) -> Value {
    let mut config = inject_identity(list, plugin);
    config[VALID_ATTACHMENTS_KEY] = Value::Array(valid.iter().map(GcAttachment::to_json).collect());
    config
}

/// The plugin object with the list's `name` and `cniVersion` (STATUS config).
pub fn inject_identity(list: &Conflist, plugin: &Value) -> Value {
    let mut config = plugin.clone();
    config["name"] = Value::from(list.name());
    config["cniVersion"] = Value::from(list.cni_version());
    config
}

/// `K=V;K2=V2`, the `CNI_ARGS` encoding.
pub fn cni_args_string(args: &[(String, String)]) -> String {
    args.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(";")
}

/// Whether the dotted version `version` is at least `minimum` (missing or
/// unparsable parts count as 0, as CNI versions are always `x.y.z`).
pub fn version_at_least(version: &str, minimum: &str) -> bool {
    fn parts(v: &str) -> [u64; 3] {
        let mut out = [0; 3];
        for (slot, part) in out.iter_mut().zip(v.split('.')) {
            *slot = part.parse().unwrap_or(0);
        }
        out
    }
    parts(version) >= parts(minimum)
}

/// Every IP address (without prefix length) in a CNI result's `ips`.
pub fn result_addresses(result: &Value) -> Vec<std::net::IpAddr> {
    result
        .get("ips")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.get("address")?.as_str()?.split('/').next()?.parse().ok())
        .collect()
}

/// Why the runner itself could not get a usable answer from a plugin.
#[derive(Debug, thiserror::Error)]
pub enum InvokeProblem {
    #[error("plugin binary not found in {dirs:?}")]
    NotFound { dirs: Vec<PathBuf> },
    #[error("could not start {path}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("waiting for the plugin")]
    Wait(#[source] std::io::Error),
    #[error("killed after running for {0:?}")]
    TimedOut(Duration),
    #[error("exited 0 but its stdout is not a JSON result")]
    BadResult(#[source] serde_json::Error),
}

/// One failed plugin invocation, with everything needed to understand it.
#[derive(Debug)]
pub struct CniFailure {
    pub plugin: String,
    pub command: CniCommand,
    /// `None` when the plugin did not run to completion (see `problem`).
    pub exit_status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    /// The CNI error object (`{"code":..,"msg":..,"details":..}`) if stdout held one.
    pub error_json: Option<Value>,
    /// Set when the runner, not the plugin, could not complete the call.
    pub problem: Option<InvokeProblem>,
    /// The config sent on stdin.
    pub config: Value,
}

impl CniFailure {
    /// The CNI error code, if the plugin printed an error object.
    pub fn error_code(&self) -> Option<u64> {
        self.error_json.as_ref()?.get("code")?.as_u64()
    }

    /// The CNI error message, if the plugin printed an error object.
    pub fn error_msg(&self) -> Option<&str> {
        self.error_json.as_ref()?.get("msg")?.as_str()
    }
}

fn or_empty(text: &str) -> &str {
    let text = text.trim();
    if text.is_empty() { "(empty)" } else { text }
}

impl fmt::Display for CniFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CNI {} of plugin `{}` failed: ",
            self.command, self.plugin
        )?;
        match (&self.problem, self.exit_status) {
            (Some(problem), _) => {
                write!(f, "{problem}")?;
                let mut source = std::error::Error::source(problem);
                while let Some(cause) = source {
                    write!(f, ": {cause}")?;
                    source = cause.source();
                }
            }
            (None, Some(status)) => write!(f, "{status}")?,
            (None, None) => write!(f, "unknown")?,
        }
        if let Some(error) = &self.error_json {
            write!(f, "\n  error: {error}")?;
        }
        write!(f, "\n  stdout: {}", or_empty(&self.stdout))?;
        write!(f, "\n  stderr: {}", or_empty(&self.stderr))?;
        write!(f, "\n  config sent on stdin: {}", self.config)
    }
}

impl std::error::Error for CniFailure {}

/// Every failure of a verb that keeps going after a failure (DEL, GC).
#[derive(Debug)]
pub struct CniFailures(pub Vec<CniFailure>);

impl fmt::Display for CniFailures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} plugin invocation(s) failed", self.0.len())?;
        for (i, failure) in self.0.iter().enumerate() {
            write!(f, "\n[{}] {failure}", i + 1)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniFailures {}

/// One recorded plugin invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginCall {
    pub plugin: String,
    pub command: CniCommand,
    pub container_id: String,
    pub succeeded: bool,
    pub elapsed: Duration,
}

/// What a successful plugin run printed.
#[derive(Debug, Clone)]
pub struct PluginOutput {
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct AttachmentKey {
    network: String,
    container_id: String,
    ifname: String,
}

impl AttachmentKey {
    fn new(list: &Conflist, rt: &RuntimeAttachment) -> Self {
        AttachmentKey {
            network: list.name().to_owned(),
            container_id: rt.container_id.clone(),
            ifname: rt.ifname.clone(),
        }
    }
}

#[derive(Debug, Clone)]
struct CachedAttachment {
    attachment: RuntimeAttachment,
    result: Value,
}

/// Runs conflists against plugins inside a node namespace. Methods take
/// `&self`, so one runner can serve many threads (parallel ADD/DEL tests).
#[derive(Debug)]
pub struct CniRunner {
    plugin_dirs: Vec<PathBuf>,
    node: NsHandle,
    timeout: Duration,
    cache: Mutex<BTreeMap<AttachmentKey, CachedAttachment>>,
    calls: Mutex<Vec<PluginCall>>,
    /// Set in every plugin's environment (e.g. a `PATH` with `nft`).
    env: Vec<(OsString, OsString)>,
    /// libcni's `results` directory, when the runner keeps one on disk.
    results_dir: Option<PathBuf>,
}

impl CniRunner {
    /// A runner that finds plugins in `plugin_dirs` (first match wins, like
    /// `CNI_PATH`) and runs them inside `node`. The runner keeps `node`
    /// reachable through an fd for as long as it lives.
    pub fn new(plugin_dirs: Vec<PathBuf>, node: &NetNs) -> CniRunner {
        CniRunner {
            plugin_dirs,
            node: node.handle(),
            timeout: plugin_timeout(),
            cache: Mutex::new(BTreeMap::new()),
            calls: Mutex::new(Vec::new()),
            env: Vec::new(),
            results_dir: None,
        }
    }

    /// Also keeps the result cache on disk, as libcni does (the evidence
    /// `ebpf-portmap migrate` reads): after a successful ADD,
    /// `<dir>/<network>-<containerID>-<ifname>` holds a `cniCacheV1` entry
    /// with the attachment's `netns`; a successful DEL, or
    /// [`CniRunner::forget`], removes it. (libcni also stores the list's
    /// bytes in `config`; nothing here reads them.)
    pub fn with_results_dir(mut self, dir: &Path) -> CniRunner {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        self.results_dir = Some(dir.to_path_buf());
        self
    }

    fn results_file(&self, list: &Conflist, rt: &RuntimeAttachment) -> Option<PathBuf> {
        let dir = self.results_dir.as_ref()?;
        Some(dir.join(format!("{}-{}-{}", list.name(), rt.container_id, rt.ifname)))
    }

    fn cache_on_disk(&self, list: &Conflist, rt: &RuntimeAttachment, result: &Value) {
        let Some(file) = self.results_file(list, rt) else {
            return;
        };
        let entry = json!({
            "kind": "cniCacheV1",
            "containerId": rt.container_id,
            "ifName": rt.ifname,
            "networkName": list.name(),
            "netns": rt.netns_path,
            "cniArgs": rt.cni_args.iter().map(|(k, v)| [k, v]).collect::<Vec<_>>(),
            "capabilityArgs": rt.capability_args,
            "result": result,
        });
        std::fs::write(&file, entry.to_string())
            .unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
    }

    fn uncache_on_disk(&self, list: &Conflist, rt: &RuntimeAttachment) {
        if let Some(file) = self.results_file(list, rt) {
            let _ = std::fs::remove_file(file);
        }
    }

    /// Sets `key` to `value` in every plugin's environment, as a runtime's
    /// own environment would (upstream portmap's nftables backend finds
    /// `nft` on `PATH`).
    pub fn with_env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> CniRunner {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Changes the per-plugin timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> CniRunner {
        self.timeout = timeout;
        self
    }

    /// ADD through the whole list; returns the last plugin's result and caches it.
    pub fn add(&self, list: &Conflist, rt: &RuntimeAttachment) -> Result<Value, CniFailure> {
        let mut result: Option<Value> = None;
        for plugin in list.plugins() {
            let config = plugin_config(list, plugin, &rt.capability_args, result.as_ref());
            let output =
                self.exec_plugin(plugin_type(plugin), CniCommand::Add, Some(rt), &config)?;
            let parsed = serde_json::from_str(&output.stdout).map_err(|e| CniFailure {
                plugin: plugin_type(plugin).to_owned(),
                command: CniCommand::Add,
                exit_status: None,
                stdout: output.stdout.clone(),
                stderr: output.stderr.clone(),
                error_json: None,
                problem: Some(InvokeProblem::BadResult(e)),
                config: config.clone(),
            })?;
            result = Some(parsed);
        }
        let result = result.unwrap_or_else(|| json!({ "cniVersion": list.cni_version() }));
        self.lock_cache().insert(
            AttachmentKey::new(list, rt),
            CachedAttachment {
                attachment: rt.clone(),
                result: result.clone(),
            },
        );
        self.cache_on_disk(list, rt, &result);
        Ok(result)
    }

    /// DEL through the list in reverse order; every plugin runs, all failures
    /// are returned.
    pub fn del(&self, list: &Conflist, rt: &RuntimeAttachment) -> Result<(), CniFailures> {
        let key = AttachmentKey::new(list, rt);
        let cached = if version_at_least(list.cni_version(), "0.4.0") {
            self.lock_cache().get(&key).map(|c| c.result.clone())
        } else {
            None
        };
        let mut failures = Vec::new();
        for plugin in list.plugins().iter().rev() {
            let config = plugin_config(list, plugin, &rt.capability_args, cached.as_ref());
            if let Err(failure) =
                self.exec_plugin(plugin_type(plugin), CniCommand::Del, Some(rt), &config)
            {
                failures.push(failure);
            }
        }
        if failures.is_empty() {
            self.lock_cache().remove(&key);
            self.uncache_on_disk(list, rt);
            Ok(())
        } else {
            Err(CniFailures(failures))
        }
    }

    /// CHECK through the list with the cached result; stops at the first failure.
    pub fn check(&self, list: &Conflist, rt: &RuntimeAttachment) -> Result<(), CniFailure> {
        if !version_at_least(list.cni_version(), "0.4.0") || list.disable_check() {
            return Ok(());
        }
        let cached = self.cached_result(list, rt);
        for plugin in list.plugins() {
            let config = plugin_config(list, plugin, &rt.capability_args, cached.as_ref());
            self.exec_plugin(plugin_type(plugin), CniCommand::Check, Some(rt), &config)?;
        }
        Ok(())
    }

    /// GC as libcni: DEL of cached attachments of this network missing from
    /// `valid`, then (version >= 1.1.0) GC of every plugin. Everything runs;
    /// all failures are returned.
    pub fn gc(&self, list: &Conflist, valid: &[GcAttachment]) -> Result<(), CniFailures> {
        if list.disable_gc() {
            return Ok(());
        }
        let stale: Vec<RuntimeAttachment> = self
            .lock_cache()
            .iter()
            .filter(|(key, _)| key.network == list.name())
            .filter(|(key, _)| {
                !valid
                    .iter()
                    .any(|v| v.container_id == key.container_id && v.ifname == key.ifname)
            })
            .map(|(_, cached)| cached.attachment.clone())
            .collect();
        let mut failures = Vec::new();
        for attachment in &stale {
            if let Err(CniFailures(mut more)) = self.del(list, attachment) {
                failures.append(&mut more);
            }
        }
        if version_at_least(list.cni_version(), "1.1.0") {
            for plugin in list.plugins() {
                let config = gc_plugin_config(list, plugin, valid);
                if let Err(failure) =
                    self.exec_plugin(plugin_type(plugin), CniCommand::Gc, None, &config)
                {
                    failures.push(failure);
                }
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(CniFailures(failures))
        }
    }

    /// STATUS of every plugin (version >= 1.1.0 only); stops at the first failure.
    pub fn status(&self, list: &Conflist) -> Result<(), CniFailure> {
        if !version_at_least(list.cni_version(), "1.1.0") {
            return Ok(());
        }
        for plugin in list.plugins() {
            let config = inject_identity(list, plugin);
            self.exec_plugin(plugin_type(plugin), CniCommand::Status, None, &config)?;
        }
        Ok(())
    }

    /// VERSION of one plugin: its parsed answer (`supportedVersions`, ...).
    pub fn version(&self, plugin: &str) -> Result<Value, CniFailure> {
        let config = json!({ "cniVersion": RUNNER_CNI_VERSION });
        let output = self.exec_plugin(plugin, CniCommand::Version, None, &config)?;
        serde_json::from_str(&output.stdout).map_err(|e| CniFailure {
            plugin: plugin.to_owned(),
            command: CniCommand::Version,
            exit_status: None,
            stdout: output.stdout,
            stderr: output.stderr,
            error_json: None,
            problem: Some(InvokeProblem::BadResult(e)),
            config,
        })
    }

    /// The cached ADD result of an attachment, if any.
    pub fn cached_result(&self, list: &Conflist, rt: &RuntimeAttachment) -> Option<Value> {
        self.lock_cache()
            .get(&AttachmentKey::new(list, rt))
            .map(|c| c.result.clone())
    }

    /// Drops the cached ADD result, as if the runtime had lost its cache (for
    /// tests of DEL without prevResult, or of plugin GC of leaked state).
    /// Returns whether there was one.
    pub fn forget(&self, list: &Conflist, rt: &RuntimeAttachment) -> bool {
        self.uncache_on_disk(list, rt);
        self.lock_cache()
            .remove(&AttachmentKey::new(list, rt))
            .is_some()
    }

    /// Every invocation so far, in order.
    pub fn calls(&self) -> Vec<PluginCall> {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether `plugin` was invoked with `command` (successfully or not).
    pub fn invoked(&self, plugin: &str, command: CniCommand) -> bool {
        self.calls()
            .iter()
            .any(|call| call.plugin == plugin && call.command == command)
    }

    /// Where `plugin` resolves, as `CNI_PATH` lookup would find it.
    pub fn find_plugin(&self, plugin: &str) -> Option<PathBuf> {
        find_in_dirs(&self.plugin_dirs, plugin)
    }

    /// `CNI_PATH` as handed to plugins.
    pub fn cni_path(&self) -> String {
        std::env::join_paths(&self.plugin_dirs)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Runs one plugin once with `config` on stdin (the building block of the
    /// verbs; public for tests that send hand-made configs). `rt` supplies
    /// `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME` and `CNI_ARGS` (empty without).
    pub fn exec_plugin(
        &self,
        plugin: &str,
        command: CniCommand,
        rt: Option<&RuntimeAttachment>,
        config: &Value,
    ) -> Result<PluginOutput, CniFailure> {
        let started = Instant::now();
        let outcome = self.run_plugin_process(plugin, command, rt, config);
        let elapsed = started.elapsed();
        let container_id = rt.map(|rt| rt.container_id.clone()).unwrap_or_default();
        let fail = |exit_status, stdout: String, stderr: String, problem| {
            let error_json = parse_error_json(&stdout);
            CniFailure {
                plugin: plugin.to_owned(),
                command,
                exit_status,
                stdout,
                stderr,
                error_json,
                problem,
                config: config.clone(),
            }
        };
        let result = match outcome {
            Ok((status, stdout, stderr)) if status.success() => Ok(PluginOutput {
                stdout,
                stderr,
                elapsed,
            }),
            Ok((status, stdout, stderr)) => Err(fail(Some(status), stdout, stderr, None)),
            Err((problem, stdout, stderr)) => Err(fail(None, stdout, stderr, Some(problem))),
        };
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(PluginCall {
                plugin: plugin.to_owned(),
                command,
                container_id,
                succeeded: result.is_ok(),
                elapsed,
            });
        result
    }

    #[allow(clippy::type_complexity)]
    fn run_plugin_process(
        &self,
        plugin: &str,
        command: CniCommand,
        rt: Option<&RuntimeAttachment>,
        config: &Value,
    ) -> Result<(ExitStatus, String, String), (InvokeProblem, String, String)> {
        let no_output = |problem| (problem, String::new(), String::new());
        let path = self.find_plugin(plugin).ok_or_else(|| {
            no_output(InvokeProblem::NotFound {
                dirs: self.plugin_dirs.clone(),
            })
        })?;
        let empty = RuntimeAttachment::default();
        let rt = rt.unwrap_or(&empty);
        let mut child = self
            .node
            .command(&path)
            .env("CNI_COMMAND", command.as_str())
            .env("CNI_CONTAINERID", &rt.container_id)
            .env("CNI_NETNS", &rt.netns_path)
            .env("CNI_ARGS", cni_args_string(&rt.cni_args))
            .env("CNI_IFNAME", &rt.ifname)
            .env("CNI_PATH", self.cni_path())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Own process group, so a timeout kills whatever the plugin started too.
            .process_group(0)
            .spawn()
            .map_err(|source| {
                no_output(InvokeProblem::Spawn {
                    path: path.clone(),
                    source,
                })
            })?;

        // Feed stdin and drain stdout/stderr on their own threads so that a
        // plugin that never reads, or writes a lot, cannot block the runner.
        let stdin_bytes = serde_json::to_vec(config).expect("a Value always serialises");
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let writer = std::thread::spawn(move || {
            // A plugin may exit without reading its config: a broken pipe is fine.
            let _ = stdin.write_all(&stdin_bytes);
        });
        let mut stdout = child.stdout.take().expect("stdout is piped");
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let stdout_reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stdout.read_to_end(&mut buf);
            buf
        });
        let stderr_reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stderr.read_to_end(&mut buf);
            buf
        });

        let deadline = Instant::now() + self.timeout;
        let mut pause = Duration::from_millis(1);
        let waited = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Ok(status),
                Ok(None) if Instant::now() >= deadline => {
                    kill_process_group(&mut child);
                    break Err(InvokeProblem::TimedOut(self.timeout));
                }
                Ok(None) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Err(e) => {
                    kill_process_group(&mut child);
                    break Err(InvokeProblem::Wait(e));
                }
            }
        };
        let _ = writer.join();
        let stdout =
            String::from_utf8_lossy(&stdout_reader.join().unwrap_or_default()).into_owned();
        let stderr =
            String::from_utf8_lossy(&stderr_reader.join().unwrap_or_default()).into_owned();
        match waited {
            Ok(status) => Ok((status, stdout, stderr)),
            Err(problem) => Err((problem, stdout, stderr)),
        }
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, BTreeMap<AttachmentKey, CachedAttachment>> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Kills the plugin and everything in its process group (children that still
/// hold its stdout would otherwise keep the runner waiting), then reaps it.
fn kill_process_group(child: &mut std::process::Child) {
    if let Ok(pgid) = i32::try_from(child.id()) {
        // SAFETY: signalling a process group we created; no memory involved.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn find_in_dirs(dirs: &[PathBuf], plugin: &str) -> Option<PathBuf> {
    if plugin.is_empty() || plugin.contains('/') {
        return None;
    }
    // libcni's FindInPath: the first regular file of that name (symlinks followed).
    dirs.iter()
        .map(|dir| dir.join(plugin))
        .find(|path| is_regular_file(path))
}

fn is_regular_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// The CNI error object on a failed plugin's stdout, if it printed one.
pub fn parse_error_json(stdout: &str) -> Option<Value> {
    let value: Value = serde_json::from_str(stdout.trim()).ok()?;
    (value.is_object() && (value.get("code").is_some() || value.get("msg").is_some()))
        .then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list() -> Conflist {
        Conflist::from_json(json!({
            "cniVersion": "1.0.0",
            "name": "net1",
            "plugins": [
                { "type": "bridge", "bridge": "cni0" },
                { "type": "portmap", "capabilities": { "portMappings": true, "bandwidth": false } },
            ]
        }))
        .unwrap()
    }

    #[test]
    fn conflist_validation() {
        assert!(matches!(
            Conflist::from_json(json!([])),
            Err(ConflistError::NotAnObject)
        ));
        assert!(matches!(
            Conflist::from_json(json!({"cniVersion": "1.0.0", "plugins": []})),
            Err(ConflistError::Field { field: "name", .. })
        ));
        assert!(matches!(
            Conflist::from_json(json!({"cniVersion": "1.0.0", "name": "n"})),
            Err(ConflistError::Field {
                field: "plugins",
                ..
            })
        ));
        assert!(matches!(
            Conflist::from_json(
                json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "a"}, {}]})
            ),
            Err(ConflistError::Plugin { index: 1 })
        ));
        let list = list();
        assert_eq!(list.name(), "net1");
        assert_eq!(list.cni_version(), "1.0.0");
        assert_eq!(list.plugin_types(), ["bridge", "portmap"]);
        assert!(!list.disable_check());
        assert_eq!(
            list.clone().with_cni_version("1.1.0").cni_version(),
            "1.1.0"
        );
    }

    #[test]
    fn config_injects_identity_prev_result_and_declared_capabilities_only() {
        let list = list();
        let caps = json!({ "portMappings": [{ "hostPort": 8080 }], "bandwidth": { "rate": 1 }, "ips": ["x"] });
        let prev = json!({ "cniVersion": "1.0.0", "ips": [] });
        let config = plugin_config(&list, &list.plugins()[1], &caps, Some(&prev));
        assert_eq!(config["name"], "net1");
        assert_eq!(config["cniVersion"], "1.0.0");
        assert_eq!(config["prevResult"], prev);
        assert_eq!(
            config["runtimeConfig"],
            json!({ "portMappings": [{ "hostPort": 8080 }] }),
            "only capabilities declared true may reach the plugin"
        );
        assert_eq!(config["type"], "portmap");
    }

    #[test]
    fn config_without_capabilities_or_args_has_no_runtime_config_or_prev_result() {
        let list = list();
        let caps = json!({ "portMappings": [] });
        let config = plugin_config(&list, &list.plugins()[0], &caps, None);
        assert!(config.get("runtimeConfig").is_none(), "{config}");
        assert!(config.get("prevResult").is_none(), "{config}");
        let config = plugin_config(&list, &list.plugins()[1], &Value::Null, None);
        assert!(config.get("runtimeConfig").is_none(), "{config}");
    }

    #[test]
    fn list_identity_overrides_plugin_fields() {
        let list = Conflist::from_json(json!({
            "cniVersion": "1.1.0", "name": "outer",
            "plugins": [{ "type": "x", "name": "inner", "cniVersion": "0.3.1" }]
        }))
        .unwrap();
        let config = inject_identity(&list, &list.plugins()[0]);
        assert_eq!(config["name"], "outer");
        assert_eq!(config["cniVersion"], "1.1.0");
    }

    #[test]
    fn gc_config_lists_valid_attachments() {
        let list = list();
        let valid = [GcAttachment {
            container_id: "c1".into(),
            ifname: "eth0".into(),
        }];
        let config = gc_plugin_config(&list, &list.plugins()[1], &valid);
        assert_eq!(
            config[VALID_ATTACHMENTS_KEY],
            json!([{ "containerID": "c1", "ifname": "eth0" }])
        );
        assert_eq!(config["name"], "net1");
    }

    #[test]
    fn versions_compare_numerically() {
        assert!(version_at_least("1.1.0", "1.1.0"));
        assert!(version_at_least("1.10.0", "1.2.0"));
        assert!(version_at_least("1.0.0", "0.4.0"));
        assert!(!version_at_least("0.3.1", "0.4.0"));
        assert!(!version_at_least("1.0.0", "1.1.0"));
    }

    #[test]
    fn cni_args_encoding() {
        assert_eq!(cni_args_string(&[]), "");
        let args = [
            ("IgnoreUnknown".to_owned(), "1".to_owned()),
            ("K8S_POD_NAME".to_owned(), "web".to_owned()),
        ];
        assert_eq!(cni_args_string(&args), "IgnoreUnknown=1;K8S_POD_NAME=web");
    }

    #[test]
    fn result_addresses_strip_prefix_lengths() {
        let result = json!({ "ips": [{ "address": "10.244.0.2/24" }, { "address": "fd44::2/64" }, { "x": 1 }] });
        let addrs: Vec<String> = result_addresses(&result)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(addrs, ["10.244.0.2", "fd44::2"]);
    }

    #[test]
    fn error_json_is_recognised() {
        assert_eq!(
            parse_error_json(r#"{"code":7,"msg":"bad"}"#).unwrap()["code"],
            7
        );
        assert!(parse_error_json("").is_none());
        assert!(parse_error_json(r#"{"cniVersion":"1.0.0"}"#).is_none());
    }

    #[test]
    fn failure_display_shows_everything() {
        let failure = CniFailure {
            plugin: "portmap".into(),
            command: CniCommand::Add,
            exit_status: None,
            stdout: r#"{"code":999,"msg":"boom"}"#.into(),
            stderr: "trace".into(),
            error_json: parse_error_json(r#"{"code":999,"msg":"boom"}"#),
            problem: Some(InvokeProblem::TimedOut(Duration::from_secs(1))),
            config: json!({ "type": "portmap" }),
        };
        let shown = failure.to_string();
        for needle in [
            "ADD",
            "`portmap`",
            "killed after",
            "999",
            "boom",
            "trace",
            r#""type":"portmap""#,
        ] {
            assert!(shown.contains(needle), "{needle:?} missing from {shown}");
        }
        assert_eq!(failure.error_code(), Some(999));
        assert_eq!(failure.error_msg(), Some("boom"));
    }
}
