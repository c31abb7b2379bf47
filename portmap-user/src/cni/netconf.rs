//! Network configuration: turns the JSON the runtime hands us on stdin into
//! validated, typed values (`NetConf`, `PortMapping`, `Attachment`) and reads the
//! container's addresses out of `prevResult`.
//!
//! Everything here is pure (no syscalls) so each rule is unit-tested without a
//! kernel. The JSON is walked by hand rather than through `#[derive(Deserialize)]`
//! so that every error can name the exact key and list index the user must fix.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::net::{AddrParseError, IpAddr};
use std::path::{Path, PathBuf};

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::cni::code;
use crate::cni::json_keys::{self, Field, Found, Object, Resolved};
use crate::model::{
    Attachment, CONNTRACK_SIZE_MAX, CONNTRACK_SIZE_MIN, ContainerAddrs, DEFAULT_PIN_ROOT,
    HostClaim, HostIp, MAX_MAPPINGS_MAX, MAX_MAPPINGS_MIN, PortMapping, Protocol,
};

/// CNI spec versions this plugin speaks. 0.1.0/0.2.0 are left out: their results
/// have no `interfaces` list, so the sandbox interface cannot be identified.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// Default of `logFile`: where the plugin logs its decisions.
pub const DEFAULT_LOG_FILE: &str = "/var/log/ebpf-portmap.log";

/// What ADD does when a node process already listens on a requested host
/// port (`hostPortListeners`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ListenerPolicy {
    /// Refuse the mapping: it would silently take the port from the node's
    /// own service. Sockets held by a runtime's port reservation (podman's
    /// conmon, docker-proxy, ...) do not count.
    #[default]
    Refuse,
    /// Map anyway and log a warning (what iptables portmap does silently).
    Allow,
}

/// Longest interface name the kernel accepts: `IFNAMSIZ` (16) minus the NUL.
pub const MAX_IFNAME_LEN: usize = 15;

/// Key under which the runtime passes the GC keep-list (CNI 1.1).
pub const VALID_ATTACHMENTS_KEY: &str = "cni.dev/valid-attachments";
/// Name used by an early draft of the 1.1 spec; libcni sends both keys with the
/// same value (containernetworking/cni#1101), so we read it when the proper key
/// is absent.
pub const LEGACY_ATTACHMENTS_KEY: &str = "cni.dev/attachments";

const MAPPINGS_KEY: &str = "runtimeConfig.portMappings";

/// The validated network configuration handed to this plugin.
#[derive(Debug, Clone)]
pub struct NetConf {
    pub cni_version: String,
    /// Network name (`name`).
    pub name: String,
    /// `type`.
    pub plugin_type: String,
    /// `pinRoot`: absolute path, default [`DEFAULT_PIN_ROOT`].
    pub pin_root: PathBuf,
    /// `interfaces`: names or shell-style patterns (`eth*`) of the node
    /// interfaces to attach to instead of the default (every up interface).
    pub interfaces: Option<Vec<String>>,
    /// `conntrackSize`: entries in the conntrack map.
    pub conntrack_size: Option<u32>,
    /// `logFile`: absolute path, default [`DEFAULT_LOG_FILE`].
    pub log_file: PathBuf,
    /// `maxMappings`: entries in the mappings map (set when the maps are
    /// first created).
    pub max_mappings: Option<u32>,
    /// `hostPortListeners`: "refuse" (default) or "allow".
    pub listener_policy: ListenerPolicy,
    /// `snat` (default true): masquerade hairpin flows so their answers
    /// come back through the node.
    pub snat: bool,
    /// `masqAll` (default false): masquerade every translated flow.
    pub masq_all: bool,
    /// `fastPath` (default false): hand translated packets straight to the
    /// container's veth and answers straight to the interface towards the
    /// client, skipping the node's routing, netfilter and bridge.
    pub fast_path: bool,
    /// `cgroupPath`: cgroup v2 directory the socket hooks attach to; default
    /// the root of the node's cgroup2 hierarchy.
    pub cgroup_path: Option<PathBuf>,
    /// `runtimeConfig.portMappings`, validated (empty if absent).
    pub port_mappings: Vec<PortMapping>,
    /// For each of `port_mappings`, the path of its `hostIP` key as the
    /// configuration spells it, for messages about the mapping (empty when
    /// the mapping has no specific hostIP).
    pub host_ip_keys: Vec<String>,
    /// Raw `prevResult` (always a JSON object when present), echoed by ADD.
    /// Only `cni` reads it: the verbs get it parsed
    /// ([`crate::cni::prev_result::PrevResult`]).
    pub(in crate::cni) prev_result: Option<Value>,
    /// GC only: `cni.dev/valid-attachments`.
    pub valid_attachments: Option<Vec<Attachment>>,
}

/// Why a name (network name, container ID) breaks the CNI spec's
/// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentifierError {
    #[error("it is empty")]
    Empty,
    #[error("it starts with {ch:?}; the first character must be an ASCII letter or digit")]
    BadFirstChar { ch: char },
    #[error(
        "it contains {ch:?} at byte {position}; only ASCII letters, digits, '_', '.' and '-' are allowed"
    )]
    BadChar { ch: char, position: usize },
}

/// Checks the CNI spec's identifier rule, shared by network names and container IDs.
pub fn validate_identifier(value: &str) -> Result<(), IdentifierError> {
    let mut chars = value.char_indices();
    match chars.next() {
        None => return Err(IdentifierError::Empty),
        Some((_, ch)) if !ch.is_ascii_alphanumeric() => {
            return Err(IdentifierError::BadFirstChar { ch });
        }
        Some(_) => {}
    }
    match chars.find(|(_, ch)| !(ch.is_ascii_alphanumeric() || matches!(ch, '_' | '.' | '-'))) {
        Some((position, ch)) => Err(IdentifierError::BadChar { ch, position }),
        None => Ok(()),
    }
}

/// Why the kernel would refuse an interface name (mirrors `dev_valid_name()`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IfnameError {
    #[error("it is empty")]
    Empty,
    #[error("it is {len} bytes long; the kernel allows at most {MAX_IFNAME_LEN}")]
    TooLong { len: usize },
    #[error("\".\" and \"..\" are reserved and cannot name an interface")]
    Reserved,
    #[error("it contains {ch:?}, which the kernel does not allow in interface names")]
    ForbiddenChar { ch: char },
}

/// Checks a name the way the kernel's `dev_valid_name()` does, so a bad name is
/// reported here with its source rather than as an opaque netlink EINVAL later.
pub fn validate_ifname(name: &str) -> Result<(), IfnameError> {
    if name.is_empty() {
        return Err(IfnameError::Empty);
    }
    if name.len() > MAX_IFNAME_LEN {
        return Err(IfnameError::TooLong { len: name.len() });
    }
    if name == "." || name == ".." {
        return Err(IfnameError::Reserved);
    }
    // Checked byte-wise like the kernel: its isspace() also matches 0xa0, which
    // can appear inside a UTF-8 sequence; NUL would silently truncate the name.
    let forbidden = |byte: u8| {
        matches!(byte, b'/' | b':' | b'\0' | 0xa0) || byte.is_ascii_whitespace() || byte == 0x0b
    };
    match name.bytes().find(|byte| forbidden(*byte)) {
        Some(byte) => Err(IfnameError::ForbiddenChar {
            ch: char::from(byte),
        }),
        None => Ok(()),
    }
}

/// Everything that can be wrong with the configuration on stdin.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("the network configuration on stdin is not valid JSON")]
    InvalidJson {
        #[source]
        source: serde_json::Error,
    },
    #[error("the network configuration on stdin must be a JSON object, found {found}")]
    NotAnObject { found: &'static str },
    #[error("cniVersion is missing; set it to one of {}", SUPPORTED_VERSIONS.join(", "))]
    MissingVersion,
    #[error(
        "{key} {version} is not supported; use one of {}",
        SUPPORTED_VERSIONS.join(", ")
    )]
    UnsupportedVersion {
        key: String,
        /// The value as JSON text, so a non-string shows as what it is.
        version: String,
    },
    #[error("{field} is missing")]
    MissingField { field: String },
    #[error("{key} must not be empty")]
    EmptyField { key: String },
    #[error("{key}: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{key}: {value} is not an integer")]
    NotAnInteger { key: String, value: String },
    #[error("{key}: {value:?} is not a valid network name: {reason}")]
    InvalidNetworkName {
        key: String,
        value: String,
        reason: IdentifierError,
    },
    #[error(
        "{key}: {value:?} {reason}; use an absolute path on a bpffs mount such as {DEFAULT_PIN_ROOT}"
    )]
    InvalidPinRoot {
        key: String,
        value: String,
        reason: &'static str,
    },
    #[error("{key}: {value:?} is not a valid interface name: {reason}")]
    InvalidInterfaceName {
        key: String,
        value: String,
        reason: IfnameError,
    },
    #[error(
        "{key}: {value:?} is not a valid interface pattern; use names and shell-style wildcards such as \"eth*\" or \"bond0.*\""
    )]
    InvalidInterfacePattern {
        key: String,
        value: String,
        #[source]
        source: glob::PatternError,
    },
    #[error("{key} must list at least one interface; remove the key to use the default")]
    EmptyInterfaceList { key: String },
    #[error("{key}[{second}] repeats {name:?} from {key}[{first}]; list each interface once")]
    DuplicateInterface {
        key: String,
        first: usize,
        second: usize,
        name: String,
    },
    #[error("{key}: {value} is out of range {CONNTRACK_SIZE_MIN}-{CONNTRACK_SIZE_MAX}")]
    ConntrackSizeOutOfRange { key: String, value: String },
    #[error("{key}: {value:?} {reason}; use an absolute file path such as {DEFAULT_LOG_FILE}")]
    InvalidLogFile {
        key: String,
        value: String,
        reason: &'static str,
    },
    #[error("{key}: {value} is not true or false")]
    NotABool { key: String, value: String },
    #[error("{key}: {value} must be an absolute path to a cgroup v2 directory")]
    InvalidCgroupPath { key: String, value: String },
    #[error("{key}: {value} is out of range {MAX_MAPPINGS_MIN}-{MAX_MAPPINGS_MAX}")]
    MaxMappingsOutOfRange { key: String, value: String },
    #[error("{key}: {value} is not one of \"refuse\" or \"allow\"")]
    InvalidListenerPolicy { key: String, value: String },
    #[error(
        "{key} has {count} entries, more than the mappings map holds (maxMappings {max}); raise maxMappings or map fewer ports"
    )]
    TooManyMappings {
        key: String,
        count: usize,
        max: usize,
    },
    #[error("{key}: {value} is out of range 1-65535")]
    PortOutOfRange { key: String, value: String },
    #[error("{key}: {protocol:?} is not supported; use tcp, udp or sctp")]
    UnknownProtocol { key: String, protocol: String },
    #[error(
        "{key}: {value:?} is not an IP address; give an IPv4 or IPv6 address, \"0.0.0.0\", \"::\", or leave it empty for every local address"
    )]
    InvalidHostIp {
        key: String,
        value: String,
        #[source]
        source: AddrParseError,
    },
    #[error("{key}: {address} {reason}")]
    UnusableHostIp {
        key: String,
        address: IpAddr,
        reason: &'static str,
    },
    #[error(
        "{list}[{second}] duplicates {list}[{first}]: both claim {protocol} port {host_port} on {claim}; remove one or give them different hostIP values"
    )]
    DuplicateMapping {
        /// The mappings list's path as the configuration spells it.
        list: String,
        first: usize,
        second: usize,
        protocol: Protocol,
        host_port: u16,
        /// Human description of the shared address slot, e.g. "every local IPv4 address".
        claim: String,
    },
    #[error(
        "{list}[{specific}] overlaps {list}[{wildcard}]: {protocol} port {host_port} on {address} is part of {claim} that {list}[{wildcard}] claims; remove one or give them different ports"
    )]
    OverlappingMappings {
        list: String,
        wildcard: usize,
        specific: usize,
        protocol: Protocol,
        host_port: u16,
        address: IpAddr,
        /// The wildcard's address slot, e.g. "every local IPv4 address".
        claim: String,
    },
    #[error("{key}: {value:?} is not an address in CIDR form such as \"10.0.0.2/24\"")]
    InvalidCidr { key: String, value: String },
    #[error(
        "prevResult has no IPv4 or IPv6 address for sandbox interface {ifname:?}, so there is nothing to forward ports to; chain ebpf-portmap after a plugin that assigns the container an address"
    )]
    NoContainerAddress { ifname: String },
    #[error(
        "{key}: {host_ip} is {family} but interface {ifname:?} has no {family} address in prevResult; use a hostIP of the container's family or leave hostIP empty"
    )]
    ContainerLacksFamily {
        /// The mapping's hostIP key as the configuration spells it.
        key: String,
        host_ip: HostIp,
        family: &'static str,
        ifname: String,
    },
}

