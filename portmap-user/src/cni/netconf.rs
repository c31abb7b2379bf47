//! Network configuration: turns the JSON the runtime hands us on stdin into
//! validated, typed values (`NetConf`, `PortMapping`, `Attachment`) and reads the
//! container's addresses out of `prevResult`.
//!
//! Everything here is pure (no syscalls) so each rule is unit-tested without a
//! kernel. The JSON is walked by hand rather than through `#[derive(Deserialize)]`
//! so that every error can name the exact key and list index the user must fix.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::cni::error::code;
use crate::cni::json::{
    Integer, ShapeError, integer, json_kind, key_path, object, raw_to_value, wrong_type,
};
use crate::cni::json_keys::{self, Field, Found, Object, Resolved};
pub use crate::cni::names::{
    IdentifierError, IfnameError, MAX_IFNAME_LEN, validate_identifier, validate_ifname,
};
use crate::cni::port_mappings::{self, MappingError};
pub mod conditions;
pub mod spelling;

use conditions::{ConditionError, ConditionSet};

use crate::model::{
    Attachment, CONNTRACK_SIZE_MAX, CONNTRACK_SIZE_MIN, DEFAULT_PIN_ROOT, FastPathSetting,
    MAX_MAPPINGS_MAX, MAX_MAPPINGS_MIN, PortMapping,
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

/// Key under which the runtime passes the GC keep-list (CNI 1.1).
pub const VALID_ATTACHMENTS_KEY: &str = "cni.dev/valid-attachments";
/// Name used by an early draft of the 1.1 spec; libcni sends both keys with the
/// same value (containernetworking/cni#1101), so we read it when the proper key
/// is absent.
pub const LEGACY_ATTACHMENTS_KEY: &str = "cni.dev/attachments";

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
    /// `serviceVipDevices`: names or patterns of the devices that hold
    /// Service virtual IPs (kube-proxy's IPVS mode puts every ClusterIP on
    /// `kube-ipvs0`, the default). Their addresses are the node's to the
    /// kernel but never a hostPort's: a wildcard hostPort would otherwise
    /// take the Services' traffic. `[]` for none.
    pub service_vip_devices: Vec<String>,
    /// `conntrackSize`: entries of each open conntrack table; `None`: sized
    /// from the node (`dataplane::sizing`). A change resizes the tables in
    /// place at the next run (`dataplane::resize`).
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
    /// `fastPath`: hand translated packets straight to the container's veth
    /// and answers straight to the interface towards the client, skipping
    /// the node's routing, netfilter and bridge: `true` for every flow,
    /// `false` for none, unset (the default) for flows the kernel's
    /// conntrack holds as confirmed.
    pub fast_path: FastPathSetting,
    /// `containerSockets` (default false): translate this network's
    /// containers' own `connect()`/`sendmsg()` to a host port on one of the
    /// node's addresses at the socket (direct: the answering container sees
    /// the dialling pod's address, the node's netfilter sees no hostPort
    /// traffic) instead of the packet path (hairpin, masqueraded with
    /// `snat`). ADD registers the container's network namespace for it.
    pub container_sockets: bool,
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
    pub(super) prev_result: Option<Value>,
    /// GC only: `cni.dev/valid-attachments`.
    pub valid_attachments: Option<Vec<Attachment>>,
    /// Keys of the upstream `portmap` plugin present here that ebpf-portmap
    /// accepts and does not use ([`UPSTREAM_UNUSED_KEYS`]), as spelled.
    pub upstream_unused: Vec<UpstreamKey>,
    /// Keys that are none of ours but a typo away from one, with the key
    /// meant: ignored, and warned about.
    pub misspelt_keys: Vec<spelling::MisspeltKey>,
    /// `conditionsV4`: who may open a flow through the IPv4 mappings
    /// (`None`: everyone).
    pub conditions_v4: Option<ConditionSet>,
    /// `conditionsV6`, likewise for IPv6.
    pub conditions_v6: Option<ConditionSet>,
}

impl NetConf {
    /// The conditions of `family`'s mappings, if the configuration has any.
    pub fn conditions(&self, family: u8) -> Option<&ConditionSet> {
        if family == portmap_common::FAMILY_V4 {
            self.conditions_v4.as_ref()
        } else {
            self.conditions_v6.as_ref()
        }
    }
}

/// An upstream `portmap` key found in the configuration that ebpf-portmap
/// has no use for, with what it does instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamKey {
    /// The key as the configuration spells it.
    pub key: String,
    pub instead: &'static str,
}

impl std::fmt::Display for UpstreamKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (a key of the upstream portmap plugin) is ignored: {}",
            self.key, self.instead
        )
    }
}

