//! `conditionsV4`/`conditionsV6`: the iptables match arguments upstream
//! portmap appends to every DNAT rule of a configuration, parsed into the
//! conditions the programs check (`portmap_common::conditions`).
//!
//! Supported, each at most once per list (as iptables allows), each
//! negatable with a `!` before it, all of them to hold at once:
//! - `-s`/`--source`/`--src` and `-d`/`--destination`/`--dst`: an address
//!   or CIDR of the list's family (an IPv4 mask may be dotted), or a
//!   comma-separated list of up to 8, any of which matches (iptables adds
//!   one rule per address); a negated list holds one entry, as iptables
//!   requires;
//! - `-p`/`--protocol`: `tcp`, `udp` or `sctp` (or 6, 17, 132): the
//!   mappings of other protocols of the configuration take no flow;
//! - `-i`/`--in-interface`: the interface a packet arrives on, by name
//!   (no `+` wildcard), as upstream matches it when the packet comes: the
//!   entry keeps the name's id beside the index, and the index follows the
//!   name across an interface re-created or created after the ADD
//!   (`dataplane::node_maps::interface_conditions`); the node's own
//!   connections have none, as in upstream's `OUTPUT` chain.
//!
//! Refused, naming the argument: `-o`/`--out-interface` (upstream's rule
//! runs before routing in `PREROUTING`, where no packet has an output
//! interface, and in `OUTPUT` for local destinations only, where it is
//! always `lo`: it cannot mean what it says), every other match (`-m ...`)
//! and option, and anything malformed.

use std::net::IpAddr;

use portmap_common::conditions::{
    Cidr, Conditions, MAX_CIDRS, interface_id, negated as negated_bits, protocol_bit,
};
use portmap_common::{FAMILY_V4, FAMILY_V6, PROTO_SCTP, PROTO_TCP, PROTO_UDP};
use serde_json::Value;

use crate::cni::names::validate_ifname;

/// What ebpf-portmap supports, for messages.
pub const SUPPORTED: &str = "supported are [!] -s/--source and [!] -d/--destination with addresses or CIDRs of the list's family (comma-separated, up to 8), [!] -p/--protocol tcp|udp|sctp and [!] -i/--in-interface NAME, each at most once";

/// One address condition (`-s`, `-d`): any of `cidrs` matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrCondition {
    pub negated: bool,
    /// (network address, prefix length), the address already masked.
    pub cidrs: Vec<(IpAddr, u8)>,
}

/// The conditions of one list (`conditionsV4` or `conditionsV6`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionSet {
    /// The key as the configuration spells it.
    pub key: String,
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u8,
    pub source: Option<AddrCondition>,
    pub destination: Option<AddrCondition>,
    /// (negated, IP protocol number).
    pub protocol: Option<(bool, u8)>,
    /// (negated, interface name).
    pub in_interface: Option<(bool, String)>,
}

/// Why a condition is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConditionError {
    #[error("must be an array of strings (iptables arguments such as [\"-s\", \"10.0.0.0/8\"])")]
    NotAList,
    #[error("{found} is not a string")]
    NotAString { found: String },
    #[error(
        "{option:?} (the output interface) cannot be honoured: upstream's DNAT rule runs before routing (PREROUTING, where no packet has an output interface yet) and in OUTPUT only for the node's own addresses (always \"lo\"); use -i for the interface traffic arrives on"
    )]
    OutInterface { option: String },
    #[error("{option:?} is not supported")]
    Unsupported { option: String },
    #[error("{option:?} is given twice; iptables allows it once per rule")]
    Repeated { option: String },
    #[error("{option:?} needs a value after it")]
    MissingValue { option: String },
    #[error("\"!\" must come before an option, found {found:?}")]
    DanglingNegation { found: String },
    #[error("{value:?} is not an address or CIDR ({reason})")]
    BadAddress { value: String, reason: &'static str },
    #[error("{value:?} is an IPv{found} address, but this list is for IPv{expected}")]
    WrongFamily {
        value: String,
        found: u8,
        expected: u8,
    },
    #[error("{option:?} lists {count} addresses; at most {MAX_CIDRS} are supported")]
    TooManyAddresses { option: String, count: usize },
    #[error("\"! {option}\" with several addresses: iptables refuses a negated list, give one")]
    NegatedList { option: String },
    #[error("protocol {value:?} is not tcp, udp or sctp")]
    BadProtocol { value: String },
    #[error("interface {value:?}: {reason}")]
    BadInterface { value: String, reason: String },
}

