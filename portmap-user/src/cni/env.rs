//! The invocation itself: the CNI verb (`CNI_COMMAND`), the attachment's
//! environment (`CNI_CONTAINERID`, `CNI_IFNAME`, `CNI_NETNS`, `CNI_ARGS`),
//! stdin, and what can be wrong with them ([`RequestError`]).

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::cni::error::code;
use crate::cni::names::{
    IdentifierError, IfnameError, NameTooLong, validate_identifier, validate_ifname,
    validate_recorded_length,
};
use crate::model::PodIdentity;
use portmap_common::{NOMAD_FIELD_LEN, POD_NAME_LEN, POD_NAMESPACE_LEN, POD_UID_LEN};

/// Most bytes read from stdin. Real configurations are a few KiB (1024
/// mappings are ~100 KiB); the bound keeps a runaway caller from making us
/// allocate without limit.
pub const MAX_STDIN_BYTES: usize = 1 << 20;

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
    #[error(
        "{field} {value:?} is too long for ADD: {reason}. Use a {} of at most {limit} bytes (containerd, CRI-O and Podman IDs are 64, Nomad's 36)",
        field.what(),
        limit = crate::cni::names::MAX_RECORDED_NAME_LEN
    )]
    NameTooLong {
        field: RecordedName,
        value: String,
        reason: NameTooLong,
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
            RequestError::NameTooLong { field, .. } => match field {
                RecordedName::ContainerId => code::INVALID_ENVIRONMENT_VARIABLES,
                RecordedName::Network => code::INVALID_NETWORK_CONFIG,
            },
            RequestError::NetnsGone { .. } => code::UNKNOWN_CONTAINER,
            RequestError::StdinTooLarge { .. } => code::DECODING_FAILURE,
            RequestError::StdinRead { .. } => code::IO_FAILURE,
            RequestError::NotChained => code::INVALID_NETWORK_CONFIG,
            RequestError::VersionTooOld { .. } => code::INCOMPATIBLE_VERSION,
        }
    }
}

/// A name ADD records in the owner record, for [`RequestError::NameTooLong`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordedName {
    /// `CNI_CONTAINERID`.
    ContainerId,
    /// The configuration's `name`.
    Network,
}

impl RecordedName {
    fn what(self) -> &'static str {
        match self {
            RecordedName::ContainerId => "container ID",
            RecordedName::Network => "network name",
        }
    }
}

impl fmt::Display for RecordedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RecordedName::ContainerId => "CNI_CONTAINERID",
            RecordedName::Network => "network name (`name`)",
        })
    }
}

/// ADD's check that the container ID and the network name fit an owner
/// record whole (see [`crate::cni::names::MAX_RECORDED_NAME_LEN`]). Only
/// ADD: DEL and GC of a longer name must still succeed, finding nothing.
pub(super) fn check_recorded_names(container_id: &str, network: &str) -> Result<(), RequestError> {
    for (field, value) in [
        (RecordedName::ContainerId, container_id),
        (RecordedName::Network, network),
    ] {
        validate_recorded_length(value).map_err(|reason| RequestError::NameTooLong {
            field,
            value: value.to_owned(),
            reason,
        })?;
    }
    Ok(())
}

/// The per-attachment environment of ADD, DEL and CHECK, validated.
pub(super) struct AttachmentEnv {
    pub(super) container_id: String,
    pub(super) ifname: String,
    pub(super) netns: Option<PathBuf>,
    pub(super) identity: PodIdentity,
}

impl AttachmentEnv {
    pub(super) fn from_env(
        env: &dyn Fn(&str) -> Option<String>,
        command: Command,
    ) -> Result<Self, RequestError> {
        let required =
            |name: &'static str| env(name).ok_or(RequestError::MissingEnv { name, command });

        let container_id = required("CNI_CONTAINERID")?;
        if let Err(reason) = validate_identifier(&container_id) {
            return Err(RequestError::InvalidContainerId {
                value: container_id,
                reason,
            });
        }
        let ifname = required("CNI_IFNAME")?;
        if let Err(reason) = validate_ifname(&ifname) {
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
/// CRI-O send the sandbox ID again (it is CNI_CONTAINERID).
const KNOWN_UNUSED_ARGS: &[&str] = &["K8S_POD_INFRA_CONTAINER_ID", "NOMAD_REGION"];

/// Parses `CNI_ARGS` (`KEY=VALUE;KEY=VALUE`, the CNI spec's form, in any
/// order) into the identity it carries, and what it had to skip.
///
/// Read: `K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_UID` (containerd, CRI-O),
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
            "K8S_POD_UID" => (&mut identity.pod_uid, POD_UID_LEN),
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
pub(super) fn read_stdin(stdin: &mut dyn Read) -> Result<Vec<u8>, RequestError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_refuses_names_an_owner_record_would_cut() {
        let id = "3f6940ab5ab43bc522569d15b23f8c1bbde1d7678b080398506924fc01d72755";
        check_recorded_names(id, "podman").expect("a runtime's ID and a short network");
        let long = "c".repeat(200);
        let error = check_recorded_names(&long, "podman").expect_err("200-byte container ID");
        assert_eq!(error.cni_code(), code::INVALID_ENVIRONMENT_VARIABLES);
        let text = error.to_string();
        assert!(
            text.starts_with("CNI_CONTAINERID") && text.contains("200 bytes"),
            "names the field and its length: {text}"
        );
        let error = check_recorded_names(id, &long).expect_err("200-byte network name");
        assert_eq!(error.cni_code(), code::INVALID_NETWORK_CONFIG);
        let text = error.to_string();
        assert!(
            text.starts_with("network name (`name`)") && text.contains("at most 128"),
            "names the field and the limit: {text}"
        );
    }
}
