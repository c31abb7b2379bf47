//! The CNI front end: reads the `CNI_*` environment and stdin, validates them
//! into a typed request, dispatches the verb to a [`Plugin`] and writes the one
//! JSON document the runtime expects on stdout.
//!
//! Environment, stdin and stdout are injected so dispatch is unit-tested with a
//! fake plugin and no kernel. Logs go through `log`, never to stdout: stdout is
//! the CNI result.

pub mod json_keys;
pub mod netconf;
pub mod prev_result;

use std::any::Any;
use std::fmt;
use std::io::{Read, Write};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::cni::netconf::{ConfigError, IdentifierError, IfnameError, NetConf, SUPPORTED_VERSIONS};
use crate::cni::prev_result::PrevResult;
use crate::model::{Attachment, ContainerAddrs, Owner, PodIdentity, PrevInterface};
use portmap_common::{NOMAD_FIELD_LEN, POD_NAME_LEN, POD_NAMESPACE_LEN};

/// Error codes defined by the CNI spec ("Error" section); 100+ are ours to use.
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENVIRONMENT_VARIABLES: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODING_FAILURE: u32 = 6;
    pub const INVALID_NETWORK_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    pub const PLUGIN_NOT_AVAILABLE_LIMITED_CONNECTIVITY: u32 = 51;
    /// What libcni's `ErrInternal` uses for "the plugin has a bug".
    pub const INTERNAL: u32 = 999;
}

/// Most bytes read from stdin. Real configurations are a few KiB (1024
/// mappings are ~100 KiB); the bound keeps a runaway caller from making us
/// allocate without limit.
pub const MAX_STDIN_BYTES: usize = 1 << 20;

/// Version used for replies when stdin gives no supported `cniVersion`.
pub const FALLBACK_VERSION: &str = "1.1.0";

/// First version with CHECK.
const CHECK_MIN_VERSION: &str = "0.4.0";
/// First version with GC and STATUS.
const GC_STATUS_MIN_VERSION: &str = "1.1.0";

/// A CNI verb, as given in `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

impl Command {
    /// Parses `CNI_COMMAND`. The spec spells verbs in upper case; anything else
    /// is refused rather than guessed.
    pub fn from_env_value(value: &str) -> Option<Command> {
        Some(match value {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            "VERSION" => Command::Version,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Gc => "GC",
            Command::Status => "STATUS",
            Command::Version => "VERSION",
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error object of the CNI spec. Built only at this boundary: the rest of
/// the library uses typed errors.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// The spec's error document: `{"cniVersion", "code", "msg", "details"}`.
    pub fn to_json(&self, cni_version: &str) -> Value {
        json!({
            "cniVersion": cni_version,
            "code": self.code,
            "msg": self.msg,
            "details": self.details,
        })
    }

    /// Builds a CNI error from a typed one: `msg` is its message, `details` the
    /// messages of its sources (so nothing is printed twice).
    pub fn from_error(code: u32, error: &dyn std::error::Error) -> Self {
        CniError::new(code, error.to_string(), source_chain(error))
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CNI error {}: {}", self.code, self.msg)?;
        if !self.details.is_empty() {
            write!(f, " ({})", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

impl From<ConfigError> for CniError {
    fn from(error: ConfigError) -> Self {
        CniError::from_error(error.cni_code(), &error)
    }
}

impl From<RequestError> for CniError {
    fn from(error: RequestError) -> Self {
        CniError::from_error(error.cni_code(), &error)
    }
}

/// What is wrong with the invocation itself (environment, stdin, verb/version).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(
        "CNI_COMMAND is not set; this binary is a CNI plugin and must be run by a container runtime"
    )]
    MissingCommand,
    #[error(
        "CNI_COMMAND {value:?} is not a CNI verb; expected ADD, DEL, CHECK, GC, STATUS or VERSION"
    )]
    UnknownCommand { value: String },
    #[error("{name} is not set; the container runtime must set it for {command}")]
    MissingEnv {
        name: &'static str,
        command: Command,
    },
    #[error("CNI_CONTAINERID {value:?} is not a valid container ID: {reason}")]
    InvalidContainerId {
        value: String,
        reason: IdentifierError,
    },
    #[error("CNI_IFNAME {value:?} is not a valid interface name: {reason}")]
    InvalidIfname { value: String, reason: IfnameError },
    #[error("CNI_NETNS {value:?} is not an absolute path")]
    NetnsNotAbsolute { value: String },
    #[error(
        "container unknown or does not exist: network namespace {path:?} (CNI_NETNS) does not exist"
    )]
    NetnsGone { path: PathBuf },
    #[error("stdin holds more than {limit} bytes, more than any network configuration needs")]
    StdinTooLarge { limit: usize },
    #[error("could not read the network configuration from stdin")]
    StdinRead {
        #[source]
        source: std::io::Error,
    },
    #[error(
        "prevResult is missing: ebpf-portmap must be chained after an interface plugin (such as bridge or ptp) in a plugin list, it cannot run on its own"
    )]
    NotChained,
    #[error(
        "cniVersion {version} does not allow {command}; {command} needs cniVersion {minimum} or later"
    )]
    VersionTooOld {
        command: Command,
        version: String,
        minimum: &'static str,
    },
}

impl RequestError {
    /// The CNI spec error code for this error.
    pub fn cni_code(&self) -> u32 {
        match self {
            RequestError::MissingCommand
            | RequestError::UnknownCommand { .. }
            | RequestError::MissingEnv { .. }
            | RequestError::InvalidContainerId { .. }
            | RequestError::InvalidIfname { .. }
            | RequestError::NetnsNotAbsolute { .. } => code::INVALID_ENVIRONMENT_VARIABLES,
            RequestError::NetnsGone { .. } => code::UNKNOWN_CONTAINER,
            RequestError::StdinTooLarge { .. } => code::DECODING_FAILURE,
            RequestError::StdinRead { .. } => code::IO_FAILURE,
            RequestError::NotChained => code::INVALID_NETWORK_CONFIG,
            RequestError::VersionTooOld { .. } => code::INCOMPATIBLE_VERSION,
        }
    }
}

/// A validated request for ADD/DEL/CHECK.
#[derive(Debug, Clone)]
pub struct Request {
    pub conf: NetConf,
    pub owner: Owner,
    /// Always `Some` for ADD and CHECK (and the namespace existed when checked);
    /// for DEL it may be `None` or name a namespace that is already gone.
    pub netns: Option<PathBuf>,
    /// Container addresses from `prevResult`; empty on a DEL without one.
    pub container: ContainerAddrs,
    /// prevResult's interfaces (the container's and the node-side ones).
    pub interfaces: Vec<PrevInterface>,
    /// Who the container is, from `CNI_ARGS` (empty when the runtime says
    /// nothing; Nomad sends nothing on DEL).
    pub identity: PodIdentity,
}

/// A validated GC request: everything owned by an attachment not in `valid`
/// is stale.
#[derive(Debug, Clone)]
pub struct GcRequest {
    pub conf: NetConf,
    pub valid: Vec<Attachment>,
}

/// What the dataplane implements. Errors are already CNI errors.
pub trait Plugin {
    fn add(&mut self, req: &Request) -> Result<(), CniError>;
    fn del(&mut self, req: &Request) -> Result<(), CniError>;
    fn check(&mut self, req: &Request) -> Result<(), CniError>;
    fn gc(&mut self, req: &GcRequest) -> Result<(), CniError>;
    fn status(&mut self, conf: &NetConf) -> Result<(), CniError>;
}

