//! `runtimeConfig.portMappings`: each entry validated into a
//! [`PortMapping`] (keys matched as Go matches them, errors naming the entry
//! as written), duplicates and overlaps inside one request refused, and the
//! check that every mapping can reach the container's addresses.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::net::{AddrParseError, IpAddr};

use serde_json::value::RawValue;

use crate::cni::error::code;
use crate::cni::json::{Integer, ShapeError, integer, object, raw_to_value};
use crate::cni::json_keys::{self, Field, Found, Object};
use crate::model::{ContainerAddrs, HostClaim, HostIp, PortMapping, Protocol};

const MAPPINGS_KEY: &str = "runtimeConfig.portMappings";

/// What can be wrong with `runtimeConfig.portMappings`, or with a mapping
/// against the container's addresses.
#[derive(Debug, thiserror::Error)]
pub enum MappingError {
    #[error(transparent)]
    Shape(#[from] ShapeError),
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

impl MappingError {
    /// The CNI spec error code for this error.
    pub fn cni_code(&self) -> u32 {
        match self {
            MappingError::Shape(error) => error.cni_code(),
            _ => code::INVALID_NETWORK_CONFIG,
        }
    }
}

/// Checks that every mapping can reach the container: if there are mappings the
/// container needs an address, and a mapping pinned to one family (an explicit
/// address, "0.0.0.0" or "::") needs a container address of that family.
/// Upstream portmap silently skipped such mappings; a port that never opens is
/// worse than an error.
///
/// `host_ip_keys` are the keys as the configuration spelled them, one per
/// mapping (`NetConf::host_ip_keys`), for the error to name.
pub fn check_mappings_reachable(
    mappings: &[PortMapping],
    host_ip_keys: &[String],
    container: &ContainerAddrs,
    ifname: &str,
) -> Result<(), MappingError> {
    mappings_reachable(
        mappings,
        |index| {
            host_ip_keys
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
) -> Result<(), MappingError> {
    if mappings.is_empty() {
        return Ok(());
    }
    if container.v4.is_none() && container.v6.is_none() {
        return Err(MappingError::NoContainerAddress {
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
            return Err(MappingError::ContainerLacksFamily {
                key: host_ip_key(index),
                host_ip: mapping.host_ip,
                family,
                ifname: ifname.to_owned(),
            });
        }
    }
    Ok(())
}

const RUNTIME_CONFIG_FIELDS: &[Field] = &[Field::nullable("portMappings")];

/// Upstream's `PortMapEntry`; also libcni's, ocicni's and go-cni's
/// `PortMapping` (go-cni's has no tags, hence containerd's `HostPort`).
const MAPPING_FIELDS: &[Field] = &[
    Field::scalar("hostPort"),
    Field::scalar("containerPort"),
    Field::scalar("protocol"),
    Field::scalar("hostIP"),
];

/// The validated mappings and, for each, the path of its `hostIP` key as
/// written (for later messages). `runtime_configs` are the occurrences of
/// runtimeConfig, which Go merges into one struct.
///
/// A request may hold as many entries as the mappings map holds (Podman
/// expands `-p 10000-12000:10000-12000` into 2001 entries; upstream portmap
/// has no limit); more could never be claimed, so they are refused before
/// anything is parsed.
pub(super) fn parse_port_mappings(
    runtime_configs: &[Found<'_, RawValue>],
    limit: usize,
) -> Result<(Vec<PortMapping>, Vec<String>), MappingError> {
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
        ShapeError::WrongType {
            key: list_key.clone(),
            expected: "an array",
            found: json_keys::kind_of(found.value),
        }
    })?;
    // Checked before parsing so an oversized list costs nothing.
    if list.len() > limit {
        return Err(MappingError::TooManyMappings {
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

fn raw_wrong_type(key: EntryKey<'_>, expected: &'static str, raw: &RawValue) -> MappingError {
    ShapeError::WrongType {
        key: key.to_string(),
        expected,
        found: json_keys::kind_of(raw),
    }
    .into()
}

/// One mapping entry, and the path of its `hostIP` key (empty when hostIP is
/// absent or empty: no message is ever about it then).
fn parse_port_mapping(
    list: &str,
    index: usize,
    entry: &RawValue,
) -> Result<(PortMapping, String), MappingError> {
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
fn parse_port(value: Option<EntryField<'_>>, missing: EntryKey<'_>) -> Result<u16, MappingError> {
    let Some((key, raw)) = value else {
        return Err(ShapeError::MissingField {
            field: missing.to_string(),
        }
        .into());
    };
    let value = raw_to_value(raw)?;
    let out_of_range = || MappingError::PortOutOfRange {
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

fn parse_protocol(value: Option<EntryField<'_>>) -> Result<Protocol, MappingError> {
    let Some((key, raw)) = value else {
        return Ok(Protocol::Tcp);
    };
    let name = raw_str(raw).ok_or_else(|| raw_wrong_type(key, "a string", raw))?;
    // libcni's PortMapping has no omitempty on "protocol", so Go runtimes that
    // leave it unset send "": that means the default, like an absent key.
    if name.is_empty() {
        return Ok(Protocol::Tcp);
    }
    Protocol::from_name(&name).ok_or_else(|| MappingError::UnknownProtocol {
        key: key.to_string(),
        protocol: name.into_owned(),
    })
}

fn parse_host_ip(value: Option<EntryField<'_>>) -> Result<HostIp, MappingError> {
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
        .map_err(|source| MappingError::InvalidHostIp {
            key: key.to_string(),
            value: text.clone().into_owned(),
            source,
        })?
        // ::ffff:a.b.c.d is how some callers spell an IPv4 address; the packets
        // we match are plain IPv4.
        .to_canonical();
    let unusable = |reason| MappingError::UnusableHostIp {
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
fn reject_duplicates(list_key: &str, mappings: &[PortMapping]) -> Result<(), MappingError> {
    let mut claimed: HashMap<(HostClaim, u16, Protocol), usize> =
        HashMap::with_capacity(mappings.len() * 2);
    for (index, mapping) in mappings.iter().enumerate() {
        for claim in mapping.host_ip.claims().into_iter().flatten() {
            if let Some(first) = claimed.insert((claim, mapping.host_port, mapping.protocol), index)
            {
                return Err(MappingError::DuplicateMapping {
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
fn reject_overlaps(list_key: &str, mappings: &[PortMapping]) -> Result<(), MappingError> {
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
                return Err(MappingError::OverlappingMappings {
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

#[cfg(test)]
mod tests {
    use super::*;

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
    ) -> Result<(), MappingError> {
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
            matches!(error, MappingError::NoContainerAddress { .. }),
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