impl ConfigError {
    /// The CNI spec error code for this error.
    pub fn cni_code(&self) -> u32 {
        match self {
            ConfigError::InvalidJson { .. } | ConfigError::NotAnObject { .. } => {
                code::DECODING_FAILURE
            }
            ConfigError::MissingVersion | ConfigError::UnsupportedVersion { .. } => {
                code::INCOMPATIBLE_VERSION
            }
            ConfigError::MissingField { .. }
            | ConfigError::EmptyField { .. }
            | ConfigError::WrongType { .. }
            | ConfigError::NotAnInteger { .. }
            | ConfigError::InvalidNetworkName { .. }
            | ConfigError::InvalidPinRoot { .. }
            | ConfigError::InvalidInterfaceName { .. }
            | ConfigError::InvalidInterfacePattern { .. }
            | ConfigError::EmptyInterfaceList { .. }
            | ConfigError::DuplicateInterface { .. }
            | ConfigError::ConntrackSizeOutOfRange { .. }
            | ConfigError::InvalidLogFile { .. }
            | ConfigError::MaxMappingsOutOfRange { .. }
            | ConfigError::NotABool { .. }
            | ConfigError::InvalidCgroupPath { .. }
            | ConfigError::InvalidListenerPolicy { .. }
            | ConfigError::TooManyMappings { .. }
            | ConfigError::PortOutOfRange { .. }
            | ConfigError::UnknownProtocol { .. }
            | ConfigError::InvalidHostIp { .. }
            | ConfigError::UnusableHostIp { .. }
            | ConfigError::DuplicateMapping { .. }
            | ConfigError::OverlappingMappings { .. }
            | ConfigError::InvalidCidr { .. }
            | ConfigError::NoContainerAddress { .. }
            | ConfigError::ContainerLacksFamily { .. } => code::INVALID_NETWORK_CONFIG,
        }
    }
}

/// Parses and validates the configuration for ADD, CHECK and STATUS: any error
/// anywhere fails the request.
pub fn parse_netconf(stdin: &[u8]) -> Result<NetConf, ConfigError> {
    let (conf, dropped) = parse(stdin, Strictness::Strict)?;
    debug_assert!(dropped.is_empty(), "strict parsing never drops errors");
    Ok(conf)
}

/// Parses the configuration for DEL and GC. Teardown must not get stuck on data
/// it does not need: entries are removed by owner, not by mapping, so an invalid
/// `runtimeConfig` or `prevResult` (which would already have failed the ADD) is
/// dropped and returned as the second value for the caller to log. Everything
/// teardown does need (version, name, pinRoot, ...) is still validated.
pub fn parse_netconf_for_teardown(
    stdin: &[u8],
) -> Result<(NetConf, Vec<ConfigError>), ConfigError> {
    parse(stdin, Strictness::TolerateRequestData)
}

/// Numeric form of a supported version string, for "at least" comparisons.
pub fn version_tuple(version: &str) -> Option<(u32, u32, u32)> {
    let mut parts = version.split('.').map(|part| part.parse::<u32>().ok());
    let tuple = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(tuple)
}

/// Whether `version` is the same as or newer than `minimum`. Unparseable
/// versions are never "at least" anything.
pub fn version_at_least(version: &str, minimum: &str) -> bool {
    match (version_tuple(version), version_tuple(minimum)) {
        (Some(version), Some(minimum)) => version >= minimum,
        _ => false,
    }
}
/// container needs an address, and a mapping pinned to one family (an explicit
/// address, "0.0.0.0" or "::") needs a container address of that family.
/// Upstream portmap silently skipped such mappings; a port that never opens is
/// worse than an error.
pub fn check_mappings_reachable(
    conf: &NetConf,
    container: &ContainerAddrs,
    ifname: &str,
) -> Result<(), ConfigError> {
    mappings_reachable(
        &conf.port_mappings,
        |index| {
            conf.host_ip_keys
                .get(index)
                .filter(|key| !key.is_empty())
                .cloned()
                .unwrap_or_else(|| format!("{MAPPINGS_KEY}[{index}].hostIP"))
        },
        container,
        ifname,
    )
}

fn mappings_reachable(
    mappings: &[PortMapping],
    host_ip_key: impl Fn(usize) -> String,
    container: &ContainerAddrs,
    ifname: &str,
) -> Result<(), ConfigError> {
    if mappings.is_empty() {
        return Ok(());
    }
    if container.v4.is_none() && container.v6.is_none() {
        return Err(ConfigError::NoContainerAddress {
            ifname: ifname.to_owned(),
        });
    }
    for (index, mapping) in mappings.iter().enumerate() {
        let missing_family = match mapping.host_ip {
            HostIp::Any => None,
            HostIp::AnyV4 | HostIp::Addr(IpAddr::V4(_)) => container.v4.is_none().then_some("IPv4"),
            HostIp::AnyV6 | HostIp::Addr(IpAddr::V6(_)) => container.v6.is_none().then_some("IPv6"),
        };
        if let Some(family) = missing_family {
            return Err(ConfigError::ContainerLacksFamily {
                key: host_ip_key(index),
                host_ip: mapping.host_ip,
                family,
                ifname: ifname.to_owned(),
            });
        }
    }
    Ok(())
}

/// The keys we read, per object, in the order upstream's structs declare
/// them (which decides a tie between two fields a key folds to; none of these
/// lists has one). The kinds are the Go types' (see [`json_keys::Kind`]);
/// our own keys are typed as a Go plugin would type them.
const ROOT_FIELDS: &[Field] = &[
    Field::scalar("cniVersion"),
    Field::scalar("name"),
    Field::scalar("type"),
    Field::structure("runtimeConfig"),
    Field::map("prevResult"),
    Field::nullable(VALID_ATTACHMENTS_KEY),
    Field::nullable(LEGACY_ATTACHMENTS_KEY),
    Field::nullable("snat"),
    Field::scalar("pinRoot"),
    Field::nullable("interfaces"),
    Field::scalar("conntrackSize"),
    Field::scalar("logFile"),
    Field::scalar("maxMappings"),
    Field::scalar("hostPortListeners"),
    Field::scalar("masqAll"),
    Field::scalar("fastPath"),
    Field::scalar("cgroupPath"),
];
const RUNTIME_CONFIG_FIELDS: &[Field] = &[Field::nullable("portMappings")];
/// Upstream's `PortMapEntry`; also libcni's, ocicni's and go-cni's
/// `PortMapping` (go-cni's has no tags, hence containerd's `HostPort`).
const MAPPING_FIELDS: &[Field] = &[
    Field::scalar("hostPort"),
    Field::scalar("containerPort"),
    Field::scalar("protocol"),
    Field::scalar("hostIP"),
];
const ATTACHMENT_FIELDS: &[Field] = &[Field::scalar("containerID"), Field::scalar("ifname")];

/// A value from the configuration with its key path as the user spelled it.
#[derive(Debug)]
struct Given {
    key: String,
    value: Value,
}

/// `parent.key` (or `key` at the root).
pub(super) fn key_path(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// The value of a found key, parsed.
fn given(found: Option<Found<'_, RawValue>>, parent: &str) -> Result<Option<Given>, ConfigError> {
    found
        .map(|found| {
            Ok(Given {
                key: key_path(parent, found.key),
                value: raw_to_value(found.value)?,
            })
        })
        .transpose()
}

fn raw_to_value(raw: &RawValue) -> Result<Value, ConfigError> {
    // Only numbers beyond f64 fail here: the text was checked as JSON already.
    serde_json::from_str(raw.get()).map_err(|source| ConfigError::InvalidJson { source })
}

/// An object of the configuration, or the error naming `key` when the value
/// is something else.
fn object<'a>(key: &str, raw: &'a RawValue) -> Result<Object<'a>, ConfigError> {
    Object::parse(raw.get()).map_err(|_| ConfigError::WrongType {
        key: key.to_owned(),
        expected: "an object",
        found: json_keys::kind_of(raw),
    })
}

/// The configuration on stdin as an object, keys in document order.
fn root_object(stdin: &[u8]) -> Result<Object<'_>, ConfigError> {
    match serde_json::from_slice::<Object<'_>>(stdin) {
        Ok(root) => Ok(root),
        Err(source) => match serde_json::from_slice::<Value>(stdin) {
            Ok(other) => Err(ConfigError::NotAnObject {
                found: json_kind(&other),
            }),
            Err(_) => Err(ConfigError::InvalidJson { source }),
        },
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strictness {
    Strict,
    TolerateRequestData,
}

fn parse(stdin: &[u8], strictness: Strictness) -> Result<(NetConf, Vec<ConfigError>), ConfigError> {
    let root = root_object(stdin)?;
    let fields = root.resolve(ROOT_FIELDS);
    let value = |name: &str| given(fields.get(name), "");

    let cni_version = parse_version(value("cniVersion")?)?;
    let (name_key, name) = required_string(value("name")?, "name")?;
    validate_identifier(&name).map_err(|reason| ConfigError::InvalidNetworkName {
        key: name_key,
        value: name.clone(),
        reason,
    })?;
    let (type_key, plugin_type) = required_string(value("type")?, "type")?;
    if plugin_type.is_empty() {
        return Err(ConfigError::EmptyField { key: type_key });
    }
    let pin_root = parse_pin_root(value("pinRoot")?)?;
    let interfaces = parse_interfaces(value("interfaces")?)?;
    let conntrack_size = parse_conntrack_size(value("conntrackSize")?)?;
    let log_file = parse_log_file(value("logFile")?)?;
    let max_mappings = parse_max_mappings(value("maxMappings")?)?;
    let listener_policy = parse_listener_policy(value("hostPortListeners")?)?;
    let snat = parse_bool(value("snat")?, true)?;
    let masq_all = parse_bool(value("masqAll")?, false)?;
    let fast_path = parse_bool(value("fastPath")?, false)?;
    let cgroup_path = parse_cgroup_path(value("cgroupPath")?)?;
    let valid_attachments = parse_valid_attachments(&fields)?;

    let mut dropped = Vec::new();
    let (port_mappings, host_ip_keys) = tolerate(
        parse_port_mappings(
            &fields.all("runtimeConfig"),
            max_mappings.unwrap_or(portmap_common::capacity::MAPPINGS) as usize,
        ),
        (Vec::new(), Vec::new()),
        strictness,
        &mut dropped,
    )?;
    let prev_result = tolerate(
        parse_prev_result(&fields.all("prevResult")),
        None,
        strictness,
        &mut dropped,
    )?;

    Ok((
        NetConf {
            cni_version,
            name,
            plugin_type,
            pin_root,
            interfaces,
            conntrack_size,
            log_file,
            max_mappings,
            listener_policy,
            snat,
            masq_all,
            fast_path,
            cgroup_path,
            port_mappings,
            host_ip_keys,
            prev_result,
            valid_attachments,
        },
        dropped,
    ))
}

