//! `prevResult`: what the plugins before this one in the chain reported, read
//! once per request into [`PrevResult`] (the container's addresses on its
//! sandbox interface, and every interface with its MAC and sandbox), keys
//! matched as upstream matches them.

use std::net::IpAddr;

use serde_json::Value;

use crate::cni::error::code;
use crate::cni::json::{Integer, ShapeError, expect_object, integer, key_path, wrong_type};
use crate::cni::json_keys::{self, Field, Found, Resolved};
use crate::model::{ContainerAddrs, PrevInterface};

/// What can be wrong with prevResult on the way to the container's addresses.
#[derive(Debug, thiserror::Error)]
pub enum PrevResultError {
    #[error(transparent)]
    Shape(#[from] ShapeError),
    #[error("{key}: {value:?} is not an address in CIDR form such as \"10.0.0.2/24\"")]
    InvalidCidr { key: String, value: String },
}

impl PrevResultError {
    /// The CNI spec error code for this error.
    pub fn cni_code(&self) -> u32 {
        match self {
            PrevResultError::Shape(error) => error.cni_code(),
            PrevResultError::InvalidCidr { .. } => code::INVALID_NETWORK_CONFIG,
        }
    }
}

/// prevResult as this plugin reads it, parsed once when the request is built
/// (the runtime's JSON never goes past `cni`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrevResult {
    /// The first IPv4 and the first IPv6 address of the sandbox interface.
    pub container: ContainerAddrs,
    /// Every entry of `interfaces`: the container's and the node-side ones
    /// (bridge, host end of the veth), which the hairpin path and the fast
    /// path start from.
    pub interfaces: Vec<PrevInterface>,
}

impl PrevResult {
    /// Parses `prev_result` for the sandbox interface `ifname`, strictly: a
    /// malformed entry on the way to the container's addresses fails (ADD,
    /// CHECK).
    pub fn parse(prev_result: &Value, ifname: &str) -> Result<PrevResult, PrevResultError> {
        let (interfaces, container) = read(prev_result, ifname);
        Ok(PrevResult {
            container: container?,
            interfaces,
        })
    }

    /// Parses `prev_result` for teardown (DEL): entries are found by owner,
    /// so addresses only help. When they cannot be read the error is
    /// returned beside a result without them, and the interfaces (read
    /// leniently in any case) are kept.
    pub fn parse_for_teardown(
        prev_result: &Value,
        ifname: &str,
    ) -> (PrevResult, Option<PrevResultError>) {
        let (interfaces, container) = read(prev_result, ifname);
        match container {
            Ok(container) => (
                PrevResult {
                    container,
                    interfaces,
                },
                None,
            ),
            Err(error) => (
                PrevResult {
                    container: ContainerAddrs::default(),
                    interfaces,
                },
                Some(error),
            ),
        }
    }
}

/// One walk of prevResult: its interfaces, read leniently, and the
/// container's addresses, read strictly.
fn read(
    prev_result: &Value,
    ifname: &str,
) -> (Vec<PrevInterface>, Result<ContainerAddrs, PrevResultError>) {
    let Some(prev) = prev_result.as_object() else {
        return (
            Vec::new(),
            Err(wrong_type("prevResult", "an object", prev_result).into()),
        );
    };
    let fields = json_keys::resolve_sorted(PREV_RESULT_FIELDS, prev);
    let interfaces = fields
        .get("interfaces")
        .and_then(|found| found.value.as_array())
        .map(|list| interfaces_of(list))
        .unwrap_or_default();
    (interfaces, container_addrs(&fields, ifname))
}