/// Runs one CNI invocation. `env` looks up environment variables (injected so
/// tests need no real env). Writes the result or the error object as JSON to
/// `stdout`; returns the process exit code (0 ok, 1 error).
/// Never writes anything but the one JSON document to stdout. Never panics on
/// any input: a panic in the plugin is caught and reported as code 999.
pub fn run(
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    plugin: &mut dyn Plugin,
) -> i32 {
    let input = read_stdin(stdin);
    // Errors are answered in the caller's version when it gave a usable one.
    let reply_version = input
        .as_deref()
        .ok()
        .and_then(supported_version_in)
        .unwrap_or(FALLBACK_VERSION)
        .to_owned();

    let outcome = match input {
        Err(error) => Err(CniError::from(error)),
        // Output is only written below, after dispatch returns, so a panic can
        // never leave half a document on stdout.
        Ok(stdin) => panic::catch_unwind(AssertUnwindSafe(|| dispatch(env, &stdin, plugin)))
            .unwrap_or_else(|payload| Err(panic_error(payload.as_ref()))),
    };

    match outcome {
        Ok(None) => 0,
        Ok(Some(document)) => {
            if write_document(stdout, &document) {
                0
            } else {
                1
            }
        }
        Err(error) => {
            log::error!("{error}");
            write_document(stdout, &error.to_json(&reply_version));
            1
        }
    }
}

fn dispatch(
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &[u8],
    plugin: &mut dyn Plugin,
) -> Result<Option<Value>, CniError> {
    let command = match env("CNI_COMMAND") {
        None => return Err(RequestError::MissingCommand.into()),
        Some(value) => {
            Command::from_env_value(&value).ok_or(RequestError::UnknownCommand { value })?
        }
    };
    log::debug!("CNI {command}");
    match command {
        Command::Version => Ok(Some(version_document(stdin))),
        Command::Add => add(env, stdin, plugin).map(Some),
        Command::Del => del(env, stdin, plugin).map(|()| None),
        Command::Check => check(env, stdin, plugin).map(|()| None),
        Command::Gc => gc(stdin, plugin).map(|()| None),
        Command::Status => status(stdin, plugin).map(|()| None),
    }
}

fn version_document(stdin: &[u8]) -> Value {
    json!({
        "cniVersion": supported_version_in(stdin).unwrap_or(FALLBACK_VERSION),
        "supportedVersions": SUPPORTED_VERSIONS,
    })
}

fn add(
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &[u8],
    plugin: &mut dyn Plugin,
) -> Result<Value, CniError> {
    let attachment = AttachmentEnv::from_env(env, Command::Add)?;
    let conf = netconf::parse_netconf(stdin)?;
    let prev_result = conf.prev_result.clone().ok_or(RequestError::NotChained)?;
    let prev = PrevResult::parse(&prev_result, &attachment.ifname)?;
    netconf::check_mappings_reachable(&conf, &prev.container, &attachment.ifname)?;

    let cni_version = conf.cni_version.clone();
    plugin.add(&attachment.into_request(conf, prev))?;

    // A chained plugin that changes nothing echoes prevResult. libcni hands us
    // the previous plugin's result already in the list's cniVersion, so no
    // conversion between result formats is needed; we only make the version
    // field match the config, as the spec requires of the result.
    let mut result = prev_result;
    if let Value::Object(fields) = &mut result {
        fields.insert("cniVersion".into(), Value::String(cni_version));
    }
    Ok(result)
}

fn del(
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &[u8],
    plugin: &mut dyn Plugin,
) -> Result<(), CniError> {
    let attachment = AttachmentEnv::from_env(env, Command::Del)?;
    let (conf, dropped) = netconf::parse_netconf_for_teardown(stdin)?;
    for error in &dropped {
        log::warn!("DEL ignores part of the configuration: {error}");
    }
    // Entries are found by owner, so DEL works without addresses; they only
    // help the plugin when the runtime still has them.
    let prev = match &conf.prev_result {
        None => PrevResult::default(),
        Some(prev_result) => {
            let (prev, error) = PrevResult::parse_for_teardown(prev_result, &attachment.ifname);
            if let Some(error) = error {
                log::warn!("DEL ignores prevResult's addresses: {error}");
            }
            prev
        }
    };
    plugin.del(&attachment.into_request(conf, prev))
}

fn check(
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &[u8],
    plugin: &mut dyn Plugin,
) -> Result<(), CniError> {
    let attachment = AttachmentEnv::from_env(env, Command::Check)?;
    let conf = netconf::parse_netconf(stdin)?;
    require_version(&conf, Command::Check, CHECK_MIN_VERSION)?;
    let prev_result = conf.prev_result.as_ref().ok_or(RequestError::NotChained)?;
    let prev = PrevResult::parse(prev_result, &attachment.ifname)?;
    netconf::check_mappings_reachable(&conf, &prev.container, &attachment.ifname)?;
    plugin.check(&attachment.into_request(conf, prev))
}

fn gc(stdin: &[u8], plugin: &mut dyn Plugin) -> Result<(), CniError> {
    let (conf, dropped) = netconf::parse_netconf_for_teardown(stdin)?;
    require_version(&conf, Command::Gc, GC_STATUS_MIN_VERSION)?;
    for error in &dropped {
        log::warn!("GC ignores part of the configuration: {error}");
    }
    let valid = conf.valid_attachments.clone().unwrap_or_default();
    plugin.gc(&GcRequest { conf, valid })
}

fn status(stdin: &[u8], plugin: &mut dyn Plugin) -> Result<(), CniError> {
    let conf = netconf::parse_netconf(stdin)?;
    require_version(&conf, Command::Status, GC_STATUS_MIN_VERSION)?;
    plugin.status(&conf)
}

fn require_version(
    conf: &NetConf,
    command: Command,
    minimum: &'static str,
) -> Result<(), RequestError> {
    if netconf::version_at_least(&conf.cni_version, minimum) {
        Ok(())
    } else {
        Err(RequestError::VersionTooOld {
            command,
            version: conf.cni_version.clone(),
            minimum,
        })
    }
}

/// The per-attachment environment of ADD, DEL and CHECK, validated.
struct AttachmentEnv {
    container_id: String,
    ifname: String,
    netns: Option<PathBuf>,
    identity: PodIdentity,
}