/// Strict parsing fails on `result`'s error; tolerant parsing keeps the error
/// in `dropped` and goes on with `fallback`.
fn tolerate<T>(
    result: Result<T, ConfigError>,
    fallback: T,
    strictness: Strictness,
    dropped: &mut Vec<ConfigError>,
) -> Result<T, ConfigError> {
    match (result, strictness) {
        (Ok(value), _) => Ok(value),
        (Err(error), Strictness::TolerateRequestData) => {
            dropped.push(error);
            Ok(fallback)
        }
        (Err(error), Strictness::Strict) => Err(error),
    }
}

fn parse_version(value: Option<Given>) -> Result<String, ConfigError> {
    match value {
        None => Err(ConfigError::MissingVersion),
        Some(Given {
            value: Value::String(version),
            ..
        }) if SUPPORTED_VERSIONS.contains(&version.as_str()) => Ok(version),
        Some(Given { key, value }) => Err(ConfigError::UnsupportedVersion {
            key,
            version: value.to_string(),
        }),
    }
}

/// `cniVersion` of a configuration, read without validating the rest (for
/// VERSION, and for answering errors in the caller's version).
pub fn cni_version_of(stdin: &[u8]) -> Option<String> {
    let root = serde_json::from_slice::<Object<'_>>(stdin).ok()?;
    let fields = root.resolve(ROOT_FIELDS);
    match given(fields.get("cniVersion"), "").ok()??.value {
        Value::String(version) => Some(version),
        _ => None,
    }
}

fn parse_pin_root(value: Option<Given>) -> Result<PathBuf, ConfigError> {
    let Some(Given { key, value }) = value else {
        return Ok(PathBuf::from(DEFAULT_PIN_ROOT));
    };
    let raw = value
        .as_str()
        .ok_or_else(|| wrong_type(&key, "a string", &value))?;
    let invalid = |reason| ConfigError::InvalidPinRoot {
        key: key.clone(),
        value: raw.to_owned(),
        reason,
    };
    if raw.contains('\0') {
        return Err(invalid("contains a NUL byte"));
    }
    let path = Path::new(raw);
    if !path.is_absolute() {
        return Err(invalid("is not an absolute path"));
    }
    // Path::components() drops "." silently, so look at the raw segments: a
    // pin root that means something else after normalisation is a trap.
    if raw
        .split('/')
        .any(|segment| segment == "." || segment == "..")
    {
        return Err(invalid("contains a \".\" or \"..\" component"));
    }
    Ok(path.to_path_buf())
}

fn parse_interfaces(value: Option<Given>) -> Result<Option<Vec<String>>, ConfigError> {
    let Some(Given { key, value }) = value else {
        return Ok(None);
    };
    let list = value
        .as_array()
        .ok_or_else(|| wrong_type(&key, "an array of interface names", &value))?;
    if list.is_empty() {
        return Err(ConfigError::EmptyInterfaceList { key });
    }
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(list.len());
    let mut names = Vec::with_capacity(list.len());
    for (index, entry) in list.iter().enumerate() {
        let entry_key = format!("{key}[{index}]");
        let name = entry
            .as_str()
            .ok_or_else(|| wrong_type(&entry_key, "a string", entry))?;
        validate_ifname(name).map_err(|reason| ConfigError::InvalidInterfaceName {
            key: entry_key,
            value: name.to_owned(),
            reason,
        })?;
        glob::Pattern::new(name).map_err(|source| ConfigError::InvalidInterfacePattern {
            key: format!("{key}[{index}]"),
            value: name.to_owned(),
            source,
        })?;
        if let Some(first) = seen.insert(name, index) {
            return Err(ConfigError::DuplicateInterface {
                key,
                first,
                second: index,
                name: name.to_owned(),
            });
        }
        names.push(name.to_owned());
    }
    Ok(Some(names))
}

/// An integer within `range`, or the error `out_of_range` builds.
fn bounded(
    given: &Given,
    range: std::ops::RangeInclusive<u32>,
    out_of_range: fn(String, String) -> ConfigError,
) -> Result<u32, ConfigError> {
    let error = || out_of_range(given.key.clone(), given.value.to_string());
    match integer(&given.key, &given.value)? {
        Integer::Unsigned(size) => u32::try_from(size)
            .ok()
            .filter(|size| range.contains(size))
            .ok_or_else(error),
        Integer::Negative => Err(error()),
    }
}

fn parse_conntrack_size(value: Option<Given>) -> Result<Option<u32>, ConfigError> {
    value
        .map(|given| {
            bounded(
                &given,
                CONNTRACK_SIZE_MIN..=CONNTRACK_SIZE_MAX,
                |key, value| ConfigError::ConntrackSizeOutOfRange { key, value },
            )
        })
        .transpose()
}

fn parse_max_mappings(value: Option<Given>) -> Result<Option<u32>, ConfigError> {
    value
        .map(|given| {
            bounded(&given, MAX_MAPPINGS_MIN..=MAX_MAPPINGS_MAX, |key, value| {
                ConfigError::MaxMappingsOutOfRange { key, value }
            })
        })
        .transpose()
}

fn parse_bool(value: Option<Given>, default: bool) -> Result<bool, ConfigError> {
    match value {
        None => Ok(default),
        Some(Given {
            value: Value::Bool(b),
            ..
        }) => Ok(b),
        Some(Given { key, value }) => Err(ConfigError::NotABool {
            key,
            value: value.to_string(),
        }),
    }
}

fn parse_cgroup_path(value: Option<Given>) -> Result<Option<PathBuf>, ConfigError> {
    let Some(Given { key, value }) = value else {
        return Ok(None);
    };
    let invalid = || ConfigError::InvalidCgroupPath {
        key: key.clone(),
        value: value.to_string(),
    };
    let raw = value.as_str().ok_or_else(invalid)?;
    let path = Path::new(raw);
    if !path.is_absolute()
        || raw.contains('\0')
        || raw
            .split('/')
            .any(|segment| segment == "." || segment == "..")
    {
        return Err(invalid());
    }
    Ok(Some(path.to_path_buf()))
}

fn parse_listener_policy(value: Option<Given>) -> Result<ListenerPolicy, ConfigError> {
    match value {
        None => Ok(ListenerPolicy::default()),
        Some(Given {
            value: Value::String(s),
            ..
        }) if s == "refuse" => Ok(ListenerPolicy::Refuse),
        Some(Given {
            value: Value::String(s),
            ..
        }) if s == "allow" => Ok(ListenerPolicy::Allow),
        Some(Given { key, value }) => Err(ConfigError::InvalidListenerPolicy {
            key,
            value: value.to_string(),
        }),
    }
}

fn parse_log_file(value: Option<Given>) -> Result<PathBuf, ConfigError> {
    let Some(Given { key, value }) = value else {
        return Ok(PathBuf::from(DEFAULT_LOG_FILE));
    };
    let raw = value
        .as_str()
        .ok_or_else(|| wrong_type(&key, "a string", &value))?;
    let invalid = |reason| ConfigError::InvalidLogFile {
        key: key.clone(),
        value: raw.to_owned(),
        reason,
    };
    if raw.contains('\0') {
        return Err(invalid("contains a NUL byte"));
    }
    if !Path::new(raw).is_absolute() {
        return Err(invalid("is not an absolute path"));
    }
    if raw.ends_with('/')
        || raw
            .rsplit('/')
            .next()
            .is_some_and(|name| name == "." || name == "..")
    {
        return Err(invalid("names a directory, not a file"));
    }
    Ok(PathBuf::from(raw))
}

/// `logFile` of a configuration, read leniently before the request is
/// parsed (so that even a broken request is logged): the default when stdin
/// is not a configuration or the key is invalid (parsing reports that).
pub fn log_file_of(stdin: &[u8]) -> PathBuf {
    // Only the top level is split into keys; values stay unparsed text
    // except logFile's (the request is parsed in full right after).
    serde_json::from_slice::<Object<'_>>(stdin)
        .ok()
        .and_then(|root| {
            let fields = root.resolve(ROOT_FIELDS);
            parse_log_file(given(fields.get("logFile"), "").ok()?).ok()
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULT_LOG_FILE))
}