/// Parses one list. `None` for a list that adds no condition (absent,
/// `null` or empty, as upstream treats them). `Err` names the index of
/// the offending argument (`conditionsV4[2]`) or the key itself.
pub fn parse(
    key: &str,
    family: u8,
    value: &Value,
) -> Result<Option<ConditionSet>, (String, ConditionError)> {
    let list = match value {
        Value::Null => return Ok(None),
        Value::Array(list) if list.is_empty() => return Ok(None),
        Value::Array(list) => list,
        _ => return Err((key.to_owned(), ConditionError::NotAList)),
    };
    let mut args = Vec::with_capacity(list.len());
    for (index, arg) in list.iter().enumerate() {
        match arg.as_str() {
            Some(text) => args.push(text),
            None => {
                return Err((
                    format!("{key}[{index}]"),
                    ConditionError::NotAString {
                        found: arg.to_string(),
                    },
                ));
            }
        }
    }
    let mut set = ConditionSet {
        key: key.to_owned(),
        family,
        source: None,
        destination: None,
        protocol: None,
        in_interface: None,
    };
    let mut index = 0;
    while index < args.len() {
        let at = |i: usize| format!("{key}[{i}]");
        let mut negated = false;
        let mut option_index = index;
        if args[index] == "!" {
            negated = true;
            option_index = index + 1;
            let Some(next) = args.get(option_index) else {
                return Err((
                    at(index),
                    ConditionError::DanglingNegation {
                        found: "the end of the list".to_owned(),
                    },
                ));
            };
            if !next.starts_with('-') {
                return Err((
                    at(option_index),
                    ConditionError::DanglingNegation {
                        found: (*next).to_owned(),
                    },
                ));
            }
        }
        let option = args[option_index];
        let error = |e| Err((at(option_index), e));
        let kind = match option {
            "-s" | "--source" | "--src" => Kind::Source,
            "-d" | "--destination" | "--dst" => Kind::Destination,
            "-p" | "--protocol" => Kind::Protocol,
            "-i" | "--in-interface" => Kind::InInterface,
            "-o" | "--out-interface" => {
                return error(ConditionError::OutInterface {
                    option: option.to_owned(),
                });
            }
            _ => {
                return error(ConditionError::Unsupported {
                    option: option.to_owned(),
                });
            }
        };
        let Some(&raw) = args.get(option_index + 1) else {
            return error(ConditionError::MissingValue {
                option: option.to_owned(),
            });
        };
        let value_at = at(option_index + 1);
        let repeated = match kind {
            Kind::Source => set.source.is_some(),
            Kind::Destination => set.destination.is_some(),
            Kind::Protocol => set.protocol.is_some(),
            Kind::InInterface => set.in_interface.is_some(),
        };
        if repeated {
            return error(ConditionError::Repeated {
                option: option.to_owned(),
            });
        }
        match kind {
            Kind::Source | Kind::Destination => {
                let condition = parse_addresses(option, raw, negated, family)
                    .map_err(|e| (value_at.clone(), e))?;
                if kind == Kind::Source {
                    set.source = Some(condition);
                } else {
                    set.destination = Some(condition);
                }
            }
            Kind::Protocol => {
                let proto = parse_protocol(raw).map_err(|e| (value_at.clone(), e))?;
                set.protocol = Some((negated, proto));
            }
            Kind::InInterface => {
                if raw.ends_with('+') {
                    return Err((
                        value_at,
                        ConditionError::BadInterface {
                            value: raw.to_owned(),
                            reason: "the \"+\" wildcard is not supported; name the interface"
                                .to_owned(),
                        },
                    ));
                }
                validate_ifname(raw).map_err(|reason| {
                    (
                        value_at.clone(),
                        ConditionError::BadInterface {
                            value: raw.to_owned(),
                            reason: reason.to_string(),
                        },
                    )
                })?;
                set.in_interface = Some((negated, raw.to_owned()));
            }
        }
        index = option_index + 2;
    }
    Ok(Some(set))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Source,
    Destination,
    Protocol,
    InInterface,
}

fn parse_addresses(
    option: &str,
    raw: &str,
    negated: bool,
    family: u8,
) -> Result<AddrCondition, ConditionError> {
    let parts: Vec<&str> = raw.split(',').collect();
    if parts.len() > MAX_CIDRS {
        return Err(ConditionError::TooManyAddresses {
            option: option.to_owned(),
            count: parts.len(),
        });
    }
    if negated && parts.len() > 1 {
        return Err(ConditionError::NegatedList {
            option: option.to_owned(),
        });
    }
    let cidrs = parts
        .iter()
        .map(|part| parse_cidr(part, family))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(AddrCondition { negated, cidrs })
}

/// An address or CIDR of `family`, the address masked to its prefix (as
/// iptables does).
fn parse_cidr(text: &str, family: u8) -> Result<(IpAddr, u8), ConditionError> {
    let bad = |reason| ConditionError::BadAddress {
        value: text.to_owned(),
        reason,
    };
    let (addr_text, prefix_text) = match text.split_once('/') {
        Some((addr, prefix)) => (addr, Some(prefix)),
        None => (text, None),
    };
    let addr: IpAddr = addr_text
        .parse()
        .map_err(|_| bad("host names are not supported; give an IP address"))?;
    let found = if addr.is_ipv4() { FAMILY_V4 } else { FAMILY_V6 };
    if found != family {
        return Err(ConditionError::WrongFamily {
            value: text.to_owned(),
            found,
            expected: family,
        });
    }
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix_text {
        None => max,
        Some(prefix) => match (prefix.parse::<u8>(), addr) {
            (Ok(len), _) if len <= max && !prefix.starts_with('+') => len,
            (Ok(_), _) => return Err(bad("the prefix length is out of range")),
            (Err(_), IpAddr::V4(_)) => {
                let mask: std::net::Ipv4Addr = prefix
                    .parse()
                    .map_err(|_| bad("the prefix is neither a length nor a dotted mask"))?;
                let bits = u32::from(mask);
                if bits.leading_ones() + bits.trailing_zeros() != 32 {
                    return Err(bad("the dotted mask is not contiguous"));
                }
                bits.leading_ones() as u8
            }
            (Err(_), IpAddr::V6(_)) => return Err(bad("the prefix length is not a number")),
        },
    };
    Ok((masked(addr, prefix), prefix))
}