/// From prevResult: the first IPv4 and first IPv6 address of the sandbox
/// interface named `ifname`. An ip entry counts when it has no "interface"
/// index, or when the index points at an interface whose name == ifname and
/// whose "sandbox" is non-empty (upstream portmap's rule). Addresses are CIDR
/// strings ("10.0.0.2/24"). Keys are matched like upstream matches them
/// ([`json_keys`]).
///
/// An index that points past the `interfaces` list, or is negative, does not
/// point at our interface and so does not count.
fn container_addrs(
    fields: &Resolved<'_, Value>,
    ifname: &str,
) -> Result<ContainerAddrs, PrevResultError> {
    let interfaces = optional_array(fields.get("interfaces"), "prevResult")?;
    let ips = optional_array(fields.get("ips"), "prevResult")?;
    let mut addrs = ContainerAddrs::default();
    for (index, ip) in ips.1.iter().enumerate() {
        let key = format!("prevResult.{}[{index}]", ips.0);
        let ip = expect_object(&key, ip)?;
        let ip = json_keys::resolve_sorted(IP_FIELDS, ip);
        if !ip_is_on_sandbox_interface(&ip, &key, interfaces, ifname)? {
            continue;
        }
        let (address_key, address) = required_str(ip.get("address"), &key, "address")?;
        // 0.3.x entries also carry "version"; the address itself is authoritative.
        match parse_cidr_address(address).ok_or_else(|| PrevResultError::InvalidCidr {
            key: address_key,
            value: address.to_owned(),
        })? {
            IpAddr::V4(v4) => {
                addrs.v4.get_or_insert(v4);
            }
            IpAddr::V6(v6) => {
                addrs.v6.get_or_insert(v6);
            }
        }
    }
    Ok(addrs)
}

/// prevResult's `interfaces`, keys matched like upstream matches them.
/// Entries that are not objects are skipped.
fn interfaces_of(list: &[Value]) -> Vec<PrevInterface> {
    list.iter()
        .filter_map(Value::as_object)
        .map(|interface| {
            let fields = json_keys::resolve_sorted(INTERFACE_FIELDS, interface);
            let text = |name| {
                fields
                    .get(name)
                    .and_then(|found| found.value.as_str())
                    .map(str::to_owned)
            };
            PrevInterface {
                name: text("name"),
                mac: text("mac"),
                sandbox: text("sandbox"),
            }
        })
        .collect()
}

const PREV_RESULT_FIELDS: &[Field] = &[Field::nullable("interfaces"), Field::nullable("ips")];
const INTERFACE_FIELDS: &[Field] = &[
    Field::scalar("name"),
    Field::scalar("mac"),
    Field::scalar("sandbox"),
];
const IP_FIELDS: &[Field] = &[Field::nullable("interface"), Field::scalar("address")];

fn ip_is_on_sandbox_interface(
    ip: &Resolved<'_, Value>,
    key: &str,
    interfaces: (&str, &[Value]),
    ifname: &str,
) -> Result<bool, PrevResultError> {
    let Some(index) = ip.get("interface") else {
        return Ok(true);
    };
    let index_key = key_path(key, index.key);
    let index = match integer(&index_key, index.value)? {
        Integer::Unsigned(index) => index,
        Integer::Negative => return Ok(false),
    };
    let Some(interface) = usize::try_from(index)
        .ok()
        .and_then(|index| interfaces.1.get(index))
    else {
        return Ok(false);
    };
    let interface_key = format!("prevResult.{}[{index}]", interfaces.0);
    let interface = expect_object(&interface_key, interface)?;
    let interface = json_keys::resolve_sorted(INTERFACE_FIELDS, interface);
    let (_, name) = required_str(interface.get("name"), &interface_key, "name")?;
    let sandbox = match interface.get("sandbox") {
        None => "",
        Some(sandbox) => sandbox.value.as_str().ok_or_else(|| {
            wrong_type(
                &key_path(&interface_key, sandbox.key),
                "a string",
                sandbox.value,
            )
        })?,
    };
    // An empty sandbox marks a host-side interface (bridge, host veth end).
    Ok(name == ifname && !sandbox.is_empty())
}

/// The address part of "10.0.0.2/24"; the prefix must be valid for the family.
fn parse_cidr_address(cidr: &str) -> Option<IpAddr> {
    let (address, prefix) = cidr.split_once('/')?;
    let address = address.parse::<IpAddr>().ok()?.to_canonical();
    let prefix = prefix.parse::<u8>().ok()?;
    let max_prefix = if address.is_ipv4() { 32 } else { 128 };
    (prefix <= max_prefix).then_some(address)
}