fn parse_valid_attachments(
    root: &Resolved<'_, RawValue>,
) -> Result<Option<Vec<Attachment>>, ConfigError> {
    let found = root
        .get(VALID_ATTACHMENTS_KEY)
        .or_else(|| root.get(LEGACY_ATTACHMENTS_KEY));
    let Some(found) = found else {
        return Ok(None);
    };
    let key = found.key;
    let list = serde_json::from_str::<Vec<&RawValue>>(found.value.get()).map_err(|_| {
        ConfigError::WrongType {
            key: key.to_owned(),
            expected: "an array of {\"containerID\", \"ifname\"} objects",
            found: json_keys::kind_of(found.value),
        }
    })?;
    list.iter()
        .enumerate()
        .map(|(index, entry)| {
            let entry_key = format!("{key}[{index}]");
            let entry = object(&entry_key, entry)?;
            let fields = entry.resolve(ATTACHMENT_FIELDS);
            let field = |name| {
                required_string(
                    given(fields.get(name), &entry_key)?,
                    &key_path(&entry_key, name),
                )
            };
            Ok(Attachment {
                container_id: field("containerID")?.1,
                ifname: field("ifname")?.1,
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// prevResult, merged from every occurrence since the last `null` (what Go
/// does decoding them into one map).
fn parse_prev_result(found: &[Found<'_, RawValue>]) -> Result<Option<Value>, ConfigError> {
    let mut merged: Option<Map<String, Value>> = None;
    for occurrence in found {
        match raw_to_value(occurrence.value)? {
            Value::Object(object) => merged.get_or_insert_with(Map::new).extend(object),
            other => return Err(wrong_type(occurrence.key, "an object", &other)),
        }
    }
    Ok(merged.map(Value::Object))
}

/// The validated mappings and, for each, the path of its `hostIP` key as
/// written (for later messages). `runtime_configs` are the occurrences of
/// runtimeConfig, which Go merges into one struct.
///
/// A request may hold as many entries as the mappings map holds (Podman
/// expands `-p 10000-12000:10000-12000` into 2001 entries; upstream portmap
/// has no limit); more could never be claimed, so they are refused before
/// anything is parsed.
fn parse_port_mappings(
    runtime_configs: &[Found<'_, RawValue>],
    limit: usize,
) -> Result<(Vec<PortMapping>, Vec<String>), ConfigError> {
    let mut objects = Vec::with_capacity(runtime_configs.len());
    for occurrence in runtime_configs {
        objects.push((occurrence.key, object(occurrence.key, occurrence.value)?));
    }
    // Every key of every occurrence, each with the occurrence it came from.
    let entries: Vec<(&str, &str, &RawValue)> = objects
        .iter()
        .flat_map(|(parent, object)| {
            object
                .entries()
                .map(move |(key, value)| (*parent, key, value))
        })
        .collect();
    let fields = json_keys::resolve(
        RUNTIME_CONFIG_FIELDS,
        entries.iter().map(|(_, key, value)| (*key, *value)),
    );
    let Some(found) = fields.get("portMappings") else {
        return Ok((Vec::new(), Vec::new()));
    };
    let parent = entries
        .iter()
        .find(|(_, _, value)| std::ptr::eq(*value, found.value))
        .map_or("runtimeConfig", |(parent, _, _)| *parent);
    let list_key = format!("{parent}.{}", found.key);
    let list = serde_json::from_str::<Vec<&RawValue>>(found.value.get()).map_err(|_| {
        ConfigError::WrongType {
            key: list_key.clone(),
            expected: "an array",
            found: json_keys::kind_of(found.value),
        }
    })?;
    // Checked before parsing so an oversized list costs nothing.
    if list.len() > limit {
        return Err(ConfigError::TooManyMappings {
            key: list_key,
            count: list.len(),
            max: limit,
        });
    }
    let mut mappings = Vec::with_capacity(list.len());
    let mut host_ip_keys = Vec::with_capacity(list.len());
    for (index, entry) in list.iter().enumerate() {
        let (mapping, host_ip_key) = parse_port_mapping(&list_key, index, entry)?;
        mappings.push(mapping);
        host_ip_keys.push(host_ip_key);
    }
    reject_duplicates(&list_key, &mappings)?;
    Ok((mappings, host_ip_keys))
}

/// The path of a key of a mapping entry as written, built only for a
/// message: a request may hold thousands of entries, and formatting every path up
/// front was most of the cost of parsing them.
#[derive(Debug, Clone, Copy)]
struct EntryKey<'a> {
    list: &'a str,
    index: usize,
    key: &'a str,
}

impl fmt::Display for EntryKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.list, self.index)?;
        if !self.key.is_empty() {
            write!(f, ".{}", self.key)?;
        }
        Ok(())
    }
}

/// A mapping's field: where it is and its raw value.
type EntryField<'a> = (EntryKey<'a>, &'a RawValue);

/// The string a raw JSON value holds, borrowed unless it has escapes.
fn raw_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    serde_json::from_str::<Cow<'_, str>>(raw.get()).ok()
}

fn raw_wrong_type(key: EntryKey<'_>, expected: &'static str, raw: &RawValue) -> ConfigError {
    ConfigError::WrongType {
        key: key.to_string(),
        expected,
        found: json_keys::kind_of(raw),
    }
}

/// One mapping entry, and the path of its `hostIP` key (empty when hostIP is
/// absent or empty: no message is ever about it then).
fn parse_port_mapping(
    list: &str,
    index: usize,
    entry: &RawValue,
) -> Result<(PortMapping, String), ConfigError> {
    let at = |key| EntryKey { list, index, key };
    let entry =
        Object::parse(entry.get()).map_err(|_| raw_wrong_type(at(""), "an object", entry))?;
    // Unknown keys are ignored: runtimes add their own (podman's "range").
    let fields = entry.resolve(MAPPING_FIELDS);
    let field = |name| fields.get(name).map(|found| (at(found.key), found.value));
    let port = |name| parse_port(field(name), at(name));
    let host_ip = field("hostIP");
    let mapping = PortMapping {
        host_port: port("hostPort")?,
        container_port: port("containerPort")?,
        protocol: parse_protocol(field("protocol"))?,
        host_ip: parse_host_ip(host_ip)?,
    };
    let host_ip_key = match (mapping.host_ip, host_ip) {
        (HostIp::Any, _) | (_, None) => String::new(),
        (_, Some((key, _))) => key.to_string(),
    };
    Ok((mapping, host_ip_key))
}

/// A port (1-65535); `missing` names the key when it is absent.
fn parse_port(value: Option<EntryField<'_>>, missing: EntryKey<'_>) -> Result<u16, ConfigError> {
    let Some((key, raw)) = value else {
        return Err(ConfigError::MissingField {
            field: missing.to_string(),
        });
    };
    let value = raw_to_value(raw)?;
    let out_of_range = || ConfigError::PortOutOfRange {
        key: key.to_string(),
        value: value.to_string(),
    };
    if let Some(port) = value.as_u64() {
        return u16::try_from(port)
            .ok()
            .filter(|port| *port != 0)
            .ok_or_else(out_of_range);
    }
    match integer(&key.to_string(), &value)? {
        Integer::Unsigned(_) | Integer::Negative => Err(out_of_range()),
    }
}

fn parse_protocol(value: Option<EntryField<'_>>) -> Result<Protocol, ConfigError> {
    let Some((key, raw)) = value else {
        return Ok(Protocol::Tcp);
    };
    let name = raw_str(raw).ok_or_else(|| raw_wrong_type(key, "a string", raw))?;
    // libcni's PortMapping has no omitempty on "protocol", so Go runtimes that
    // leave it unset send "": that means the default, like an absent key.
    if name.is_empty() {
        return Ok(Protocol::Tcp);
    }
    Protocol::from_name(&name).ok_or_else(|| ConfigError::UnknownProtocol {
        key: key.to_string(),
        protocol: name.into_owned(),
    })
}

fn parse_host_ip(value: Option<EntryField<'_>>) -> Result<HostIp, ConfigError> {
    let Some((key, raw)) = value else {
        return Ok(HostIp::Any);
    };
    let text = raw_str(raw).ok_or_else(|| raw_wrong_type(key, "a string", raw))?;
    // containerd always sends "HostIP" and leaves it "" when unset; upstream
    // treats "" like an absent key (it only parses a non-empty hostIP).
    if text.is_empty() {
        return Ok(HostIp::Any);
    }
    let address = text
        .parse::<IpAddr>()
        .map_err(|source| ConfigError::InvalidHostIp {
            key: key.to_string(),
            value: text.clone().into_owned(),
            source,
        })?
        // ::ffff:a.b.c.d is how some callers spell an IPv4 address; the packets
        // we match are plain IPv4.
        .to_canonical();
    let unusable = |reason| ConfigError::UnusableHostIp {
        key: key.to_string(),
        address,
        reason,
    };
    match address {
        IpAddr::V4(v4) if v4.is_unspecified() => Ok(HostIp::AnyV4),
        IpAddr::V6(v6) if v6.is_unspecified() => Ok(HostIp::AnyV6),
        IpAddr::V4(v4) if v4.is_broadcast() => Err(unusable(
            "is the broadcast address, which is never a connection's destination",
        )),
        addr if addr.is_multicast() => Err(unusable(
            "is a multicast address, which is never a connection's destination",
        )),
        IpAddr::V4(v4) if v4.is_link_local() => Err(unusable(
            "is link-local (169.254.0.0/16): the kernel does not route such an address beyond its link, so a translated flow to it cannot work; use a routable node address or leave hostIP empty",
        )),
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Err(unusable(
            "is link-local (fe80::/10): the kernel does not route such an address beyond its link, so a translated flow to it cannot work; use a routable node address or leave hostIP empty",
        )),
        addr => Ok(HostIp::Addr(addr)),
    }
}

/// Two entries collide when, for the same protocol and host port, they claim
/// the same family wildcard or the same exact address. A wildcard and an exact
/// address of the same family may coexist: the exact one is more specific.
fn reject_duplicates(list_key: &str, mappings: &[PortMapping]) -> Result<(), ConfigError> {
    let mut claimed: HashMap<(HostClaim, u16, Protocol), usize> =
        HashMap::with_capacity(mappings.len() * 2);
    for (index, mapping) in mappings.iter().enumerate() {
        for claim in mapping.host_ip.claims().into_iter().flatten() {
            if let Some(first) = claimed.insert((claim, mapping.host_port, mapping.protocol), index)
            {
                return Err(ConfigError::DuplicateMapping {
                    list: list_key.to_owned(),
                    first,
                    second: index,
                    protocol: mapping.protocol,
                    host_port: mapping.host_port,
                    claim: claim.to_string(),
                });
            }
        }
    }
    reject_overlaps(list_key, mappings)
}

/// A wildcard hostIP and a specific one of its family on the same port and
/// protocol overlap (as for bind()): refused inside one request like across
/// requests (store.rs).
fn reject_overlaps(list_key: &str, mappings: &[PortMapping]) -> Result<(), ConfigError> {
    // (is IPv6, port, protocol) -> (first wildcard, first specific).
    type Seen = (Option<(usize, HostClaim)>, Option<(usize, IpAddr)>);
    let mut seen: HashMap<(bool, u16, Protocol), Seen> = HashMap::new();
    for (index, mapping) in mappings.iter().enumerate() {
        for claim in mapping.host_ip.claims().into_iter().flatten() {
            let v6 = match claim {
                HostClaim::EveryV4 => false,
                HostClaim::EveryV6 => true,
                HostClaim::Exact(addr) => addr.is_ipv6(),
            };
            let entry = seen
                .entry((v6, mapping.host_port, mapping.protocol))
                .or_default();
            let (wildcard, specific) = match claim {
                HostClaim::Exact(addr) => {
                    entry.1.get_or_insert((index, addr));
                    (entry.0, Some((index, addr)))
                }
                wildcard => {
                    entry.0.get_or_insert((index, wildcard));
                    (Some((index, wildcard)), entry.1)
                }
            };
            if let (Some((wildcard, claim)), Some((specific, address))) = (wildcard, specific) {
                return Err(ConfigError::OverlappingMappings {
                    list: list_key.to_owned(),
                    wildcard,
                    specific,
                    protocol: mapping.protocol,
                    host_port: mapping.host_port,
                    address,
                    claim: claim.to_string(),
                });
            }
        }
    }
    Ok(())
}

pub(super) enum Integer {
    Unsigned(u64),
    /// Any negative integer: every caller rejects them, only the message differs.
    Negative,
}

/// A JSON integer. Floats (even 80.0) are refused: the CNI types are integers
/// and a fraction is a sign the value was computed wrongly.
pub(super) fn integer(key: &str, value: &Value) -> Result<Integer, ConfigError> {
    let Value::Number(number) = value else {
        return Err(wrong_type(key, "an integer", value));
    };
    if let Some(unsigned) = number.as_u64() {
        Ok(Integer::Unsigned(unsigned))
    } else if number.is_i64() {
        Ok(Integer::Negative)
    } else {
        Err(ConfigError::NotAnInteger {
            key: key.to_owned(),
            value: number.to_string(),
        })
    }
}

/// A required string: (its key path as written, the string). `missing_key`
/// names the key when it is absent.
fn required_string(
    value: Option<Given>,
    missing_key: &str,
) -> Result<(String, String), ConfigError> {
    match value {
        None => Err(ConfigError::MissingField {
            field: missing_key.to_owned(),
        }),
        Some(Given {
            key,
            value: Value::String(text),
        }) => Ok((key, text)),
        Some(Given { key, value }) => Err(wrong_type(&key, "a string", &value)),
    }
}

pub(super) fn expect_object<'a>(
    key: &str,
    value: &'a Value,
) -> Result<&'a Map<String, Value>, ConfigError> {
    value
        .as_object()
        .ok_or_else(|| wrong_type(key, "an object", value))
}