fn masked(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((u32::from(v4) & mask).into())
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & mask).into())
        }
    }
}

fn parse_protocol(raw: &str) -> Result<u8, ConditionError> {
    match raw.to_ascii_lowercase().as_str() {
        "tcp" | "6" => Ok(PROTO_TCP),
        "udp" | "17" => Ok(PROTO_UDP),
        "sctp" | "132" => Ok(PROTO_SCTP),
        _ => Err(ConditionError::BadProtocol {
            value: raw.to_owned(),
        }),
    }
}

/// Four words in network order, as the maps hold addresses.
fn words(addr: IpAddr) -> [u32; 4] {
    match addr {
        IpAddr::V4(v4) => [u32::from_ne_bytes(v4.octets()), 0, 0, 0],
        IpAddr::V6(v6) => {
            let octets = v6.octets();
            let mut out = [0; 4];
            for (i, word) in out.iter_mut().enumerate() {
                *word = u32::from_ne_bytes([
                    octets[i * 4],
                    octets[i * 4 + 1],
                    octets[i * 4 + 2],
                    octets[i * 4 + 3],
                ]);
            }
            out
        }
    }
}

fn mask_words(family: u8, prefix: u8) -> [u32; 4] {
    let max: u8 = if family == FAMILY_V4 { 32 } else { 128 };
    let mut out = [0; 4];
    let mut left = u32::from(prefix.min(max));
    for word in &mut out {
        let bits = left.min(32);
        *word = u32::MAX.checked_shl(32 - bits).unwrap_or(0).to_be();
        left -= bits;
    }
    out
}

fn fill(cidrs: &mut [Cidr; MAX_CIDRS], family: u8, condition: &AddrCondition) -> u8 {
    for (slot, (addr, prefix)) in cidrs.iter_mut().zip(&condition.cidrs) {
        *slot = Cidr {
            net_be: words(*addr),
            mask_be: mask_words(family, *prefix),
        };
    }
    condition.cidrs.len() as u8
}

impl ConditionSet {
    /// The map entry the programs check. `ifindex` gives the index of the
    /// `-i` interface by name (0 when the node has none by that name now);
    /// the entry keeps the name's id, by which it is found when that
    /// index changes.
    pub fn to_map_value(&self, ifindex: impl Fn(&str) -> u32) -> Conditions {
        let mut out = Conditions::default();
        if let Some(source) = &self.source {
            out.source_len = fill(&mut out.source, self.family, source);
            if source.negated {
                out.negated |= negated_bits::SOURCE;
            }
        }
        if let Some(destination) = &self.destination {
            out.destination_len = fill(&mut out.destination, self.family, destination);
            if destination.negated {
                out.negated |= negated_bits::DESTINATION;
            }
        }
        if let Some((negated, proto)) = self.protocol {
            out.protocols = protocol_bit(proto);
            if negated {
                out.negated |= negated_bits::PROTOCOL;
            }
        }
        if let Some((negated, name)) = &self.in_interface {
            out.has_in_interface = 1;
            out.in_ifindex = ifindex(name);
            out.in_interface_id = interface_id(name.as_bytes());
            if *negated {
                out.negated |= negated_bits::IN_INTERFACE;
            }
        }
        out
    }
}

impl std::fmt::Display for ConditionSet {
    /// The conditions as iptables arguments, for logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let not = |negated: bool| if negated { "! " } else { "" };
        let mut parts = Vec::new();
        for (option, condition) in [("-s", &self.source), ("-d", &self.destination)] {
            if let Some(condition) = condition {
                let list: Vec<String> = condition
                    .cidrs
                    .iter()
                    .map(|(addr, prefix)| format!("{addr}/{prefix}"))
                    .collect();
                parts.push(format!(
                    "{}{option} {}",
                    not(condition.negated),
                    list.join(",")
                ));
            }
        }
        if let Some((negated, proto)) = self.protocol {
            let name = match proto {
                PROTO_TCP => "tcp",
                PROTO_UDP => "udp",
                _ => "sctp",
            };
            parts.push(format!("{}-p {name}", not(negated)));
        }
        if let Some((negated, name)) = &self.in_interface {
            parts.push(format!("{}-i {name}", not(*negated)));
        }
        write!(f, "{}: {}", self.key, parts.join(" "))
    }
}