/// A required string of prevResult: (its key path as written, the string).
fn required_str<'a>(
    found: Option<Found<'a, Value>>,
    parent: &str,
    name: &str,
) -> Result<(String, &'a str), PrevResultError> {
    let found = found.ok_or_else(|| ShapeError::MissingField {
        field: key_path(parent, name),
    })?;
    let key = key_path(parent, found.key);
    match found.value.as_str() {
        Some(text) => Ok((key, text)),
        None => Err(wrong_type(&key, "a string", found.value).into()),
    }
}

/// An optional array of prevResult: (its key as written, the entries).
fn optional_array<'a>(
    found: Option<Found<'a, Value>>,
    parent: &str,
) -> Result<(&'a str, &'a [Value]), PrevResultError> {
    match found {
        None => Ok(("", &[])),
        Some(Found {
            key,
            value: Value::Array(list),
        }) => Ok((key, list)),
        Some(Found { key, value }) => {
            Err(wrong_type(&key_path(parent, key), "an array", value).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prev_interfaces_fold_keys_and_skip_what_is_not_an_object() {
        let prev = serde_json::json!({"Interfaces": [
            {"Name": "cni0", "MAC": "0a:00:00:00:00:01"},
            7,
            {"name": "eth0", "mac": "0a:00:00:00:00:02", "SANDBOX": "/run/netns/x"}
        ]});
        let interfaces = PrevResult::parse(&prev, "eth0").unwrap().interfaces;
        assert_eq!(
            interfaces,
            vec![
                PrevInterface {
                    name: Some("cni0".into()),
                    mac: Some("0a:00:00:00:00:01".into()),
                    sandbox: None
                },
                PrevInterface {
                    name: Some("eth0".into()),
                    mac: Some("0a:00:00:00:00:02".into()),
                    sandbox: Some("/run/netns/x".into())
                },
            ]
        );
        assert!(!interfaces[0].in_sandbox() && interfaces[1].in_sandbox());
    }

    fn addrs(prev: serde_json::Value, ifname: &str) -> ContainerAddrs {
        PrevResult::parse(&prev, ifname).map_or_else(
            |error| panic!("prevResult {prev} must parse: {error}"),
            |prev| prev.container,
        )
    }

    #[test]
    fn prev_result_0_3_1_style_with_version() {
        let prev = serde_json::json!({
            "cniVersion": "0.3.1",
            "interfaces": [
                {"name": "cni0", "mac": "aa:bb:cc:dd:ee:ff"},
                {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:00"},
                {"name": "eth0", "mac": "aa:bb:cc:dd:ee:01", "sandbox": "/var/run/netns/c1"}
            ],
            "ips": [
                {"version": "4", "interface": 2, "address": "10.88.0.5/16", "gateway": "10.88.0.1"},
                {"version": "6", "interface": 2, "address": "fd00::5/64", "gateway": "fd00::1"}
            ]
        });
        assert_eq!(
            addrs(prev, "eth0"),
            ContainerAddrs {
                v4: Some("10.88.0.5".parse().unwrap()),
                v6: Some("fd00::5".parse().unwrap())
            },
            "both families of the sandbox interface must be found"
        );
    }

    #[test]
    fn prev_result_1_0_0_style() {
        let prev = serde_json::json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": "/proc/42/ns/net"}],
            "ips": [{"interface": 0, "address": "10.1.2.3/24"}],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        });
        assert_eq!(
            addrs(prev, "eth0"),
            ContainerAddrs {
                v4: Some("10.1.2.3".parse().unwrap()),
                v6: None
            },
            "1.0.0 result: IPv4 of the sandbox interface"
        );
    }

    #[test]
    fn prev_result_ips_without_interface_count() {
        let prev = serde_json::json!({"ips": [{"address": "2001:db8::7/64"}]});
        assert_eq!(
            addrs(prev, "eth0"),
            ContainerAddrs {
                v4: None,
                v6: Some("2001:db8::7".parse().unwrap())
            },
            "an ip without interface index counts"
        );
    }

    #[test]
    fn prev_result_host_side_interfaces_are_skipped() {
        let prev = serde_json::json!({
            "interfaces": [
                {"name": "eth0"},
                {"name": "eth0", "sandbox": ""},
                {"name": "eth0", "sandbox": "/var/run/netns/c1"}
            ],
            "ips": [
                {"interface": 0, "address": "192.0.2.1/24"},
                {"interface": 1, "address": "192.0.2.2/24"},
                {"interface": 2, "address": "192.0.2.3/24"}
            ]
        });
        assert_eq!(
            addrs(prev, "eth0").v4,
            Some("192.0.2.3".parse().unwrap()),
            "interfaces without a sandbox are host side, even with the same name"
        );
    }

    #[test]
    fn prev_result_first_address_of_each_family_wins() {
        let prev = serde_json::json!({
            "interfaces": [{"name": "eth0", "sandbox": "/x"}],
            "ips": [
                {"interface": 0, "address": "fd00::1/64"},
                {"interface": 0, "address": "10.0.0.1/24"},
                {"interface": 0, "address": "10.0.0.2/24"},
                {"interface": 0, "address": "fd00::2/64"}
            ]
        });
        assert_eq!(
            addrs(prev, "eth0"),
            ContainerAddrs {
                v4: Some("10.0.0.1".parse().unwrap()),
                v6: Some("fd00::1".parse().unwrap())
            },
            "the first address of each family must win"
        );
    }

    #[test]
    fn prev_result_no_matching_interface() {
        let prev = serde_json::json!({
            "interfaces": [{"name": "eth0", "sandbox": "/x"}, {"name": "net1", "sandbox": "/x"}],
            "ips": [
                {"interface": 0, "address": "10.0.0.1/24"},
                {"interface": 7, "address": "10.0.0.7/24"},
                {"interface": -1, "address": "10.0.0.8/24"}
            ]
        });
        assert_eq!(
            addrs(prev.clone(), "net1"),
            ContainerAddrs::default(),
            "net1 has no addresses"
        );
        assert_eq!(
            addrs(prev, "eth9"),
            ContainerAddrs::default(),
            "out-of-range and negative indexes do not point at our interface"
        );
        assert_eq!(
            addrs(serde_json::json!({}), "eth0"),
            ContainerAddrs::default(),
            "no ips at all"
        );
    }

    #[test]
    fn prev_result_malformed_entries_name_the_key() {
        let cases = [
            (serde_json::json!([]), "prevResult: expected an object"),
            (
                serde_json::json!({"ips": {}}),
                "prevResult.ips: expected an array",
            ),
            (
                serde_json::json!({"interfaces": 3}),
                "prevResult.interfaces: expected an array",
            ),
            (
                serde_json::json!({"ips": [{"address": "10.0.0.1"}]}),
                "prevResult.ips[0].address: \"10.0.0.1\" is not an address in CIDR form",
            ),
            (
                serde_json::json!({"ips": [{"address": "10.0.0.1/33"}]}),
                "prevResult.ips[0].address",
            ),
            (
                serde_json::json!({"ips": [{}]}),
                "prevResult.ips[0].address is missing",
            ),
            (
                serde_json::json!({"ips": [{"interface": "0", "address": "10.0.0.1/8"}]}),
                "prevResult.ips[0].interface: expected an integer",
            ),
            (
                serde_json::json!({"ips": [{"interface": 0.5, "address": "10.0.0.1/8"}]}),
                "prevResult.ips[0].interface: 0.5 is not an integer",
            ),
            (
                serde_json::json!({"interfaces": [{"sandbox": "/x"}], "ips": [{"interface": 0, "address": "10.0.0.1/8"}]}),
                "prevResult.interfaces[0].name is missing",
            ),
        ];
        for (prev, needle) in cases {
            let error =
                PrevResult::parse(&prev, "eth0").expect_err(&format!("{prev} must be rejected"));
            assert_eq!(error.cni_code(), code::INVALID_NETWORK_CONFIG, "{error}");
            assert!(
                error.to_string().contains(needle),
                "{error} should mention {needle:?}"
            );
        }
    }
}
