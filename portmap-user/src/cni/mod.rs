//! The CNI front end: reads the `CNI_*` environment and stdin, validates them
//! into a typed request, dispatches the verb to a [`Plugin`] and writes the one
//! JSON document the runtime expects on stdout.
//!
//! Environment, stdin and stdout are injected so dispatch is unit-tested with a
//! fake plugin and no kernel. Logs go through `log`, never to stdout: stdout is
//! the CNI result.

pub mod env;
pub mod error;
pub mod json;
pub mod json_keys;
pub mod names;
pub mod netconf;
pub mod port_mappings;
pub mod prev_result;

use std::any::Any;
use std::io::{Read, Write};
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;

use serde_json::{Value, json};

pub use crate::cni::env::MAX_STDIN_BYTES;
use crate::cni::env::{AttachmentEnv, Command, RequestError, read_stdin};
pub use crate::cni::error::CniError;
use crate::cni::error::code;
use crate::cni::netconf::{ConfigError, NetConf, SUPPORTED_VERSIONS};
use crate::cni::port_mappings::MappingError;
use crate::cni::prev_result::{PrevResult, PrevResultError};
use crate::model::{Attachment, ContainerAddrs, Owner, PodIdentity, PrevInterface};

/// Version used for replies when stdin gives no supported `cniVersion`.
pub const FALLBACK_VERSION: &str = "1.1.0";

/// First version with CHECK.
const CHECK_MIN_VERSION: &str = "0.4.0";
/// First version with GC and STATUS.
const GC_STATUS_MIN_VERSION: &str = "1.1.0";

impl From<ConfigError> for CniError {
    fn from(error: ConfigError) -> Self {
        CniError::from_error(error.cni_code(), &error)
    }
}

impl From<MappingError> for CniError {
    fn from(error: MappingError) -> Self {
        CniError::from_error(error.cni_code(), &error)
    }
}

impl From<PrevResultError> for CniError {
    fn from(error: PrevResultError) -> Self {
        CniError::from_error(error.cni_code(), &error)
    }
}

impl From<RequestError> for CniError {
    fn from(error: RequestError) -> Self {
        CniError::from_error(error.cni_code(), &error)
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

/// The request of ADD, DEL or CHECK: the attachment's environment, its
/// configuration and what prevResult told of the container.
fn request(attachment: AttachmentEnv, conf: NetConf, prev: PrevResult) -> Request {
    Request {
        owner: Owner {
            network: conf.name.clone(),
            container_id: attachment.container_id,
            ifname: attachment.ifname,
        },
        conf,
        netns: attachment.netns,
        container: prev.container,
        interfaces: prev.interfaces,
        identity: attachment.identity,
    }
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

/// What one invocation came to, for the binary to count: every exit, the
/// configuration errors refused before the plugin is reached included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The verb `CNI_COMMAND` named; `None` when it named none.
    pub command: Option<Command>,
    /// The CNI result code: 0 for success, else the error object's code.
    pub code: u32,
    /// The process exit status (0 ok, 1 error).
    pub exit: i32,
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
    run_for_outcome(env, stdin, stdout, plugin).exit
}

/// [`run`], saying which verb ran and with which CNI code it ended.
pub fn run_for_outcome(
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    plugin: &mut dyn Plugin,
) -> Outcome {
    let command = env("CNI_COMMAND").and_then(|value| Command::from_env_value(&value));
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

    let ended = |code, exit| Outcome {
        command,
        code,
        exit,
    };
    match outcome {
        Ok(None) => ended(0, 0),
        Ok(Some(document)) => {
            if write_document(stdout, &document) {
                ended(0, 0)
            } else {
                ended(0, 1)
            }
        }
        Err(error) => {
            log::error!("{error}");
            write_document(stdout, &error.to_json(&reply_version));
            ended(error.code, 1)
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
    env::check_recorded_names(&attachment.container_id, &conf.name)?;
    let prev_result = conf.prev_result.clone().ok_or(RequestError::NotChained)?;
    let prev = PrevResult::parse(&prev_result, &attachment.ifname)?;
    port_mappings::check_mappings_reachable(
        &conf.port_mappings,
        &conf.host_ip_keys,
        &prev.container,
        &attachment.ifname,
    )?;

    let cni_version = conf.cni_version.clone();
    plugin.add(&request(attachment, conf, prev))?;

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
    plugin.del(&request(attachment, conf, prev))
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
    port_mappings::check_mappings_reachable(
        &conf.port_mappings,
        &conf.host_ip_keys,
        &prev.container,
        &attachment.ifname,
    )?;
    plugin.check(&request(attachment, conf, prev))
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