impl AttachmentEnv {
    fn from_env(
        env: &dyn Fn(&str) -> Option<String>,
        command: Command,
    ) -> Result<Self, RequestError> {
        let required =
            |name: &'static str| env(name).ok_or(RequestError::MissingEnv { name, command });

        let container_id = required("CNI_CONTAINERID")?;
        if let Err(reason) = netconf::validate_identifier(&container_id) {
            return Err(RequestError::InvalidContainerId {
                value: container_id,
                reason,
            });
        }
        let ifname = required("CNI_IFNAME")?;
        if let Err(reason) = netconf::validate_ifname(&ifname) {
            return Err(RequestError::InvalidIfname {
                value: ifname,
                reason,
            });
        }
        // We never exec other plugins, but the spec makes CNI_PATH mandatory and
        // its absence means the caller is not a conforming runtime.
        required("CNI_PATH")?;

        // Runtimes set CNI_NETNS="" on DEL once the namespace is gone.
        let netns = env("CNI_NETNS").filter(|netns| !netns.is_empty());
        let netns = match command {
            Command::Del => netns.and_then(|netns| {
                if Path::new(&netns).is_absolute() {
                    Some(PathBuf::from(netns))
                } else {
                    // DEL must not get stuck: entries are removed by owner.
                    log::warn!("DEL ignores CNI_NETNS {netns:?}: not an absolute path");
                    None
                }
            }),
            _ => {
                let netns = netns.ok_or(RequestError::MissingEnv {
                    name: "CNI_NETNS",
                    command,
                })?;
                let path = PathBuf::from(&netns);
                if !path.is_absolute() {
                    return Err(RequestError::NetnsNotAbsolute { value: netns });
                }
                if namespace_is_gone(&path) {
                    return Err(RequestError::NetnsGone { path });
                }
                Some(path)
            }
        };
        // Never fails the verb: a runtime's extra arguments are its business.
        let (identity, warnings) = parse_cni_args(env("CNI_ARGS").as_deref().unwrap_or(""));
        for warning in warnings {
            log::warn!("{command} ignores part of CNI_ARGS: {warning}");
        }
        Ok(AttachmentEnv {
            container_id,
            ifname,
            netns,
            identity,
        })
    }

    fn into_request(self, conf: NetConf, prev: PrevResult) -> Request {
        Request {
            owner: Owner {
                network: conf.name.clone(),
                container_id: self.container_id,
                ifname: self.ifname,
            },
            conf,
            netns: self.netns,
            container: prev.container,
            interfaces: prev.interfaces,
            identity: self.identity,
        }
    }
}

/// What is wrong with a part of `CNI_ARGS`; logged, never fatal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CniArgsWarning {
    #[error("{pair:?} is not KEY=VALUE")]
    Malformed { pair: String },
    #[error("{key} holds a control character; not recorded")]
    ControlCharacter { key: String },
    #[error("{key} is {len} bytes long, more than the {max} recorded; not recorded")]
    TooLong { key: String, len: usize, max: usize },
    #[error("{key} is not a key ebpf-portmap knows (the runtime did not set IgnoreUnknown)")]
    Unknown { key: String },
}

/// Keys runtimes send that we know and have no use for: containerd and
/// CRI-O send the sandbox ID again (it is CNI_CONTAINERID) and the pod UID.
const KNOWN_UNUSED_ARGS: &[&str] = &["K8S_POD_INFRA_CONTAINER_ID", "K8S_POD_UID", "NOMAD_REGION"];

/// Parses `CNI_ARGS` (`KEY=VALUE;KEY=VALUE`, the CNI spec's form, in any
/// order) into the identity it carries, and what it had to skip.
///
/// Read: `K8S_POD_NAMESPACE`, `K8S_POD_NAME` (containerd, CRI-O),
/// `NOMAD_ALLOC_ID`, `NOMAD_NAMESPACE`, `NOMAD_JOB_ID`, `NOMAD_GROUP_NAME`
/// (Nomad 1.8 and later, on ADD and CHECK only). Like libcni, keys are case
/// sensitive, a later pair wins and unknown keys are an issue only without
/// `IgnoreUnknown` (which containerd and Nomad always send); unlike libcni,
/// nothing here fails the verb. Empty values count as absent.
pub fn parse_cni_args(args: &str) -> (PodIdentity, Vec<CniArgsWarning>) {
    let mut identity = PodIdentity::default();
    let mut warnings = Vec::new();
    let mut unknown = Vec::new();
    let mut ignore_unknown = false;
    for pair in args.split(';').filter(|pair| !pair.is_empty()) {
        let Some((key, value)) = pair.split_once('=').filter(|(key, _)| !key.is_empty()) else {
            warnings.push(CniArgsWarning::Malformed {
                pair: pair.to_owned(),
            });
            continue;
        };
        let (slot, max) = match key {
            "K8S_POD_NAMESPACE" => (&mut identity.pod_namespace, POD_NAMESPACE_LEN),
            "K8S_POD_NAME" => (&mut identity.pod_name, POD_NAME_LEN),
            "NOMAD_ALLOC_ID" => (&mut identity.nomad_alloc_id, NOMAD_FIELD_LEN),
            "NOMAD_NAMESPACE" => (&mut identity.nomad_namespace, NOMAD_FIELD_LEN),
            "NOMAD_JOB_ID" => (&mut identity.nomad_job, NOMAD_FIELD_LEN),
            "NOMAD_GROUP_NAME" => (&mut identity.nomad_group, NOMAD_FIELD_LEN),
            "IgnoreUnknown" => {
                // libcni's UnmarshallableBool: "1"/"true", any case.
                ignore_unknown = value == "1" || value.eq_ignore_ascii_case("true");
                continue;
            }
            key if KNOWN_UNUSED_ARGS.contains(&key) => continue,
            key => {
                unknown.push(key.to_owned());
                continue;
            }
        };
        if value.chars().any(char::is_control) {
            warnings.push(CniArgsWarning::ControlCharacter {
                key: key.to_owned(),
            });
        } else if value.len() > max {
            warnings.push(CniArgsWarning::TooLong {
                key: key.to_owned(),
                len: value.len(),
                max,
            });
        } else {
            *slot = (!value.is_empty()).then(|| value.to_owned());
        }
    }
    if !ignore_unknown {
        warnings.extend(
            unknown
                .into_iter()
                .map(|key| CniArgsWarning::Unknown { key }),
        );
    }
    (identity, warnings)
}

/// Only "definitely not there" counts as gone. Other stat errors (EACCES on
/// another process's /proc/<pid>/ns/net) are left for the plugin to report
/// when it actually enters the namespace, with the real cause.
fn namespace_is_gone(path: &Path) -> bool {
    match std::fs::metadata(path) {
        Ok(_) => false,
        Err(error) => matches!(
            error.kind(),
            std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
        ),
    }
}

/// Reads all of stdin, refusing more than [`MAX_STDIN_BYTES`].
fn read_stdin(stdin: &mut dyn Read) -> Result<Vec<u8>, RequestError> {
    let mut buffer = Vec::new();
    stdin
        .take(MAX_STDIN_BYTES as u64 + 1)
        .read_to_end(&mut buffer)
        .map_err(|source| RequestError::StdinRead { source })?;
    if buffer.len() > MAX_STDIN_BYTES {
        return Err(RequestError::StdinTooLarge {
            limit: MAX_STDIN_BYTES,
        });
    }
    Ok(buffer)
}

/// The `cniVersion` on stdin if it is one we support, without validating
/// anything else. Used for VERSION and for answering errors in the caller's
/// version.
fn supported_version_in(stdin: &[u8]) -> Option<&'static str> {
    let version = netconf::cni_version_of(stdin)?;
    SUPPORTED_VERSIONS
        .iter()
        .copied()
        .find(|supported| *supported == version)
}

/// Writes exactly one JSON document. Returns false when stdout is unusable;
/// nothing more can be reported then, except to the log.
fn write_document(stdout: &mut dyn Write, document: &Value) -> bool {
    let written = serde_json::to_vec(document)
        .map_err(std::io::Error::from)
        .and_then(|bytes| stdout.write_all(&bytes))
        .and_then(|()| stdout.flush());
    match written {
        Ok(()) => true,
        Err(error) => {
            log::error!("could not write the CNI reply to stdout: {error}");
            false
        }
    }
}