pub(super) fn wrong_type(key: &str, expected: &'static str, found: &Value) -> ConfigError {
    ConfigError::WrongType {
        key: key.to_owned(),
        expected,
        found: json_kind(found),
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config with the required keys plus `extra` (which starts with a comma).
    fn with(extra: &str) -> String {
        format!(r#"{{"cniVersion":"1.0.0","name":"podman","type":"ebpf-portmap"{extra}}}"#)
    }

    /// A config whose runtimeConfig.portMappings holds `entries`.
    fn mappings(entries: &str) -> String {
        with(&format!(
            r#","runtimeConfig":{{"portMappings":[{entries}]}}"#
        ))
    }

    fn many_mappings(count: usize) -> String {
        many_mappings_within(count, "")
    }

    /// `count` entries, with `extra` keys of the plugin (e.g. `maxMappings`).
    fn many_mappings_within(count: usize, extra: &str) -> String {
        let entries: Vec<String> = (0..count)
            .map(|i| format!(r#"{{"hostPort":{},"containerPort":80}}"#, 10000 + i))
            .collect();
        with(&format!(
            r#"{extra},"runtimeConfig":{{"portMappings":[{}]}}"#,
            entries.join(",")
        ))
    }

    enum Expect {
        /// Parses; the function checks the result.
        Valid(fn(&NetConf)),
        /// Fails with this CNI code and a message containing every needle.
        Invalid(u32, &'static [&'static str]),
    }
    use Expect::{Invalid, Valid};

    fn mapping_count(expected: usize) -> impl Fn(&NetConf) {
        move |conf| {
            assert_eq!(
                conf.port_mappings.len(),
                expected,
                "mapping count of {conf:?}"
            )
        }
    }

    #[test]
    fn parse_netconf_table() {
        let v = code::INCOMPATIBLE_VERSION;
        let d = code::DECODING_FAILURE;
        let c = code::INVALID_NETWORK_CONFIG;
        let rows: Vec<(&str, String, Expect)> = vec![
            // --- valid ---
            (
                "minimal config, no runtimeConfig",
                with(""),
                Valid(|conf| {
                    assert!(conf.port_mappings.is_empty(), "no mappings expected");
                    assert_eq!(
                        conf.pin_root,
                        PathBuf::from(DEFAULT_PIN_ROOT),
                        "default pin root"
                    );
                    assert_eq!(
                        (conf.name.as_str(), conf.plugin_type.as_str()),
                        ("podman", "ebpf-portmap"),
                        "name and type are carried over"
                    );
                    assert!(
                        conf.prev_result.is_none()
                            && conf.interfaces.is_none()
                            && conf.conntrack_size.is_none(),
                        "optional keys stay None when absent"
                    );
                }),
            ),
            (
                "one full mapping",
                mappings(
                    r#"{"hostPort":8080,"containerPort":80,"protocol":"udp","hostIP":"192.0.2.1"}"#,
                ),
                Valid(|conf| {
                    assert_eq!(
                        conf.port_mappings,
                        vec![PortMapping {
                            host_ip: HostIp::Addr("192.0.2.1".parse().unwrap()),
                            host_port: 8080,
                            container_port: 80,
                            protocol: Protocol::Udp,
                        }],
                        "the entry must be carried over field by field"
                    );
                }),
            ),
            (
                "protocol is case-insensitive",
                mappings(r#"{"hostPort":1,"containerPort":65535,"protocol":"SCTP"}"#),
                Valid(|conf| {
                    assert_eq!(
                        conf.port_mappings[0].protocol,
                        Protocol::Sctp,
                        "SCTP must parse as sctp"
                    );
                }),
            ),
            (
                "absent protocol and hostIP default to tcp on every address",
                mappings(r#"{"hostPort":80,"containerPort":80}"#),
                Valid(|conf| {
                    assert_eq!(
                        (
                            conf.port_mappings[0].protocol,
                            conf.port_mappings[0].host_ip
                        ),
                        (Protocol::Tcp, HostIp::Any),
                        "absent protocol/hostIP must mean tcp on every address"
                    );
                }),
            ),
            (
                "empty protocol and hostIP (Go zero values) mean the defaults",
                mappings(r#"{"hostPort":80,"containerPort":80,"protocol":"","hostIP":""}"#),
                Valid(|conf| {
                    assert_eq!(
                        (
                            conf.port_mappings[0].protocol,
                            conf.port_mappings[0].host_ip
                        ),
                        (Protocol::Tcp, HostIp::Any),
                        "empty protocol/hostIP must mean tcp on every address"
                    );
                }),
            ),
            (
                "null hostIP is absent",
                mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":null}"#),
                Valid(|conf| {
                    assert_eq!(
                        conf.port_mappings[0].host_ip,
                        HostIp::Any,
                        "null must mean every address"
                    );
                }),
            ),
            (
                "0.0.0.0 and :: are family wildcards",
                mappings(
                    r#"{"hostPort":80,"containerPort":80,"hostIP":"0.0.0.0"},{"hostPort":80,"containerPort":80,"hostIP":"::"}"#,
                ),
                Valid(|conf| {
                    assert_eq!(
                        conf.port_mappings[0].host_ip,
                        HostIp::AnyV4,
                        "0.0.0.0 is every IPv4 address"
                    );
                    assert_eq!(
                        conf.port_mappings[1].host_ip,
                        HostIp::AnyV6,
                        ":: is every IPv6 address"
                    );
                }),
            ),
            (
                "IPv4-mapped IPv6 hostIP becomes IPv4",
                mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":"::ffff:198.51.100.7"}"#),
                Valid(|conf| {
                    assert_eq!(
                        conf.port_mappings[0].host_ip,
                        HostIp::Addr("198.51.100.7".parse().unwrap()),
                        "::ffff:a.b.c.d must be normalised"
                    );
                }),
            ),
            (
                "same hostPort, different protocols",
                mappings(
                    r#"{"hostPort":53,"containerPort":53,"protocol":"tcp"},{"hostPort":53,"containerPort":53,"protocol":"udp"}"#,
                ),
                Valid(|conf| mapping_count(2)(conf)),
            ),
            (
                "same hostPort, different explicit hostIPs",
                mappings(
                    r#"{"hostPort":80,"containerPort":80,"hostIP":"192.0.2.1"},{"hostPort":80,"containerPort":81,"hostIP":"192.0.2.2"}"#,
                ),
                Valid(|conf| mapping_count(2)(conf)),
            ),
            (
                "IPv4 wildcard next to a specific IPv6 address",
                mappings(
                    r#"{"hostPort":80,"containerPort":80,"hostIP":"0.0.0.0"},{"hostPort":80,"containerPort":81,"hostIP":"2001:db8::2"}"#,
                ),
                Valid(|conf| mapping_count(2)(conf)),
            ),
            (
                "wildcard next to a specific address of another protocol",
                mappings(
                    r#"{"hostPort":80,"containerPort":80},{"hostPort":80,"containerPort":81,"hostIP":"192.0.2.2","protocol":"udp"}"#,
                ),
                Valid(|conf| mapping_count(2)(conf)),
            ),
            (
                "IPv4 wildcard next to IPv6 wildcard",
                mappings(
                    r#"{"hostPort":80,"containerPort":80,"hostIP":"0.0.0.0"},{"hostPort":80,"containerPort":81,"hostIP":"::"}"#,
                ),
                Valid(|conf| mapping_count(2)(conf)),
            ),
            (
                "unknown keys everywhere are ignored",
                with(
                    r#","capabilities":{"portMappings":true},"args":{"x":1},"runtimeConfig":{"bandwidth":{},"portMappings":[{"hostPort":80,"containerPort":80,"range":1,"podman":"x"}]}"#,
                ),
                Valid(|conf| mapping_count(1)(conf)),
            ),
            (
                "runtimeConfig without portMappings",
                with(r#","runtimeConfig":{}"#),
                Valid(|conf| mapping_count(0)(conf)),
            ),
            (
                "empty portMappings",
                mappings(""),
                Valid(|conf| mapping_count(0)(conf)),
            ),
            (
                "podman's -p 10000-12000:10000-12000",
                many_mappings(2001),
                Valid(|conf| mapping_count(2001)(conf)),
            ),
            (
                "exactly maxMappings entries",
                many_mappings_within(16, r#","maxMappings":16"#),
                Valid(|conf| mapping_count(16)(conf)),
            ),
            (
                "our own keys, valid",
                with(
                    r#","pinRoot":"/run/bpf/pm","interfaces":["eth0","bond0.100","en*"],"conntrackSize":65536"#,
                ),
                Valid(|conf| {
                    assert_eq!(conf.pin_root, PathBuf::from("/run/bpf/pm"), "pinRoot");
                    assert_eq!(
                        conf.interfaces.as_deref(),
                        Some(
                            &[
                                "eth0".to_string(),
                                "bond0.100".to_string(),
                                "en*".to_string()
                            ][..]
                        ),
                        "interfaces"
                    );
                    assert_eq!(conf.conntrack_size, Some(65536), "conntrackSize");
                }),
            ),
            (
                "logFile default",
                with(""),
                Valid(|conf| {
                    assert_eq!(
                        conf.log_file,
                        PathBuf::from(DEFAULT_LOG_FILE),
                        "default logFile"
                    )
                }),
            ),
            (
                "logFile set",
                with(r#","logFile":"/var/log/cni/portmap.log""#),
                Valid(|conf| {
                    assert_eq!(
                        conf.log_file,
                        PathBuf::from("/var/log/cni/portmap.log"),
                        "logFile"
                    )
                }),
            ),
            (
                "logFile relative",
                with(r#","logFile":"portmap.log""#),
                Invalid(
                    code::INVALID_NETWORK_CONFIG,
                    &["logFile: \"portmap.log\" is not an absolute path"],
                ),
            ),
            (
                "logFile a directory",
                with(r#","logFile":"/var/log/""#),
                Invalid(
                    code::INVALID_NETWORK_CONFIG,
                    &["logFile: \"/var/log/\" names a directory"],
                ),
            ),
            (
                "logFile dot-dot",
                with(r#","logFile":"/var/log/..""#),
                Invalid(code::INVALID_NETWORK_CONFIG, &["names a directory"]),
            ),
            (
                "logFile not a string",
                with(r#","logFile":42"#),
                Invalid(
                    code::INVALID_NETWORK_CONFIG,
                    &["logFile: expected a string, found a number"],
                ),
            ),
            (
                "every supported version",
                with("").replace("1.0.0", "0.3.0"),
                Valid(|conf| assert_eq!(conf.cni_version, "0.3.0", "0.3.0 is supported")),
            ),
            (
                "prevResult kept raw",
                with(r#","prevResult":{"cniVersion":"1.0.0","ips":[]}"#),
                Valid(|conf| {
                    assert_eq!(
                        conf.prev_result,
                        Some(serde_json::json!({"cniVersion":"1.0.0","ips":[]})),
                        "prevResult must be kept as given"
                    );
                }),
            ),
            (
                "GC keep-list",
                with(r#","cni.dev/valid-attachments":[{"containerID":"abc","ifname":"eth0"}]"#),
                Valid(|conf| {
                    assert_eq!(
                        conf.valid_attachments,
                        Some(vec![Attachment {
                            container_id: "abc".into(),
                            ifname: "eth0".into()
                        }]),
                        "keep-list entries are carried over"
                    );
                }),
            ),
            (
                "GC keep-list under the legacy key",
                with(r#","cni.dev/attachments":[{"containerID":"abc","ifname":"eth0"}]"#),
                Valid(|conf| {
                    assert_eq!(
                        conf.valid_attachments.as_ref().map(Vec::len),
                        Some(1),
                        "legacy key must be read"
                    );
                }),
            ),
            // --- invalid: decoding and version ---
            (
                "truncated JSON",
                r#"{"cniVersion":"1.0.0","name":"#.to_string(),
                Invalid(d, &["not valid JSON"]),
            ),
            (
                "empty stdin",
                String::new(),
                Invalid(d, &["not valid JSON"]),
            ),
            (
                "top level is an array",
                "[]".to_string(),
                Invalid(d, &["JSON object", "an array"]),
            ),
            (
                "cniVersion missing",
                r#"{"name":"n","type":"t"}"#.to_string(),
                Invalid(v, &["cniVersion is missing"]),
            ),
            (
                "cniVersion unsupported",
                with("").replace("1.0.0", "0.2.0"),
                Invalid(v, &["cniVersion \"0.2.0\"", "1.1.0"]),
            ),
            (
                "cniVersion not a string",
                r#"{"cniVersion":1,"name":"n","type":"t"}"#.to_string(),
                Invalid(v, &["cniVersion 1 "]),
            ),
            // --- invalid: required keys ---
            (
                "name missing",
                r#"{"cniVersion":"1.0.0","type":"t"}"#.to_string(),
                Invalid(c, &["name is missing"]),
            ),
            (
                "name not a string",
                r#"{"cniVersion":"1.0.0","name":7,"type":"t"}"#.to_string(),
                Invalid(c, &["name: expected a string, found a number"]),
            ),
            (
                "name breaks the spec's rule",
                r#"{"cniVersion":"1.0.0","name":"-net","type":"t"}"#.to_string(),
                Invalid(c, &["name: \"-net\"", "first character"]),
            ),
            (
                "type missing",
                r#"{"cniVersion":"1.0.0","name":"n"}"#.to_string(),
                Invalid(c, &["type is missing"]),
            ),
            (
                "type empty",
                r#"{"cniVersion":"1.0.0","name":"n","type":""}"#.to_string(),
                Invalid(c, &["type must not be empty"]),
            ),
            // --- invalid: runtimeConfig shape ---
            (
                "runtimeConfig not an object",
                with(r#","runtimeConfig":[]"#),
                Invalid(c, &["runtimeConfig: expected an object, found an array"]),
            ),
            (
                "portMappings not an array",
                with(r#","runtimeConfig":{"portMappings":{"hostPort":80}}"#),
                Invalid(c, &["runtimeConfig.portMappings: expected an array"]),
            ),
            (
                "entry not an object",
                mappings(r#"{"hostPort":80,"containerPort":80},"80:80""#),
                Invalid(
                    c,
                    &["runtimeConfig.portMappings[1]: expected an object, found a string"],
                ),
            ),
            (
                "more entries than maxMappings",
                many_mappings_within(17, r#","maxMappings":16"#),
                Invalid(
                    c,
                    &[
                        "runtimeConfig.portMappings has 17 entries",
                        "maxMappings 16",
                    ],
                ),
            ),
            // --- invalid: ports ---
            (
                "hostPort missing",
                mappings(r#"{"containerPort":80}"#),
                Invalid(c, &["runtimeConfig.portMappings[0].hostPort is missing"]),
            ),
            (
                "hostPort zero",
                mappings(r#"{"hostPort":0,"containerPort":80}"#),
                Invalid(
                    c,
                    &["runtimeConfig.portMappings[0].hostPort: 0 is out of range 1-65535"],
                ),
            ),
            (
                "hostPort too large, third entry",
                mappings(
                    r#"{"hostPort":1,"containerPort":1},{"hostPort":2,"containerPort":2},{"hostPort":70000,"containerPort":80}"#,
                ),
                Invalid(
                    c,
                    &["runtimeConfig.portMappings[2].hostPort: 70000 is out of range 1-65535"],
                ),
            ),
            (
                "hostPort negative",
                mappings(r#"{"hostPort":-80,"containerPort":80}"#),
                Invalid(
                    c,
                    &["runtimeConfig.portMappings[0].hostPort: -80 is out of range"],
                ),
            ),
            (
                "hostPort float",
                mappings(r#"{"hostPort":80.5,"containerPort":80}"#),
                Invalid(
                    c,
                    &["runtimeConfig.portMappings[0].hostPort: 80.5 is not an integer"],
                ),
            ),
            (
                "hostPort float with zero fraction",
                mappings(r#"{"hostPort":80.0,"containerPort":80}"#),
                Invalid(
                    c,
                    &["runtimeConfig.portMappings[0].hostPort: 80.0 is not an integer"],
                ),
            ),
            (
                "hostPort string",
                mappings(r#"{"hostPort":"80","containerPort":80}"#),
                Invalid(
                    c,
                    &[
                        "runtimeConfig.portMappings[0].hostPort: expected an integer, found a string",
                    ],
                ),
            ),
            (
                "containerPort too large",
                mappings(r#"{"hostPort":80,"containerPort":65536}"#),
                Invalid(
                    c,
                    &["runtimeConfig.portMappings[0].containerPort: 65536 is out of range"],
                ),
            ),
            (
                "containerPort missing",
                mappings(r#"{"hostPort":80}"#),
                Invalid(
                    c,
                    &["runtimeConfig.portMappings[0].containerPort is missing"],
                ),
            ),
            (
                "huge integer port",
                mappings(r#"{"hostPort":18446744073709551615,"containerPort":80}"#),
                Invalid(c, &["[0].hostPort: 18446744073709551615 is out of range"]),
            ),
            // --- invalid: protocol ---
            (
                "unknown protocol",
                mappings(
                    r#"{"hostPort":80,"containerPort":80},{"hostPort":81,"containerPort":80,"protocol":"icmp"}"#,
                ),
                Invalid(
                    c,
                    &[
                        "runtimeConfig.portMappings[1].protocol: \"icmp\"",
                        "tcp, udp or sctp",
                    ],
                ),
            ),
            (
                "protocol with whitespace",
                mappings(r#"{"hostPort":80,"containerPort":80,"protocol":" tcp"}"#),
                Invalid(c, &["[0].protocol: \" tcp\""]),
            ),
            (
                "protocol as a number",
                mappings(r#"{"hostPort":80,"containerPort":80,"protocol":6}"#),
                Invalid(
                    c,
                    &["runtimeConfig.portMappings[0].protocol: expected a string, found a number"],
                ),
            ),
            (
                "combined protocol list",
                mappings(r#"{"hostPort":80,"containerPort":80,"protocol":"tcp,udp"}"#),
                Invalid(c, &["[0].protocol: \"tcp,udp\""]),
            ),
            // --- invalid: hostIP ---
            (
                "hostIP not an address",
                mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":"1.2.3"}"#),
                Invalid(
                    c,
                    &["runtimeConfig.portMappings[0].hostIP: \"1.2.3\" is not an IP address"],
                ),
            ),
            (
                "hostIP with zone",
                mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":"fe80::1%eth0"}"#),
                Invalid(c, &["[0].hostIP: \"fe80::1%eth0\""]),
            ),
            (
                "hostIP as a number",
                mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":16909060}"#),
                Invalid(
                    c,
                    &["runtimeConfig.portMappings[0].hostIP: expected a string"],
                ),
            ),
            (
                "hostIP multicast",
                mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":"ff02::1"}"#),
                Invalid(
                    c,
                    &["runtimeConfig.portMappings[0].hostIP: ff02::1 is a multicast address"],
                ),
            ),
            (
                "hostIP link-local IPv4",
                mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":"169.254.10.1"}"#),
                Invalid(
                    c,
                    &["runtimeConfig.portMappings[0].hostIP: 169.254.10.1 is link-local"],
                ),
            ),
            (
                "hostIP link-local IPv6",
                mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":"fe80::1"}"#),
                Invalid(
                    c,
                    &["runtimeConfig.portMappings[0].hostIP: fe80::1 is link-local"],
                ),
            ),
            (
                "hostIP broadcast",
                mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":"255.255.255.255"}"#),
                Invalid(c, &["[0].hostIP: 255.255.255.255 is the broadcast address"]),
            ),
            // --- invalid: duplicates ---
            (
                "IPv4 wildcard next to a specific IPv4 address",
                mappings(
                    r#"{"hostPort":80,"containerPort":80,"hostIP":"0.0.0.0"},{"hostPort":80,"containerPort":81,"hostIP":"192.0.2.2"}"#,
                ),
                Invalid(
                    c,
                    &[
                        "runtimeConfig.portMappings[1] overlaps runtimeConfig.portMappings[0]",
                        "tcp port 80 on 192.0.2.2 is part of every local IPv4 address",
                    ],
                ),
            ),
            (
                "specific IPv6 address before every address",
                mappings(
                    r#"{"hostPort":80,"containerPort":81,"hostIP":"2001:db8::2"},{"hostPort":80,"containerPort":80}"#,
                ),
                Invalid(
                    c,
                    &[
                        "runtimeConfig.portMappings[0] overlaps runtimeConfig.portMappings[1]",
                        "every local IPv6 address",
                    ],
                ),
            ),
            (
                "same port twice on every address",
                mappings(
                    r#"{"hostPort":80,"containerPort":80},{"hostPort":80,"containerPort":81}"#,
                ),
                Invalid(
                    c,
                    &[
                        "runtimeConfig.portMappings[1] duplicates runtimeConfig.portMappings[0]",
                        "tcp port 80",
                    ],
                ),
            ),
            (
                "every address overlaps 0.0.0.0",
                mappings(
                    r#"{"hostPort":8,"containerPort":8},{"hostPort":80,"containerPort":80},{"hostPort":80,"containerPort":81,"hostIP":"0.0.0.0"}"#,
                ),
                Invalid(
                    c,
                    &[
                        "portMappings[2] duplicates runtimeConfig.portMappings[1]",
                        "every local IPv4 address",
                    ],
                ),
            ),
            (
                "every address overlaps ::",
                mappings(
                    r#"{"hostPort":80,"containerPort":81,"hostIP":"::","protocol":"udp"},{"hostPort":80,"containerPort":80,"protocol":"UDP"}"#,
                ),
                Invalid(
                    c,
                    &[
                        "portMappings[1] duplicates runtimeConfig.portMappings[0]",
                        "udp port 80 on every local IPv6 address",
                    ],
                ),
            ),
            (
                "same address spelled two ways",
                mappings(
                    r#"{"hostPort":80,"containerPort":80,"hostIP":"192.0.2.1"},{"hostPort":80,"containerPort":81,"hostIP":"::ffff:192.0.2.1"}"#,
                ),
                Invalid(
                    c,
                    &[
                        "portMappings[1] duplicates runtimeConfig.portMappings[0]",
                        "on 192.0.2.1",
                    ],
                ),
            ),
            (
                "default protocol equals explicit tcp",
                mappings(
                    r#"{"hostPort":80,"containerPort":80},{"hostPort":80,"containerPort":80,"protocol":"TCP"}"#,
                ),
                Invalid(
                    c,
                    &["portMappings[1] duplicates runtimeConfig.portMappings[0]"],
                ),
            ),
            // --- invalid: our own keys ---
            (
                "pinRoot relative",
                with(r#","pinRoot":"bpf/pm""#),
                Invalid(c, &["pinRoot: \"bpf/pm\" is not an absolute path"]),
            ),
            (
                "pinRoot with ..",
                with(r#","pinRoot":"/sys/fs/bpf/../pm""#),
                Invalid(c, &["pinRoot: \"/sys/fs/bpf/../pm\"", "\"..\""]),
            ),
            (
                "pinRoot with .",
                with(r#","pinRoot":"/sys/fs/bpf/./pm""#),
                Invalid(c, &["pinRoot:", "component"]),
            ),
            (
                "pinRoot not a string",
                with(r#","pinRoot":true"#),
                Invalid(c, &["pinRoot: expected a string, found a boolean"]),
            ),
            (
                "interfaces not an array",
                with(r#","interfaces":"eth0""#),
                Invalid(c, &["interfaces: expected an array"]),
            ),
            (
                "interfaces empty",
                with(r#","interfaces":[]"#),
                Invalid(c, &["interfaces must list at least one"]),
            ),
            (
                "interface name with slash",
                with(r#","interfaces":["eth0","a/b"]"#),
                Invalid(c, &["interfaces[1]: \"a/b\"", "'/'"]),
            ),
            (
                "interface name too long",
                with(r#","interfaces":["abcdefghijklmnop"]"#),
                Invalid(c, &["interfaces[0]", "16 bytes"]),
            ),
            (
                "interface name not a string",
                with(r#","interfaces":["eth0",1]"#),
                Invalid(c, &["interfaces[1]: expected a string, found a number"]),
            ),
            (
                "interface pattern with an unclosed class",
                with(r#","interfaces":["eth*","eth[0"]"#),
                Invalid(
                    c,
                    &["interfaces[1]: \"eth[0\" is not a valid interface pattern"],
                ),
            ),
            (
                "interface listed twice",
                with(r#","interfaces":["eth0","eth1","eth0"]"#),
                Invalid(c, &["interfaces[2] repeats \"eth0\" from interfaces[0]"]),
            ),
            (
                "conntrackSize too small",
                with(r#","conntrackSize":10"#),
                Invalid(c, &["conntrackSize: 10 is out of range 1024-16777216"]),
            ),
            (
                "conntrackSize too large",
                with(r#","conntrackSize":16777217"#),
                Invalid(c, &["conntrackSize: 16777217 is out of range"]),
            ),
            (
                "maxMappings too small",
                with(r#","maxMappings":8"#),
                Invalid(c, &["maxMappings: 8 is out of range 16-1048576"]),
            ),
            (
                "maxMappings not an integer",
                with(r#","maxMappings":"many""#),
                Invalid(c, &["maxMappings"]),
            ),
            (
                "snat not a bool",
                with(r#","snat":"yes""#),
                Invalid(c, &["snat", "true or false"]),
            ),
            (
                "masqAll not a bool",
                with(r#","masqAll":1"#),
                Invalid(c, &["masqAll"]),
            ),
            (
                "fastPath not a bool",
                with(r#","fastPath":"on""#),
                Invalid(c, &["fastPath"]),
            ),
            (
                "cgroupPath relative",
                with(r#","cgroupPath":"sys/fs/cgroup""#),
                Invalid(c, &["cgroupPath", "absolute"]),
            ),
            (
                "hostPortListeners unknown",
                with(r#","hostPortListeners":"sometimes""#),
                Invalid(c, &["hostPortListeners", "refuse", "allow"]),
            ),
            (
                "hostPortListeners wrong type",
                with(r#","hostPortListeners":true"#),
                Invalid(c, &["hostPortListeners"]),
            ),
            (
                "conntrackSize negative",
                with(r#","conntrackSize":-1"#),
                Invalid(c, &["conntrackSize: -1 is out of range"]),
            ),
            (
                "conntrackSize float",
                with(r#","conntrackSize":2048.5"#),
                Invalid(c, &["conntrackSize: 2048.5 is not an integer"]),
            ),
            (
                "conntrackSize string",
                with(r#","conntrackSize":"64k""#),
                Invalid(c, &["conntrackSize: expected an integer, found a string"]),
            ),
            // --- invalid: prevResult and GC keep-list ---
            (
                "prevResult not an object",
                with(r#","prevResult":"10.0.0.2""#),
                Invalid(c, &["prevResult: expected an object, found a string"]),
            ),
            (
                "keep-list not an array",
                with(r#","cni.dev/valid-attachments":{}"#),
                Invalid(c, &["cni.dev/valid-attachments: expected an array"]),
            ),
            (
                "keep-list entry without ifname",
                with(r#","cni.dev/valid-attachments":[{"containerID":"a"}]"#),
                Invalid(c, &["cni.dev/valid-attachments[0].ifname is missing"]),
            ),
            (
                "keep-list containerID not a string",
                with(
                    r#","cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"},{"containerID":1,"ifname":"eth0"}]"#,
                ),
                Invalid(
                    c,
                    &["cni.dev/valid-attachments[1].containerID: expected a string"],
                ),
            ),
            (
                "keep-list entry not an object",
                with(r#","cni.dev/valid-attachments":["a"]"#),
                Invalid(c, &["cni.dev/valid-attachments[0]: expected an object"]),
            ),
        ];
        assert!(rows.len() >= 30, "the table must keep at least 30 rows");

        for (label, input, expect) in rows {
            let result = parse_netconf(input.as_bytes());
            match (expect, result) {
                (Valid(check), Ok(conf)) => check(&conf),
                (Valid(_), Err(error)) => {
                    panic!("{label}: expected a valid config, got error: {error}")
                }
                (Invalid(code, _), Ok(conf)) => {
                    panic!("{label}: expected error code {code}, but it parsed: {conf:?}")
                }
                (Invalid(code, needles), Err(error)) => {
                    assert_eq!(
                        error.cni_code(),
                        code,
                        "{label}: wrong CNI code for error: {error}"
                    );
                    let message = error.to_string();
                    for needle in needles {
                        assert!(
                            message.contains(needle),
                            "{label}: message {message:?} should mention {needle:?}"
                        );
                    }
                }
            }
        }
    }

    /// What containerd 1.6 (through go-cni) sends: Go field names, HostIP
    /// always present and "" when unset.
    const CONTAINERD_MAPPINGS: &str = r#"{"HostPort":18080,"ContainerPort":80,"Protocol":"tcp","HostIP":""},{"HostPort":18443,"ContainerPort":443,"Protocol":"TCP","HostIP":"192.0.2.7"}"#;

    #[test]
    fn every_runtime_spelling_parses_to_the_same_mapping() {
        let expected = vec![
            PortMapping {
                host_ip: HostIp::Any,
                host_port: 18080,
                container_port: 80,
                protocol: Protocol::Tcp,
            },
            PortMapping {
                host_ip: HostIp::Addr("192.0.2.7".parse().unwrap()),
                host_port: 18443,
                container_port: 443,
                protocol: Protocol::Tcp,
            },
        ];
        let cases = [
            ("containerd and Nomad (go-cni)", CONTAINERD_MAPPINGS.to_owned()),
            (
                "CRI-O (ocicni json tags)",
                r#"{"hostPort":18080,"containerPort":80,"protocol":"tcp","hostIP":""},{"hostPort":18443,"containerPort":443,"protocol":"TCP","hostIP":"192.0.2.7"}"#.to_owned(),
            ),
            (
                "podman and libcni (camelCase, hostIP omitted when unset)",
                r#"{"hostPort":18080,"containerPort":80,"protocol":"tcp"},{"hostPort":18443,"containerPort":443,"protocol":"tcp","hostIP":"192.0.2.7"}"#.to_owned(),
            ),
        ];
        for (who, entries) in cases {
            let conf = parse_netconf(mappings(&entries).as_bytes())
                .unwrap_or_else(|error| panic!("{who}: {error}"));
            assert_eq!(conf.port_mappings, expected, "{who}");
        }
    }

    #[test]
    fn every_key_we_read_matches_case_insensitively() {
        let input = r#"{"CNIVERSION":"1.0.0","Name":"k8s","Type":"ebpf-portmap",
            "PinRoot":"/sys/fs/bpf/x","Interfaces":["eth0"],"ConntrackSize":4096,
            "LogFile":"/tmp/x.log","MaxMappings":64,"HostPortListeners":"allow",
            "SNAT":false,"MasqAll":true,"FastPath":true,"CgroupPath":"/sys/fs/cgroup/x",
            "RuntimeConfig":{"PortMappings":[{"HostPort":1,"ContainerPort":2}]},
            "PrevResult":{"IPs":[{"Address":"10.0.0.2/24","Interface":0}],
                          "Interfaces":[{"Name":"eth0","Sandbox":"/proc/1/ns/net"}]},
            "CNI.DEV/VALID-ATTACHMENTS":[{"ContainerID":"a","IfName":"eth0"}]}"#;
        let conf = parse_netconf(input.as_bytes()).unwrap();
        assert_eq!(
            (conf.cni_version.as_str(), conf.name.as_str()),
            ("1.0.0", "k8s")
        );
        assert_eq!(conf.pin_root, PathBuf::from("/sys/fs/bpf/x"));
        assert_eq!(conf.interfaces, Some(vec!["eth0".to_owned()]));
        assert_eq!(
            (conf.conntrack_size, conf.max_mappings),
            (Some(4096), Some(64))
        );
        assert_eq!(conf.log_file, PathBuf::from("/tmp/x.log"));
        assert_eq!(conf.listener_policy, ListenerPolicy::Allow);
        assert_eq!(
            (conf.snat, conf.masq_all, conf.fast_path),
            (false, true, true)
        );
        assert_eq!(conf.cgroup_path, Some(PathBuf::from("/sys/fs/cgroup/x")));
        assert_eq!(conf.port_mappings.len(), 1);
        assert_eq!(
            conf.valid_attachments,
            Some(vec![Attachment {
                container_id: "a".into(),
                ifname: "eth0".into()
            }])
        );
        let addrs =
            crate::cni::prev_result::PrevResult::parse(conf.prev_result.as_ref().unwrap(), "eth0")
                .unwrap()
                .container;
        assert_eq!(
            addrs.v4,
            Some("10.0.0.2".parse().unwrap()),
            "prevResult keys fold too"
        );
        assert_eq!(log_file_of(input.as_bytes()), PathBuf::from("/tmp/x.log"));
        assert_eq!(cni_version_of(input.as_bytes()).as_deref(), Some("1.0.0"));
    }

    #[test]
    fn errors_name_the_key_as_the_user_wrote_it() {
        let cases = [
            (
                mappings(r#"{"HostPort":0,"ContainerPort":80}"#),
                "runtimeConfig.portMappings[0].HostPort: 0 is out of range",
            ),
            (
                mappings(r#"{"HostPort":80}"#),
                "runtimeConfig.portMappings[0].containerPort is missing",
            ),
            (
                mappings(r#"{"HostPort":80,"ContainerPort":80,"Protocol":"icmp"}"#),
                "runtimeConfig.portMappings[0].Protocol: \"icmp\" is not supported",
            ),
            (
                mappings(r#"{"HostPort":80,"ContainerPort":80,"HostIP":"x"}"#),
                "runtimeConfig.portMappings[0].HostIP: \"x\" is not an IP address",
            ),
            (
                with(r#","RuntimeConfig":{"PortMappings":[{"HostPort":"80","ContainerPort":80}]}"#),
                "RuntimeConfig.PortMappings[0].HostPort: expected an integer, found a string",
            ),
            (
                with(r#","RuntimeConfig":{"PortMappings":{}}"#),
                "RuntimeConfig.PortMappings: expected an array, found an object",
            ),
            (
                with(r#","PinRoot":"x""#),
                "PinRoot: \"x\" is not an absolute path",
            ),
            (with(r#","SNAT":1"#), "SNAT: 1 is not true or false"),
            (
                with(
                    r#","runtimeConfig":{"portMappings":[{"HostPort":80,"ContainerPort":80},{"hostPort":80,"containerPort":81}]}"#,
                ),
                "runtimeConfig.portMappings[1] duplicates runtimeConfig.portMappings[0]",
            ),
        ];
        for (input, needle) in cases {
            let error = parse_netconf(input.as_bytes()).expect_err(&input);
            assert!(
                error.to_string().contains(needle),
                "{error} should contain {needle:?}"
            );
        }
        let conf = parse_netconf(
            mappings(r#"{"HostPort":80,"ContainerPort":80,"HostIP":"fd00::1"}"#).as_bytes(),
        )
        .unwrap();
        let v4_only = ContainerAddrs {
            v4: Some("10.0.0.2".parse().unwrap()),
            v6: None,
        };
        let error = check_mappings_reachable(&conf, &v4_only, "eth0").unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("runtimeConfig.portMappings[0].HostIP: fd00::1 is IPv6"),
            "{error}"
        );
    }

    #[test]
    fn keys_given_twice_follow_go() {
        let port = |entries: &str| {
            parse_netconf(mappings(entries).as_bytes()).map(|c| c.port_mappings[0].host_port)
        };
        assert_eq!(
            port(r#"{"hostPort":1,"HostPort":2,"containerPort":80}"#).unwrap(),
            2,
            "the later key wins, even over an exact spelling"
        );
        assert_eq!(
            port(r#"{"HostPort":2,"hostPort":1,"containerPort":80}"#).unwrap(),
            1
        );
        assert_eq!(
            port(r#"{"HostPort":2,"hostPort":null,"containerPort":80}"#).unwrap(),
            2,
            "null leaves an int as it was"
        );
        // runtimeConfig is a struct: a second one merges into the first.
        let conf = parse_netconf(
            with(r#","runtimeConfig":{"portMappings":[{"hostPort":5,"containerPort":6}]},"RuntimeConfig":{"bandwidth":{}}"#)
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(conf.port_mappings.len(), 1, "the first one's mappings stay");
        // prevResult is a map: a second one merges, a null clears it.
        let prev = r#"{"ips":[{"address":"10.0.0.2/24"}]}"#;
        let merged = parse_netconf(
            with(&format!(
                r#","prevResult":{prev},"PrevResult":{{"dns":{{}}}}"#
            ))
            .as_bytes(),
        )
        .unwrap();
        let merged = merged.prev_result.unwrap();
        assert!(
            merged.get("ips").is_some() && merged.get("dns").is_some(),
            "{merged}"
        );
        let cleared =
            parse_netconf(with(&format!(r#","prevResult":{prev},"PrevResult":null"#)).as_bytes())
                .unwrap();
        assert!(cleared.prev_result.is_none());
        // snat is a *bool upstream: null clears it back to the default.
        let snat = parse_netconf(with(r#","snat":false,"SNAT":null"#).as_bytes()).unwrap();
        assert!(snat.snat);
    }

    #[test]
    fn log_file_is_found_before_parsing_and_never_fails() {
        assert_eq!(
            log_file_of(br#"{"logFile":"/tmp/x.log","cniVersion":"9.9.9"}"#),
            PathBuf::from("/tmp/x.log"),
            "read even from a config that will be refused"
        );
        for stdin in [
            &b"not json"[..],
            b"[]",
            br#"{"logFile":"relative"}"#,
            br#"{"logFile":7}"#,
        ] {
            assert_eq!(
                log_file_of(stdin),
                PathBuf::from(DEFAULT_LOG_FILE),
                "{}",
                String::from_utf8_lossy(stdin)
            );
        }
    }

    #[test]
    fn invalid_json_keeps_the_parser_error_as_source() {
        let error = parse_netconf(b"{\"cniVersion\":").expect_err("truncated JSON must fail");
        let source = std::error::Error::source(&error).expect("the serde error must be the source");
        assert!(
            !error.to_string().contains(&source.to_string()),
            "Display must not repeat the source: {error}"
        );
    }

    #[test]
    fn teardown_parse_drops_bad_request_data_but_not_identity() {
        let input = with(r#","runtimeConfig":{"portMappings":[{"hostPort":0}]},"prevResult":[1]"#);
        assert!(
            parse_netconf(input.as_bytes()).is_err(),
            "strict parsing must reject it"
        );
        let (conf, dropped) = parse_netconf_for_teardown(input.as_bytes())
            .expect("teardown parsing must tolerate it");
        assert!(
            conf.port_mappings.is_empty(),
            "bad mappings are dropped, not half-kept"
        );
        assert!(conf.prev_result.is_none(), "bad prevResult is dropped");
        assert_eq!(
            dropped.len(),
            2,
            "both problems are reported for logging: {dropped:?}"
        );

        let bad_name = r#"{"cniVersion":"1.0.0","type":"t"}"#;
        let error =
            parse_netconf_for_teardown(bad_name.as_bytes()).expect_err("name is still needed");
        assert_eq!(error.cni_code(), code::INVALID_NETWORK_CONFIG, "{error}");
    }

    #[test]
    fn protocol_numbers_and_names() {
        for (protocol, number, name) in [
            (Protocol::Tcp, 6, "tcp"),
            (Protocol::Udp, 17, "udp"),
            (Protocol::Sctp, 132, "sctp"),
        ] {
            assert_eq!(protocol.number(), number, "IPPROTO number of {name}");
            assert_eq!(protocol.as_str(), name, "name of {protocol:?}");
            assert_eq!(
                Protocol::from_name(&name.to_uppercase()),
                Some(protocol),
                "upper-case {name}"
            );
        }
        assert_eq!(
            Protocol::from_name("icmp"),
            None,
            "icmp is not a port protocol"
        );
    }

    #[test]
    fn host_ip_families() {
        let v4 = HostIp::Addr("192.0.2.1".parse().unwrap());
        let v6 = HostIp::Addr("2001:db8::1".parse().unwrap());
        let cases = [
            (HostIp::Any, true, true, None),
            (HostIp::AnyV4, true, false, None),
            (HostIp::AnyV6, false, true, None),
            (v4, true, false, v4.specific()),
            (v6, false, true, v6.specific()),
        ];
        for (host_ip, allows_v4, allows_v6, specific) in cases {
            assert_eq!(host_ip.allows_v4(), allows_v4, "{host_ip:?}.allows_v4()");
            assert_eq!(host_ip.allows_v6(), allows_v6, "{host_ip:?}.allows_v6()");
            assert_eq!(host_ip.specific(), specific, "{host_ip:?}.specific()");
        }
        assert_eq!(
            v4.specific(),
            Some("192.0.2.1".parse().unwrap()),
            "explicit address is specific"
        );
    }

    #[test]
    fn versions_compare_numerically() {
        assert_eq!(
            version_tuple("1.1.0"),
            Some((1, 1, 0)),
            "three-part version parses"
        );
        assert_eq!(version_tuple("1.1"), None, "two parts is not a version");
        assert_eq!(
            version_tuple("1.1.0.0"),
            None,
            "four parts is not a version"
        );
        assert!(
            version_at_least("0.4.0", "0.4.0"),
            "equal counts as at least"
        );
        assert!(
            version_at_least("1.0.0", "0.4.0"),
            "1.0.0 is newer than 0.4.0"
        );
        assert!(
            !version_at_least("0.3.1", "0.4.0"),
            "0.3.1 is older than 0.4.0"
        );
        assert!(
            !version_at_least("0.10.0", "1.0.0"),
            "minor 10 is still major 0"
        );
        assert!(
            version_at_least("0.10.0", "0.4.0"),
            "compare numbers, not strings"
        );
        assert!(
            !version_at_least("garbage", "0.0.0"),
            "unparseable is never at least"
        );
    }

    #[test]
    fn identifiers_follow_the_spec_rule() {
        for good in [
            "a",
            "0",
            "abc-DEF_1.2",
            "3f6940ab5ab43bc522569d15b23f8c1bbde1d7678b080398506924fc01d72755",
        ] {
            assert_eq!(
                validate_identifier(good),
                Ok(()),
                "{good:?} must be accepted"
            );
        }
        assert_eq!(
            validate_identifier(""),
            Err(IdentifierError::Empty),
            "empty identifier"
        );
        assert_eq!(
            validate_identifier("_a"),
            Err(IdentifierError::BadFirstChar { ch: '_' }),
            "identifier starting with underscore"
        );
        assert_eq!(
            validate_identifier("a b"),
            Err(IdentifierError::BadChar {
                ch: ' ',
                position: 1
            }),
            "identifier with a space"
        );
        assert_eq!(
            validate_identifier("a/b"),
            Err(IdentifierError::BadChar {
                ch: '/',
                position: 1
            }),
            "identifier with a slash"
        );
        assert!(
            validate_identifier("é").is_err(),
            "non-ASCII letters are not allowed"
        );
    }

    #[test]
    fn ifnames_follow_the_kernel_rule() {
        for good in ["eth0", "a", "abcdefghijklmno", "bond0.100", "net-1_x", "é"] {
            assert_eq!(validate_ifname(good), Ok(()), "{good:?} must be accepted");
        }
        assert_eq!(validate_ifname(""), Err(IfnameError::Empty), "empty ifname");
        assert_eq!(
            validate_ifname("abcdefghijklmnop"),
            Err(IfnameError::TooLong { len: 16 }),
            "16-byte ifname exceeds IFNAMSIZ - 1"
        );
        assert_eq!(
            validate_ifname("."),
            Err(IfnameError::Reserved),
            "\".\" is reserved"
        );
        assert_eq!(
            validate_ifname(".."),
            Err(IfnameError::Reserved),
            "\"..\" is reserved"
        );
        for (bad, ch) in [
            ("a/b", '/'),
            ("a:b", ':'),
            ("a b", ' '),
            ("a\tb", '\t'),
            ("a\u{b}b", '\u{b}'),
            ("a\0b", '\0'),
        ] {
            assert_eq!(
                validate_ifname(bad),
                Err(IfnameError::ForbiddenChar { ch }),
                "{bad:?}"
            );
        }
        // U+00E0 is C3 A0 in UTF-8; the kernel's isspace() matches the 0xa0 byte.
        assert_eq!(
            validate_ifname("à"),
            Err(IfnameError::ForbiddenChar { ch: '\u{a0}' }),
            "0xa0 byte inside UTF-8"
        );
    }

    fn mapping(host_ip: HostIp) -> PortMapping {
        PortMapping {
            host_ip,
            host_port: 8080,
            container_port: 80,
            protocol: Protocol::Tcp,
        }
    }

    /// The reachability check with the keys a camelCase configuration has.
    fn reachable(
        mappings: &[PortMapping],
        container: &ContainerAddrs,
        ifname: &str,
    ) -> Result<(), ConfigError> {
        mappings_reachable(
            mappings,
            |index| format!("{MAPPINGS_KEY}[{index}].hostIP"),
            container,
            ifname,
        )
    }

    #[test]
    fn mappings_need_a_container_address_of_their_family() {
        let v4_only = ContainerAddrs {
            v4: Some("10.0.0.2".parse().unwrap()),
            v6: None,
        };
        let v6_only = ContainerAddrs {
            v4: None,
            v6: Some("fd00::2".parse().unwrap()),
        };
        let none = ContainerAddrs::default();

        assert!(
            reachable(&[], &none, "eth0").is_ok(),
            "no mappings need no address"
        );
        let error = reachable(&[mapping(HostIp::Any)], &none, "eth0").expect_err("no address");
        assert!(
            matches!(error, ConfigError::NoContainerAddress { .. }),
            "{error}"
        );
        assert!(
            error.to_string().contains("\"eth0\""),
            "{error} should name the interface"
        );

        assert!(
            reachable(&[mapping(HostIp::Any)], &v6_only, "eth0").is_ok(),
            "Any works with one family"
        );
        assert!(
            reachable(&[mapping(HostIp::AnyV6)], &v6_only, "eth0").is_ok(),
            ":: works with an IPv6 container"
        );

        let explicit_v4 = mapping(HostIp::Addr("1.2.3.4".parse().unwrap()));
        let error = reachable(&[mapping(HostIp::Any), explicit_v4], &v6_only, "eth0")
            .expect_err("IPv4 hostIP with an IPv6-only container");
        assert_eq!(
            error.cni_code(),
            code::INVALID_NETWORK_CONFIG,
            "family mismatch is an invalid config"
        );
        let message = error.to_string();
        assert!(
            message.contains("runtimeConfig.portMappings[1].hostIP: 1.2.3.4 is IPv4")
                && message.contains("no IPv4 address"),
            "message must name the entry and the missing family: {message}"
        );
        let error =
            reachable(&[mapping(HostIp::AnyV6)], &v4_only, "eth0").expect_err(":: needs IPv6");
        assert!(error.to_string().contains("IPv6"), "{error}");
    }
}