/// Upstream `portmap` keys that restrict who may reach the host ports
/// (iptables match conditions added to every DNAT rule), with the family
/// of their mappings: enforced by the programs in their common forms
/// ([`conditions`]), any other form refused.
pub const UPSTREAM_CONDITION_KEYS: [(&str, u8); 2] = [
    ("conditionsV4", portmap_common::FAMILY_V4),
    ("conditionsV6", portmap_common::FAMILY_V6),
];

/// Upstream `portmap` keys about its iptables/nftables machinery, which
/// ebpf-portmap does not have, each with what it does instead: accepted (a
/// conflist that swaps `"type": "portmap"` for ours keeps working), and
/// named in one warning per ADD.
pub const UPSTREAM_UNUSED_KEYS: [(&str, &str); 3] = [
    (
        "markMasqBit",
        "ebpf-portmap marks no packets; its programs masquerade hairpin flows themselves (`snat`, `masqAll`)",
    ),
    (
        "externalSetMarkChain",
        "ebpf-portmap uses no iptables chain; its programs masquerade hairpin flows themselves (`snat`, `masqAll`)",
    ),
    (
        "backend",
        "ebpf-portmap uses neither iptables nor nftables; its eBPF programs translate the traffic",
    ),
];

/// What can be wrong with the configuration's own keys; a bad value's shape
/// ([`ShapeError`]) and a bad port mapping ([`MappingError`]) have their own.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Shape(#[from] ShapeError),
    #[error(transparent)]
    Mapping(#[from] MappingError),
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
        "{key}: {reason}; {supported} (nothing was changed: fix the condition, or keep the upstream portmap plugin for this network)",
        supported = conditions::SUPPORTED
    )]
    UnsupportedCondition { key: String, reason: ConditionError },
}