fn panic_error(payload: &(dyn Any + Send)) -> CniError {
    let details = payload
        .downcast_ref::<&str>()
        .map(|message| (*message).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    CniError::new(
        code::INTERNAL,
        "ebpf-portmap hit an internal error (a bug); please report it with the plugin's log",
        details,
    )
}

/// Messages of `error`'s sources, outermost first, joined with ": ".
fn source_chain(error: &dyn std::error::Error) -> String {
    let mut chain = Vec::new();
    let mut source = error.source();
    while let Some(cause) = source {
        chain.push(cause.to_string());
        source = cause.source();
    }
    chain.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{HostIp, PortMapping, Protocol};
    use std::collections::HashMap;

    /// What the fake plugin was asked to do.
    #[derive(Debug, Clone)]
    enum Call {
        Add(Request),
        Del(Request),
        Check(Request),
        Gc(GcRequest),
        Status(NetConf),
    }

    /// Records every call; optionally fails or panics. A fake is right here:
    /// these tests are about dispatch, not the dataplane.
    #[derive(Default)]
    struct RecordingPlugin {
        calls: Vec<Call>,
        fail_with: Option<CniError>,
        panic: bool,
    }

    impl RecordingPlugin {
        fn record(&mut self, call: Call) -> Result<(), CniError> {
            self.calls.push(call);
            if self.panic {
                panic!("fake plugin asked to panic");
            }
            self.fail_with.clone().map_or(Ok(()), Err)
        }

        fn only_call(&self) -> &Call {
            assert_eq!(
                self.calls.len(),
                1,
                "exactly one plugin call expected, got {:?}",
                self.calls
            );
            &self.calls[0]
        }
    }

    impl Plugin for RecordingPlugin {
        fn add(&mut self, req: &Request) -> Result<(), CniError> {
            self.record(Call::Add(req.clone()))
        }
        fn del(&mut self, req: &Request) -> Result<(), CniError> {
            self.record(Call::Del(req.clone()))
        }
        fn check(&mut self, req: &Request) -> Result<(), CniError> {
            self.record(Call::Check(req.clone()))
        }
        fn gc(&mut self, req: &GcRequest) -> Result<(), CniError> {
            self.record(Call::Gc(req.clone()))
        }
        fn status(&mut self, conf: &NetConf) -> Result<(), CniError> {
            self.record(Call::Status(conf.clone()))
        }
    }

    /// A namespace path that exists without root.
    const LIVE_NETNS: &str = "/proc/self/ns/net";
    const GONE_NETNS: &str = "/var/run/netns/ebpf-portmap-test-no-such-namespace";

    /// The full environment of an attachment verb; tests remove or override entries.
    fn attachment_env(command: &str) -> Vec<(&'static str, String)> {
        vec![
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", "3f6940ab5ab4".to_string()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_PATH", "/opt/cni/bin".to_string()),
            ("CNI_NETNS", LIVE_NETNS.to_string()),
        ]
    }

    fn set(env: &mut Vec<(&'static str, String)>, name: &'static str, value: Option<&str>) {
        env.retain(|(key, _)| *key != name);
        if let Some(value) = value {
            env.push((name, value.to_string()));
        }
    }

    struct Outcome {
        exit: i32,
        stdout: Vec<u8>,
    }

    impl Outcome {
        /// Asserts success with nothing on stdout.
        fn assert_silent_success(&self) {
            assert_eq!(
                self.exit,
                0,
                "expected success, stdout: {}",
                String::from_utf8_lossy(&self.stdout)
            );
            assert!(
                self.stdout.is_empty(),
                "stdout must be empty, got {}",
                String::from_utf8_lossy(&self.stdout)
            );
        }

        /// Asserts success and returns the one JSON document on stdout.
        fn success_document(&self) -> Value {
            assert_eq!(
                self.exit,
                0,
                "expected success, stdout: {}",
                String::from_utf8_lossy(&self.stdout)
            );
            serde_json::from_slice(&self.stdout).expect("stdout must be exactly one JSON document")
        }

        /// Asserts failure with `code` and exactly one spec error object on
        /// stdout; returns it.
        fn error(&self, code: u32) -> Value {
            assert_eq!(
                self.exit,
                1,
                "errors exit 1, stdout: {}",
                String::from_utf8_lossy(&self.stdout)
            );
            let error: Value = serde_json::from_slice(&self.stdout).unwrap_or_else(|e| {
                panic!(
                    "stdout must be exactly one JSON document ({e}): {:?}",
                    String::from_utf8_lossy(&self.stdout)
                )
            });
            let keys: Vec<&str> = error
                .as_object()
                .expect("error must be an object")
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(keys.len(), 4, "error object keys: {keys:?}");
            for key in ["cniVersion", "code", "msg", "details"] {
                assert!(keys.contains(&key), "error object lacks {key}: {error}");
            }
            assert_eq!(error["code"], code, "wrong error code in {error}");
            error
        }
    }

    fn invoke(
        env: &[(&'static str, String)],
        stdin: &str,
        plugin: &mut RecordingPlugin,
    ) -> Outcome {
        invoke_with_reader(env, &mut stdin.as_bytes(), plugin)
    }

    fn invoke_with_reader(
        env: &[(&'static str, String)],
        stdin: &mut dyn Read,
        plugin: &mut RecordingPlugin,
    ) -> Outcome {
        let env: HashMap<&str, String> = env.iter().cloned().collect();
        let lookup = |name: &str| env.get(name).cloned();
        let mut stdout = Vec::new();
        let exit = run(&lookup, stdin, &mut stdout, plugin);
        Outcome { exit, stdout }
    }

    fn prev_result(version: &str) -> Value {
        json!({
            "cniVersion": version,
            "interfaces": [
                {"name": "cni-podman0", "mac": "aa:bb:cc:dd:ee:ff"},
                {"name": "eth0", "mac": "aa:bb:cc:dd:ee:01", "sandbox": LIVE_NETNS}
            ],
            "ips": [
                {"interface": 1, "address": "10.88.0.5/16", "gateway": "10.88.0.1"},
                {"interface": 1, "address": "fd00::5/64"}
            ],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        })
    }

    fn config(version: &str, mappings: Value, prev: Option<Value>) -> String {
        let mut conf = json!({
            "cniVersion": version,
            "name": "podman",
            "type": "ebpf-portmap",
            "capabilities": {"portMappings": true},
            "runtimeConfig": {"portMappings": mappings},
        });
        if let Some(prev) = prev {
            conf["prevResult"] = prev;
        }
        conf.to_string()
    }

    fn http_mapping() -> Value {
        json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}])
    }

    #[test]
    fn version_without_stdin() {
        let mut plugin = RecordingPlugin::default();
        let document =
            invoke(&[("CNI_COMMAND", "VERSION".into())], "", &mut plugin).success_document();
        assert_eq!(
            document,
            json!({"cniVersion": "1.1.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}),
            "VERSION with empty stdin answers in the newest version"
        );
        assert!(plugin.calls.is_empty(), "VERSION never reaches the plugin");
    }

    #[test]
    fn version_with_stdin() {
        let mut plugin = RecordingPlugin::default();
        let env = [("CNI_COMMAND", "VERSION".to_string())];
        let document = invoke(&env, r#"{"cniVersion":"0.4.0"}"#, &mut plugin).success_document();
        assert_eq!(
            document["cniVersion"], "0.4.0",
            "VERSION answers in the caller's version"
        );
        assert_eq!(
            document["supportedVersions"],
            json!(SUPPORTED_VERSIONS),
            "supportedVersions lists SUPPORTED_VERSIONS"
        );

        let document = invoke(&env, r#"{"cniVersion":"0.2.0"}"#, &mut plugin).success_document();
        assert_eq!(
            document["cniVersion"], "1.1.0",
            "an unsupported caller version falls back"
        );
        let document = invoke(&env, "not json", &mut plugin).success_document();
        assert_eq!(document["cniVersion"], "1.1.0", "garbage stdin falls back");
    }

    #[test]
    fn add_echoes_prev_result_with_config_version() {
        let mut plugin = RecordingPlugin::default();
        // prevResult is in an older version than the config on purpose, to see
        // that only cniVersion changes.
        let prev = prev_result("0.4.0");
        let stdin = config("1.0.0", http_mapping(), Some(prev.clone()));
        let document = invoke(&attachment_env("ADD"), &stdin, &mut plugin).success_document();

        let mut expected = prev;
        expected["cniVersion"] = json!("1.0.0");
        assert_eq!(
            document, expected,
            "ADD must echo prevResult with the config's cniVersion"
        );

        let Call::Add(req) = plugin.only_call() else {
            panic!("ADD must call plugin.add, got {:?}", plugin.calls);
        };
        assert_eq!(
            req.owner,
            Owner {
                network: "podman".into(),
                container_id: "3f6940ab5ab4".into(),
                ifname: "eth0".into()
            },
            "owner is network + container ID + ifname"
        );
        assert_eq!(
            req.netns.as_deref(),
            Some(Path::new(LIVE_NETNS)),
            "netns passed through"
        );
        assert_eq!(
            req.container,
            ContainerAddrs {
                v4: Some("10.88.0.5".parse().unwrap()),
                v6: Some("fd00::5".parse().unwrap())
            },
            "container addresses come from the sandbox interface"
        );
        assert_eq!(
            req.conf.port_mappings,
            vec![PortMapping {
                host_ip: HostIp::Any,
                host_port: 8080,
                container_port: 80,
                protocol: Protocol::Tcp
            }],
            "validated mappings reach the plugin"
        );
    }

    #[test]
    fn add_with_0_3_1_prev_result() {
        let mut plugin = RecordingPlugin::default();
        let prev = json!({
            "cniVersion": "0.3.1",
            "interfaces": [{"name": "eth0", "sandbox": LIVE_NETNS}],
            "ips": [{"version": "4", "interface": 0, "address": "10.0.0.9/24"}]
        });
        let stdin = config("0.3.1", http_mapping(), Some(prev.clone()));
        let document = invoke(&attachment_env("ADD"), &stdin, &mut plugin).success_document();
        assert_eq!(
            document, prev,
            "same-version chain: prevResult comes back unchanged"
        );
        let Call::Add(req) = plugin.only_call() else {
            panic!("expected add")
        };
        assert_eq!(
            req.container.v4,
            Some("10.0.0.9".parse().unwrap()),
            "0.3.1 ips are read"
        );
    }

    #[test]
    fn add_without_prev_result_is_refused() {
        let mut plugin = RecordingPlugin::default();
        let error = invoke(
            &attachment_env("ADD"),
            &config("1.0.0", http_mapping(), None),
            &mut plugin,
        )
        .error(code::INVALID_NETWORK_CONFIG);
        assert!(
            error["msg"]
                .as_str()
                .unwrap()
                .contains("chained after an interface plugin"),
            "{error}"
        );
        assert_eq!(
            error["cniVersion"], "1.0.0",
            "errors answer in the config's version"
        );
        assert!(
            plugin.calls.is_empty(),
            "plugin must not be called: {:?}",
            plugin.calls
        );
    }

    #[test]
    fn add_with_mappings_but_no_container_address_is_refused() {
        let mut plugin = RecordingPlugin::default();
        let prev = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/x"}], "ips": []});
        let error = invoke(
            &attachment_env("ADD"),
            &config("1.0.0", http_mapping(), Some(prev)),
            &mut plugin,
        )
        .error(code::INVALID_NETWORK_CONFIG);
        assert!(
            error["msg"]
                .as_str()
                .unwrap()
                .contains("no IPv4 or IPv6 address"),
            "{error}"
        );
        assert!(plugin.calls.is_empty(), "plugin must not be called");
    }

    #[test]
    fn add_without_mappings_or_address_is_fine() {
        let mut plugin = RecordingPlugin::default();
        let prev = json!({"cniVersion": "1.0.0", "ips": []});
        let stdin = json!({"cniVersion": "1.0.0", "name": "n", "type": "t", "prevResult": prev})
            .to_string();
        let document = invoke(&attachment_env("ADD"), &stdin, &mut plugin).success_document();
        assert_eq!(document, prev, "nothing to map is not an error");
        assert!(
            matches!(plugin.only_call(), Call::Add(req) if req.conf.port_mappings.is_empty()),
            "ADD reaches the plugin with no mappings"
        );
    }

    #[test]
    fn add_with_host_ip_family_the_container_lacks_is_refused() {
        let mut plugin = RecordingPlugin::default();
        let prev = json!({"cniVersion": "1.0.0", "ips": [{"address": "fd00::5/64"}]});
        let mappings = json!([{"hostPort": 8080, "containerPort": 80, "hostIP": "1.2.3.4"}]);
        let error = invoke(
            &attachment_env("ADD"),
            &config("1.0.0", mappings, Some(prev)),
            &mut plugin,
        )
        .error(code::INVALID_NETWORK_CONFIG);
        assert!(
            error["msg"]
                .as_str()
                .unwrap()
                .contains("portMappings[0].hostIP: 1.2.3.4"),
            "{error}"
        );
        assert!(plugin.calls.is_empty(), "plugin must not be called");
    }

    #[test]
    fn add_invalid_config_never_reaches_the_plugin() {
        let mut plugin = RecordingPlugin::default();
        let mappings = json!([{"hostPort": 70000, "containerPort": 80}]);
        let error = invoke(
            &attachment_env("ADD"),
            &config("1.0.0", mappings, Some(prev_result("1.0.0"))),
            &mut plugin,
        )
        .error(code::INVALID_NETWORK_CONFIG);
        assert_eq!(
            error["msg"], "runtimeConfig.portMappings[0].hostPort: 70000 is out of range 1-65535",
            "the message names the entry and the range"
        );
        assert!(plugin.calls.is_empty(), "plugin must not be called");
    }

    #[test]
    fn plugin_errors_are_reported_in_the_config_version() {
        let mut plugin = RecordingPlugin {
            fail_with: Some(CniError::new(11, "map busy", "try later")),
            ..Default::default()
        };
        let stdin = config("0.4.0", http_mapping(), Some(prev_result("0.4.0")));
        let error = invoke(&attachment_env("ADD"), &stdin, &mut plugin).error(11);
        assert_eq!(
            error,
            json!({"cniVersion": "0.4.0", "code": 11, "msg": "map busy", "details": "try later"}),
            "the plugin's error is passed through in the config's version"
        );
    }

    #[test]
    fn plugin_panic_becomes_one_error_document() {
        let mut plugin = RecordingPlugin {
            panic: true,
            ..Default::default()
        };
        let stdin = config("1.0.0", http_mapping(), Some(prev_result("1.0.0")));
        let error = invoke(&attachment_env("ADD"), &stdin, &mut plugin).error(code::INTERNAL);
        assert_eq!(
            error["details"], "fake plugin asked to panic",
            "panic message goes to details"
        );
    }

    #[test]
    fn del_without_runtime_config_or_prev_result_reaches_the_plugin() {
        let mut plugin = RecordingPlugin::default();
        let stdin = r#"{"cniVersion":"1.0.0","name":"podman","type":"ebpf-portmap"}"#;
        invoke(&attachment_env("DEL"), stdin, &mut plugin).assert_silent_success();
        let Call::Del(req) = plugin.only_call() else {
            panic!("DEL must call plugin.del")
        };
        assert_eq!(
            req.owner.container_id, "3f6940ab5ab4",
            "owner carries CNI_CONTAINERID"
        );
        assert_eq!(
            req.container,
            ContainerAddrs::default(),
            "no prevResult, no addresses"
        );
        assert!(
            req.conf.port_mappings.is_empty(),
            "no runtimeConfig, no mappings"
        );
    }

    #[test]
    fn del_with_prev_result_passes_container_addresses() {
        let mut plugin = RecordingPlugin::default();
        let stdin = config("1.0.0", http_mapping(), Some(prev_result("1.0.0")));
        invoke(&attachment_env("DEL"), &stdin, &mut plugin).assert_silent_success();
        let Call::Del(req) = plugin.only_call() else {
            panic!("expected del")
        };
        assert_eq!(
            req.container.v4,
            Some("10.88.0.5".parse().unwrap()),
            "DEL gets the IPv4 address from prevResult"
        );
        assert_eq!(
            req.conf.port_mappings.len(),
            1,
            "valid mappings are still passed on DEL"
        );
    }

    #[test]
    fn del_tolerates_missing_or_gone_netns_and_bad_request_data() {
        for netns in [None, Some(""), Some(GONE_NETNS), Some("relative/ns")] {
            let mut plugin = RecordingPlugin::default();
            let mut env = attachment_env("DEL");
            set(&mut env, "CNI_NETNS", netns);
            let stdin = config(
                "1.0.0",
                json!([{"hostPort": 0}]),
                Some(json!("not an object")),
            );
            invoke(&env, &stdin, &mut plugin).assert_silent_success();
            let Call::Del(req) = plugin.only_call() else {
                panic!("expected del for netns {netns:?}")
            };
            let expected = netns.filter(|n| n.starts_with('/')).map(PathBuf::from);
            assert_eq!(req.netns, expected, "netns {netns:?}");
            assert!(
                req.conf.port_mappings.is_empty(),
                "invalid mappings are dropped on DEL"
            );
        }
    }

    #[test]
    fn check_on_0_3_1_is_refused() {
        let mut plugin = RecordingPlugin::default();
        let stdin = config("0.3.1", http_mapping(), Some(prev_result("0.3.1")));
        let error =
            invoke(&attachment_env("CHECK"), &stdin, &mut plugin).error(code::INCOMPATIBLE_VERSION);
        assert!(
            error["msg"]
                .as_str()
                .unwrap()
                .contains("does not allow CHECK"),
            "{error}"
        );
        assert_eq!(
            error["cniVersion"], "0.3.1",
            "the error answers in the config's version"
        );
        assert!(plugin.calls.is_empty(), "plugin must not be called");
    }

    #[test]
    fn check_succeeds_silently() {
        let mut plugin = RecordingPlugin::default();
        let stdin = config("0.4.0", http_mapping(), Some(prev_result("0.4.0")));
        invoke(&attachment_env("CHECK"), &stdin, &mut plugin).assert_silent_success();
        let Call::Check(req) = plugin.only_call() else {
            panic!("CHECK must call plugin.check")
        };
        assert_eq!(
            req.container.v6,
            Some("fd00::5".parse().unwrap()),
            "CHECK gets the IPv6 address from prevResult"
        );
    }

    #[test]
    fn check_without_prev_result_is_refused() {
        let mut plugin = RecordingPlugin::default();
        invoke(
            &attachment_env("CHECK"),
            &config("1.0.0", http_mapping(), None),
            &mut plugin,
        )
        .error(code::INVALID_NETWORK_CONFIG);
        assert!(plugin.calls.is_empty(), "plugin must not be called");
    }

    #[test]
    fn gc_and_status_on_1_0_0_are_refused() {
        for command in ["GC", "STATUS"] {
            let mut plugin = RecordingPlugin::default();
            let stdin = r#"{"cniVersion":"1.0.0","name":"podman","type":"ebpf-portmap"}"#;
            let error = invoke(&[("CNI_COMMAND", command.into())], stdin, &mut plugin)
                .error(code::INCOMPATIBLE_VERSION);
            assert!(
                error["msg"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("does not allow {command}")),
                "{error}"
            );
            assert!(
                plugin.calls.is_empty(),
                "{command}: plugin must not be called"
            );
        }
    }

    #[test]
    fn gc_passes_the_keep_list() {
        let mut plugin = RecordingPlugin::default();
        let stdin = json!({
            "cniVersion": "1.1.0", "name": "podman", "type": "ebpf-portmap",
            "cni.dev/valid-attachments": [{"containerID": "a1", "ifname": "eth0"}, {"containerID": "b2", "ifname": "net1"}],
            "cni.dev/attachments": [{"containerID": "a1", "ifname": "eth0"}, {"containerID": "b2", "ifname": "net1"}]
        });
        invoke(
            &[("CNI_COMMAND", "GC".into())],
            &stdin.to_string(),
            &mut plugin,
        )
        .assert_silent_success();
        let Call::Gc(req) = plugin.only_call() else {
            panic!("GC must call plugin.gc")
        };
        assert_eq!(
            req.valid,
            vec![
                Attachment {
                    container_id: "a1".into(),
                    ifname: "eth0".into()
                },
                Attachment {
                    container_id: "b2".into(),
                    ifname: "net1".into()
                },
            ],
            "keep-list passed in order"
        );
    }

    #[test]
    fn gc_without_keep_list_means_nothing_is_valid() {
        let mut plugin = RecordingPlugin::default();
        let stdin = r#"{"cniVersion":"1.1.0","name":"podman","type":"ebpf-portmap"}"#;
        invoke(&[("CNI_COMMAND", "GC".into())], stdin, &mut plugin).assert_silent_success();
        assert!(
            matches!(plugin.only_call(), Call::Gc(req) if req.valid.is_empty()),
            "GC without a keep-list passes an empty list"
        );
    }

    #[test]
    fn gc_with_malformed_keep_list_is_refused() {
        let mut plugin = RecordingPlugin::default();
        let stdin = r#"{"cniVersion":"1.1.0","name":"p","type":"t","cni.dev/valid-attachments":[{"containerID":"a"}]}"#;
        let error = invoke(&[("CNI_COMMAND", "GC".into())], stdin, &mut plugin)
            .error(code::INVALID_NETWORK_CONFIG);
        assert!(
            error["msg"]
                .as_str()
                .unwrap()
                .contains("cni.dev/valid-attachments[0].ifname"),
            "{error}"
        );
        assert!(plugin.calls.is_empty(), "plugin must not be called");
    }

    #[test]
    fn status_reaches_the_plugin_and_passes_its_error() {
        let stdin = r#"{"cniVersion":"1.1.0","name":"podman","type":"ebpf-portmap","pinRoot":"/sys/fs/bpf/x"}"#;
        let mut plugin = RecordingPlugin::default();
        invoke(&[("CNI_COMMAND", "STATUS".into())], stdin, &mut plugin).assert_silent_success();
        assert!(
            matches!(plugin.only_call(), Call::Status(conf) if conf.pin_root == Path::new("/sys/fs/bpf/x")),
            "STATUS passes the parsed config"
        );

        let mut plugin = RecordingPlugin {
            fail_with: Some(CniError::new(
                code::PLUGIN_NOT_AVAILABLE,
                "programs not loaded",
                "",
            )),
            ..Default::default()
        };
        let error = invoke(&[("CNI_COMMAND", "STATUS".into())], stdin, &mut plugin)
            .error(code::PLUGIN_NOT_AVAILABLE);
        assert_eq!(
            error["cniVersion"], "1.1.0",
            "the error answers in the config's version"
        );
    }

    #[test]
    fn environment_failures() {
        let stdin = config("1.0.0", http_mapping(), Some(prev_result("1.0.0")));
        /// (label, command, variable, value (None = unset), code, message needle)
        type EnvCase = (
            &'static str,
            &'static str,
            &'static str,
            Option<&'static str>,
            u32,
            &'static str,
        );
        let cases: Vec<EnvCase> = vec![
            (
                "no command",
                "ADD",
                "CNI_COMMAND",
                None,
                4,
                "CNI_COMMAND is not set",
            ),
            (
                "lower-case command",
                "ADD",
                "CNI_COMMAND",
                Some("add"),
                4,
                "CNI_COMMAND \"add\" is not a CNI verb",
            ),
            (
                "unknown command",
                "ADD",
                "CNI_COMMAND",
                Some("UPDATE"),
                4,
                "\"UPDATE\"",
            ),
            (
                "no container ID",
                "ADD",
                "CNI_CONTAINERID",
                None,
                4,
                "CNI_CONTAINERID is not set",
            ),
            (
                "empty container ID",
                "DEL",
                "CNI_CONTAINERID",
                Some(""),
                4,
                "CNI_CONTAINERID \"\"",
            ),
            (
                "container ID with slash",
                "ADD",
                "CNI_CONTAINERID",
                Some("a/../b"),
                4,
                "CNI_CONTAINERID \"a/../b\"",
            ),
            (
                "container ID starting with dot",
                "CHECK",
                "CNI_CONTAINERID",
                Some(".a"),
                4,
                "first character",
            ),
            (
                "no ifname",
                "ADD",
                "CNI_IFNAME",
                None,
                4,
                "CNI_IFNAME is not set",
            ),
            (
                "ifname too long",
                "DEL",
                "CNI_IFNAME",
                Some("abcdefghijklmnop"),
                4,
                "CNI_IFNAME \"abcdefghijklmnop\"",
            ),
            (
                "ifname with slash",
                "ADD",
                "CNI_IFNAME",
                Some("eth/0"),
                4,
                "CNI_IFNAME \"eth/0\"",
            ),
            ("ifname ..", "ADD", "CNI_IFNAME", Some(".."), 4, "reserved"),
            (
                "no CNI_PATH",
                "ADD",
                "CNI_PATH",
                None,
                4,
                "CNI_PATH is not set",
            ),
            (
                "no CNI_PATH on DEL",
                "DEL",
                "CNI_PATH",
                None,
                4,
                "CNI_PATH is not set",
            ),
            (
                "no netns on ADD",
                "ADD",
                "CNI_NETNS",
                None,
                4,
                "CNI_NETNS is not set",
            ),
            (
                "empty netns on ADD",
                "ADD",
                "CNI_NETNS",
                Some(""),
                4,
                "CNI_NETNS is not set",
            ),
            (
                "no netns on CHECK",
                "CHECK",
                "CNI_NETNS",
                None,
                4,
                "CNI_NETNS is not set",
            ),
            (
                "relative netns",
                "ADD",
                "CNI_NETNS",
                Some("proc/1/ns/net"),
                4,
                "not an absolute path",
            ),
            (
                "gone netns on ADD",
                "ADD",
                "CNI_NETNS",
                Some(GONE_NETNS),
                3,
                "container unknown or does not exist",
            ),
            (
                "gone netns on CHECK",
                "CHECK",
                "CNI_NETNS",
                Some(GONE_NETNS),
                3,
                GONE_NETNS,
            ),
        ];
        for (label, command, variable, value, code, needle) in cases {
            let mut plugin = RecordingPlugin::default();
            let mut env = attachment_env(command);
            set(&mut env, variable, value);
            let error = invoke(&env, &stdin, &mut plugin).error(code);
            let message = error["msg"].as_str().unwrap();
            assert!(
                message.contains(needle),
                "{label}: {message:?} should mention {needle:?}"
            );
            assert!(
                plugin.calls.is_empty(),
                "{label}: plugin must not be called: {:?}",
                plugin.calls
            );
        }
    }

    #[test]
    fn undecodable_stdin_is_code_6_in_the_fallback_version() {
        let mut plugin = RecordingPlugin::default();
        let error = invoke(
            &attachment_env("ADD"),
            r#"{"cniVersion":"1.0.0","#,
            &mut plugin,
        )
        .error(code::DECODING_FAILURE);
        assert_eq!(
            error["cniVersion"], FALLBACK_VERSION,
            "config did not parse: fallback version"
        );
        assert!(
            !error["details"].as_str().unwrap().is_empty(),
            "parser position goes to details: {error}"
        );
        assert!(plugin.calls.is_empty(), "plugin must not be called");
    }

    #[test]
    fn oversized_stdin_is_refused_without_reading_it_all() {
        let mut plugin = RecordingPlugin::default();
        // An endless reader: only the bound stops it.
        let mut endless = std::io::repeat(b' ');
        let error = invoke_with_reader(&attachment_env("ADD"), &mut endless, &mut plugin)
            .error(code::DECODING_FAILURE);
        assert!(
            error["msg"].as_str().unwrap().contains("1048576 bytes"),
            "{error}"
        );
        assert!(plugin.calls.is_empty(), "plugin must not be called");
    }

    #[test]
    fn unreadable_stdin_is_an_io_failure() {
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("pipe broke"))
            }
        }
        let mut plugin = RecordingPlugin::default();
        let error = invoke_with_reader(&attachment_env("DEL"), &mut Broken, &mut plugin)
            .error(code::IO_FAILURE);
        assert_eq!(
            error["details"], "pipe broke",
            "the I/O error goes to details, not msg"
        );
        assert!(plugin.calls.is_empty(), "plugin must not be called");
    }

    #[test]
    fn unwritable_stdout_fails_the_invocation() {
        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("disk full"))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut plugin = RecordingPlugin::default();
        let env: HashMap<&str, String> = attachment_env("ADD").into_iter().collect();
        let lookup = |name: &str| env.get(name).cloned();
        let stdin = config("1.0.0", http_mapping(), Some(prev_result("1.0.0")));
        let exit = run(&lookup, &mut stdin.as_bytes(), &mut Full, &mut plugin);
        assert_eq!(exit, 1, "a result the runtime never sees is a failure");
    }

    #[test]
    fn cni_error_json_and_conversions() {
        let error = CniError::new(7, "bad", "why");
        assert_eq!(
            error.to_json("0.4.0"),
            json!({"cniVersion": "0.4.0", "code": 7, "msg": "bad", "details": "why"}),
            "error document has the four spec fields"
        );
        assert_eq!(
            error.to_string(),
            "CNI error 7: bad (why)",
            "Display shows code, msg and details"
        );

        let from_config: CniError = netconf::parse_netconf(b"[").unwrap_err().into();
        assert_eq!(
            from_config.code,
            code::DECODING_FAILURE,
            "invalid JSON maps to code 6"
        );
        assert!(
            !from_config.details.is_empty(),
            "serde's position must be in details"
        );
        assert!(
            !from_config.msg.contains(&from_config.details),
            "msg must not repeat details"
        );

        let from_request: CniError = RequestError::VersionTooOld {
            command: Command::Gc,
            version: "1.0.0".into(),
            minimum: "1.1.0",
        }
        .into();
        assert_eq!(
            from_request.code,
            code::INCOMPATIBLE_VERSION,
            "VersionTooOld maps to code 1"
        );
        assert_eq!(from_request.details, "", "no source, no details");
    }

    #[test]
    fn cni_args_of_containerd_in_any_order_give_the_pod() {
        let pairs = [
            "IgnoreUnknown=1",
            "K8S_POD_NAMESPACE=default",
            "K8S_POD_NAME=web-7f9c",
            "K8S_POD_INFRA_CONTAINER_ID=3a1b2c3d4e5f",
            "K8S_POD_UID=5c9e8a4e-7d6b-4c1a-9a53-0f2f4e6b8c10",
        ];
        let expected = PodIdentity {
            pod_namespace: Some("default".into()),
            pod_name: Some("web-7f9c".into()),
            ..Default::default()
        };
        // containerd builds CNI_ARGS from a Go map: every order happens.
        for rotation in 0..pairs.len() {
            let mut order = pairs.to_vec();
            order.rotate_left(rotation);
            order.swap(0, pairs.len() - 1);
            let (identity, warnings) = parse_cni_args(&order.join(";"));
            assert_eq!(identity, expected, "{order:?}");
            assert!(warnings.is_empty(), "{order:?}: {warnings:?}");
        }
        assert_eq!(expected.label().as_deref(), Some("default/web-7f9c"));
        assert_eq!(expected.to_string(), "pod default/web-7f9c");
    }

    #[test]
    fn cni_args_of_nomad_give_the_allocation() {
        // What Nomad 1.8+ passes on ADD (custom network.cni.args come too).
        let (identity, warnings) = parse_cni_args(
            "IgnoreUnknown=true;NOMAD_REGION=global;NOMAD_NAMESPACE=default;NOMAD_JOB_ID=web;\
             NOMAD_GROUP_NAME=api;NOMAD_ALLOC_ID=5e0c1d2a-8f3b-4c6d-9e7f-0a1b2c3d4e5f;\
             CONSUL_IPTABLES_CONFIG={\"x\":1};my_arg=x",
        );
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(
            identity,
            PodIdentity {
                nomad_alloc_id: Some("5e0c1d2a-8f3b-4c6d-9e7f-0a1b2c3d4e5f".into()),
                nomad_namespace: Some("default".into()),
                nomad_job: Some("web".into()),
                nomad_group: Some("api".into()),
                ..Default::default()
            }
        );
        assert_eq!(identity.label().as_deref(), Some("nomad:default/web/api"));
        assert_eq!(
            identity.to_string(),
            "Nomad allocation 5e0c1d2a-8f3b-4c6d-9e7f-0a1b2c3d4e5f (job default/web, group api)"
        );
    }

    #[test]
    fn bad_cni_args_are_warnings_and_the_rest_still_counts() {
        let long = "n".repeat(300);
        let (identity, warnings) = parse_cni_args(&format!(
            "garbage;=x;K8S_POD_NAMESPACE=prod;K8S_POD_NAME={long};;FOO=1;K8S_POD_NAME=a\u{7}b"
        ));
        assert_eq!(
            identity,
            PodIdentity {
                pod_namespace: Some("prod".into()),
                ..Default::default()
            },
            "the good pair is kept, the bad ones are not"
        );
        assert_eq!(
            warnings,
            vec![
                CniArgsWarning::Malformed {
                    pair: "garbage".into()
                },
                CniArgsWarning::Malformed { pair: "=x".into() },
                CniArgsWarning::TooLong {
                    key: "K8S_POD_NAME".into(),
                    len: 300,
                    max: POD_NAME_LEN
                },
                CniArgsWarning::ControlCharacter {
                    key: "K8S_POD_NAME".into()
                },
                CniArgsWarning::Unknown { key: "FOO".into() },
            ]
        );
        let (identity, warnings) = parse_cni_args("");
        assert!(identity.is_empty() && warnings.is_empty());
        assert_eq!(identity.label(), None);
        // A later pair wins, and an empty value means absent.
        let (identity, _) = parse_cni_args("K8S_POD_NAME=a;K8S_POD_NAME=b;K8S_POD_NAMESPACE=");
        assert_eq!(identity.pod_name.as_deref(), Some("b"));
        assert_eq!(identity.pod_namespace, None);
        assert_eq!(identity.label().as_deref(), Some("-/b"));
    }

    #[test]
    fn cni_args_reach_the_plugin_and_never_fail_a_verb() {
        for command in ["ADD", "DEL", "CHECK"] {
            let mut plugin = RecordingPlugin::default();
            let mut env = attachment_env(command);
            set(
                &mut env,
                "CNI_ARGS",
                Some("K8S_POD_NAME=web;bogus;K8S_POD_NAMESPACE=default;X=1"),
            );
            let stdin = config("1.0.0", http_mapping(), Some(prev_result("1.0.0")));
            let outcome = invoke(&env, &stdin, &mut plugin);
            assert_eq!(outcome.exit, 0, "{command}");
            let req = match plugin.only_call() {
                Call::Add(req) | Call::Del(req) | Call::Check(req) => req,
                other => panic!("{command}: {other:?}"),
            };
            assert_eq!(
                req.identity.label().as_deref(),
                Some("default/web"),
                "{command}"
            );
        }
    }

    /// The request containerd 1.6 sends (issue #13): Go field names and its CNI_ARGS.
    #[test]
    fn containerd_request_is_accepted() {
        let mut plugin = RecordingPlugin::default();
        let mut env = attachment_env("ADD");
        set(
            &mut env,
            "CNI_ARGS",
            Some(
                "K8S_POD_INFRA_CONTAINER_ID=3f6940ab5ab4;K8S_POD_UID=u;IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-7f9c",
            ),
        );
        let stdin = config(
            "1.0.0",
            json!([{"HostPort":18080,"ContainerPort":80,"Protocol":"tcp","HostIP":""}]),
            Some(prev_result("1.0.0")),
        );
        invoke(&env, &stdin, &mut plugin).success_document();
        let Call::Add(req) = plugin.only_call() else {
            panic!("ADD must call plugin.add")
        };
        assert_eq!(
            req.conf.port_mappings,
            vec![PortMapping {
                host_ip: HostIp::Any,
                host_port: 18080,
                container_port: 80,
                protocol: Protocol::Tcp
            }]
        );
        assert_eq!(req.identity.label().as_deref(), Some("default/web-7f9c"));
    }

    #[test]
    fn commands_round_trip() {
        for command in [
            Command::Add,
            Command::Del,
            Command::Check,
            Command::Gc,
            Command::Status,
            Command::Version,
        ] {
            assert_eq!(
                Command::from_env_value(command.as_str()),
                Some(command),
                "{command}"
            );
        }
        assert_eq!(
            Command::from_env_value("Add"),
            None,
            "verbs are upper case only"
        );
    }
}
