//! The CNI front end: reads the `CNI_*` environment and stdin, validates them
//! into a typed request, dispatches the verb to a [`Plugin`] and writes the one
//! JSON document the runtime expects on stdout.
//!
//! Environment, stdin and stdout are injected so dispatch is unit-tested with a
//! fake plugin and no kernel. Logs go through `log`, never to stdout: stdout is
//! the CNI result.

pub mod error;
pub mod json_keys;
pub mod netconf;
pub mod port_mappings;
pub mod prev_result;

use std::any::Any;
use std::fmt;
use std::io::{Read, Write};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

pub use crate::cni::error::CniError;
use crate::cni::error::code;
use crate::cni::netconf::{ConfigError, IdentifierError, IfnameError, NetConf, SUPPORTED_VERSIONS};
use crate::cni::prev_result::PrevResult;
use crate::model::{Attachment, ContainerAddrs, Owner, PodIdentity, PrevInterface};
use portmap_common::{NOMAD_FIELD_LEN, POD_NAME_LEN, POD_NAMESPACE_LEN};

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
    port_mappings::check_mappings_reachable(&conf, &prev.container, &attachment.ifname)?;

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
    port_mappings::check_mappings_reachable(&conf, &prev.container, &attachment.ifname)?;
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

#[cfg(test)]
mod tests;