impl ConfigError {
    /// The CNI spec error code for this error.
    pub fn cni_code(&self) -> u32 {
        match self {
            ConfigError::Shape(error) => error.cni_code(),
            ConfigError::Mapping(error) => error.cni_code(),
            ConfigError::NotAnObject { .. } => code::DECODING_FAILURE,
            ConfigError::MissingVersion | ConfigError::UnsupportedVersion { .. } => {
                code::INCOMPATIBLE_VERSION
            }
            ConfigError::InvalidNetworkName { .. }
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
            | ConfigError::UnsupportedCondition { .. } => code::INVALID_NETWORK_CONFIG,
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
    Field::nullable("serviceVipDevices"),
    Field::scalar("conntrackSize"),
    Field::scalar("logFile"),
    Field::scalar("maxMappings"),
    Field::scalar("hostPortListeners"),
    Field::scalar("masqAll"),
    // A `*bool` to Go: `null` is the default (unset), as absent.
    Field::nullable("fastPath"),
    Field::scalar("containerSockets"),
    Field::scalar("cgroupPath"),
    // Upstream portmap's, pointers there (`*[]string`, `*int`, `*string`).
    Field::nullable("conditionsV4"),
    Field::nullable("conditionsV6"),
    Field::nullable("markMasqBit"),
    Field::nullable("externalSetMarkChain"),
    Field::nullable("backend"),
];
const ATTACHMENT_FIELDS: &[Field] = &[Field::scalar("containerID"), Field::scalar("ifname")];

/// A value from the configuration with its key path as the user spelled it.
#[derive(Debug)]
struct Given {
    key: String,
    value: Value,
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

/// The configuration on stdin as an object, keys in document order.
fn root_object(stdin: &[u8]) -> Result<Object<'_>, ConfigError> {
    match serde_json::from_slice::<Object<'_>>(stdin) {
        Ok(root) => Ok(root),
        Err(source) => match serde_json::from_slice::<Value>(stdin) {
            Ok(other) => Err(ConfigError::NotAnObject {
                found: json_kind(&other),
            }),
            Err(_) => Err(ShapeError::InvalidJson { source }.into()),
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
        return Err(ShapeError::EmptyField { key: type_key }.into());
    }
    let pin_root = parse_pin_root(value("pinRoot")?)?;
    let interfaces = parse_interfaces(value("interfaces")?)?;
    let service_vip_devices = parse_vip_devices(value("serviceVipDevices")?)?;
    let conntrack_size = parse_conntrack_size(value("conntrackSize")?)?;
    let log_file = parse_log_file(value("logFile")?)?;
    let max_mappings = parse_max_mappings(value("maxMappings")?)?;
    let listener_policy = parse_listener_policy(value("hostPortListeners")?)?;
    let snat = parse_bool(value("snat")?, true)?;
    let masq_all = parse_bool(value("masqAll")?, false)?;
    let fast_path = parse_fast_path(value("fastPath")?)?;
    let container_sockets = parse_bool(value("containerSockets")?, false)?;
    let cgroup_path = parse_cgroup_path(value("cgroupPath")?)?;
    let valid_attachments = parse_valid_attachments(&fields)?;

    let mut dropped = Vec::new();
    let (port_mappings, host_ip_keys) = tolerate(
        port_mappings::parse_port_mappings(
            &fields.all("runtimeConfig"),
            max_mappings.unwrap_or(portmap_common::capacity::MAPPINGS) as usize,
        )
        .map_err(ConfigError::from),
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
    // Refused for ADD, CHECK and STATUS; DEL and GC go on (they remove
    // conditions by owner, and teardown must not get stuck).
    let mut condition_sets = [None, None];
    for ((name, family), slot) in UPSTREAM_CONDITION_KEYS.iter().zip(&mut condition_sets) {
        *slot = tolerate(
            parse_conditions(value(name)?, *family),
            None,
            strictness,
            &mut dropped,
        )?;
    }
    let [conditions_v4, conditions_v6] = condition_sets;
    let mut upstream_unused = Vec::new();
    for (name, instead) in UPSTREAM_UNUSED_KEYS {
        if let Some(Given { key, value }) = value(name)?
            && !value.is_null()
        {
            upstream_unused.push(UpstreamKey { key, instead });
        }
    }

    Ok((
        NetConf {
            cni_version,
            name,
            plugin_type,
            pin_root,
            interfaces,
            service_vip_devices,
            conntrack_size,
            log_file,
            max_mappings,
            listener_policy,
            snat,
            masq_all,
            fast_path,
            container_sockets,
            cgroup_path,
            port_mappings,
            host_ip_keys,
            prev_result,
            valid_attachments,
            upstream_unused,
            misspelt_keys: spelling::misspelt(root.entries().map(|(key, _)| key), ROOT_FIELDS),
            conditions_v4,
            conditions_v6,
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

/// `conditionsV4`/`conditionsV6`: absent, `null` or an empty list adds
/// no condition (upstream neither); the supported forms become a
/// [`ConditionSet`]; anything else is refused, naming the argument.
fn parse_conditions(value: Option<Given>, family: u8) -> Result<Option<ConditionSet>, ConfigError> {
    let Some(Given { key, value }) = value else {
        return Ok(None);
    };
    conditions::parse(&key, family, &value)
        .map_err(|(key, reason)| ConfigError::UnsupportedCondition { key, reason })
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
    let Some(given) = value else {
        return Ok(None);
    };
    if given.value.as_array().is_some_and(Vec::is_empty) {
        return Err(ConfigError::EmptyInterfaceList { key: given.key });
    }
    interface_list(given).map(Some)
}

/// `serviceVipDevices`: absent or `null` for the default, `[]` for none.
fn parse_vip_devices(value: Option<Given>) -> Result<Vec<String>, ConfigError> {
    match value {
        Some(given) if !given.value.is_null() => interface_list(given),
        _ => Ok(crate::model::DEFAULT_SERVICE_VIP_DEVICES
            .map(str::to_owned)
            .to_vec()),
    }
}

/// A list of interface names or shell-style patterns, each valid and
/// listed once.
fn interface_list(Given { key, value }: Given) -> Result<Vec<String>, ConfigError> {
    let list = value
        .as_array()
        .ok_or_else(|| wrong_type(&key, "an array of interface names", &value))?;
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
    Ok(names)
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

/// `fastPath`: a bool, or absent for the confirmed-flow default (`null`
/// too, as a Go plugin's `*bool` reads it).
fn parse_fast_path(value: Option<Given>) -> Result<FastPathSetting, ConfigError> {
    Ok(match value {
        None
        | Some(Given {
            value: Value::Null, ..
        }) => FastPathSetting::Confirmed,
        Some(given) => {
            if parse_bool(Some(given), false)? {
                FastPathSetting::Always
            } else {
                FastPathSetting::Never
            }
        }
    })
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

/// `pinRoot` of a configuration, read leniently as [`log_file_of`] reads
/// `logFile`: where a run that failed before its verb looked (a
/// configuration error) is counted. The default when stdin is not a
/// configuration or the key is invalid.
pub fn pin_root_of(stdin: &[u8]) -> PathBuf {
    serde_json::from_slice::<Object<'_>>(stdin)
        .ok()
        .and_then(|root| {
            let fields = root.resolve(ROOT_FIELDS);
            parse_pin_root(given(fields.get("pinRoot"), "").ok()?).ok()
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PIN_ROOT))
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
        ShapeError::WrongType {
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
            other => return Err(wrong_type(occurrence.key, "an object", &other).into()),
        }
    }
    Ok(merged.map(Value::Object))
}

/// A required string: (its key path as written, the string). `missing_key`
/// names the key when it is absent.
fn required_string(
    value: Option<Given>,
    missing_key: &str,
) -> Result<(String, String), ConfigError> {
    match value {
        None => Err(ShapeError::MissingField {
            field: missing_key.to_owned(),
        }
        .into()),
        Some(Given {
            key,
            value: Value::String(text),
        }) => Ok((key, text)),
        Some(Given { key, value }) => Err(wrong_type(&key, "a string", &value).into()),
    }
}

#[cfg(test)]
mod tests;
