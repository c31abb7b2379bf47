//! The nftables tables and chains of this network namespace, asked of
//! nf_tables (one dump over every family):
//!
//! - [`firewalld`]: whether firewalld keeps its ruleset here (its `inet
//!   firewalld` table). firewalld's FORWARD chain accepts flows conntrack
//!   holds as DNAT and judges the rest by its zones, so `status` says what
//!   that means for flows translated in tc (see README, "Firewalls").
//! - [`nat_hooked`]: per family, whether netfilter's NAT applies a
//!   conntrack entry's NAT here, which translation by netfilter (`knat` in
//!   the eBPF crate) needs. Two things must hold. nf_nat's hooks: it
//!   registers them for a family once any nat chain or table of it exists
//!   (an nftables base chain of type nat, inet for both families,
//!   iptables-nft's nat table among them; iptables-legacy's nat table,
//!   named in `/proc/net/ip_tables_names`). And conntrack's own hooks,
//!   which a namespace gets only once a rule there uses conntrack (an
//!   nftables `ct`, `nat`, `masq` or `redir` expression, or an iptables
//!   match or target through the compat layer, `-m conntrack`,
//!   `MASQUERADE`): a nat chain alone tracks nothing, and the node then
//!   answers a packet for its own host port with a RST (seen: an empty
//!   nat chain). kube-proxy, firewalld, podman and Docker have both.
//!   (nfnetlink_hook would name the hook functions directly, but kernels
//!   without `CONFIG_NETFILTER_NETLINK_HOOK` have none, this project's VM
//!   among them.)
//!
//! Read-only; nothing is loaded on purpose (a namespace where nothing
//! uses nftables answers with no table).

use netlink_packet_core::{NetlinkSerializable, NlaBuffer, NlasIterator};
use netlink_sys::protocols::NETLINK_NETFILTER;

use crate::node::netlink::{Netlink, NetlinkError};

/// `include/uapi/linux/netfilter/nfnetlink.h` and `nf_tables.h`.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_GETRULE: u16 = 7;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFPROTO_UNSPEC: u8 = 0;
const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
/// `struct nfgenmsg`: family, version (`NFNETLINK_V0`), resource id.
const NFGENMSG_LEN: usize = 4;

/// The name of firewalld's table (family `inet`, nftables backend).
pub const FIREWALLD_TABLE: &str = "firewalld";

/// The dump request of every table (`NFT_MSG_GETTABLE`) or chain
/// (`NFT_MSG_GETCHAIN`) of every family.
struct DumpRequest(u16);

impl NetlinkSerializable for DumpRequest {
    fn message_type(&self) -> u16 {
        (NFNL_SUBSYS_NFTABLES << 8) | self.0
    }

    fn buffer_len(&self) -> usize {
        NFGENMSG_LEN
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer[..NFGENMSG_LEN].copy_from_slice(&[NFPROTO_UNSPEC, 0, 0, 0]);
    }
}

/// The attributes of a dump record (`struct nfgenmsg`, then attributes),
/// as (type, value); `None` for a record cut short.
fn attributes_of(payload: &[u8]) -> Option<Vec<(u16, &[u8])>> {
    NlasIterator::new(payload.get(NFGENMSG_LEN..)?)
        .map(|nla| nla.map(parts))
        .collect::<Result<_, _>>()
        .ok()
}

/// A string attribute's text (up to its NUL).
fn text(value: &[u8]) -> &[u8] {
    value.split(|b| *b == 0).next().unwrap_or(value)
}

/// The family and name of the table a `NFT_MSG_NEWTABLE` message (one
/// record of the dump) describes.
fn table_of(payload: &[u8]) -> Option<(u8, String)> {
    let family = *payload.first()?;
    attributes_of(payload)?
        .into_iter()
        .find(|(kind, _)| *kind == NFTA_TABLE_NAME)
        .map(|(_, value)| (family, String::from_utf8_lossy(text(value)).into_owned()))
}

/// The family of the chain a `NFT_MSG_NEWCHAIN` message describes, if it
/// is a base chain (hooked) of type nat.
fn nat_chain_family(payload: &[u8]) -> Option<u8> {
    let family = *payload.first()?;
    let attributes = attributes_of(payload)?;
    let hooked = attributes.iter().any(|(kind, _)| *kind == NFTA_CHAIN_HOOK);
    let nat = attributes
        .iter()
        .any(|(kind, value)| *kind == NFTA_CHAIN_TYPE && text(value) == b"nat");
    (hooked && nat).then_some(family)
}

/// Whether a `NFT_MSG_NEWRULE` message's rule has an expression that
/// uses conntrack (see the module), and its family.
fn conntrack_rule_family(payload: &[u8]) -> Option<u8> {
    let family = *payload.first()?;
    let expressions = attributes_of(payload)?
        .into_iter()
        .find(|(kind, _)| *kind == NFTA_RULE_EXPRESSIONS)?
        .1;
    let uses = nested(expressions)
        .filter(|(kind, _)| *kind == NFTA_LIST_ELEM)
        .any(|(_, element)| {
            nested(element).any(|(kind, value)| {
                kind == NFTA_EXPR_NAME
                    && matches!(
                        text(value),
                        b"ct" | b"nat" | b"masq" | b"redir" | b"match" | b"target"
                    )
            })
        });
    uses.then_some(family)
}

/// The attributes nested in `value`, as (type, value), up to one cut
/// short.
fn nested(value: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    NlasIterator::new(value).map_while(Result::ok).map(parts)
}

/// An attribute's type (without the nested and byte-order flags) and
/// value, borrowed from the record it was read from.
fn parts(nla: NlaBuffer<&[u8]>) -> (u16, &[u8]) {
    let (kind, len) = (nla.kind(), usize::from(nla.length()));
    // new_checked held `len` within the buffer, and at least the header.
    (kind, &nla.into_inner()[4..len])
}

/// Per family (IPv4, IPv6), from an nftables dump record's family: which
/// slots it stands for (`inet` both).
fn slots(family: u8) -> [bool; 2] {
    match family {
        NFPROTO_INET => [true, true],
        NFPROTO_IPV4 => [true, false],
        NFPROTO_IPV6 => [false, true],
        _ => [false, false],
    }
}

/// Per family (IPv4, IPv6), whether netfilter's NAT applies a conntrack
/// entry's NAT in this network namespace (see the module): nf_nat's
/// hooks (an nftables nat chain of the family, or `inet`, or
/// iptables-legacy's nat table) and conntrack's (an nftables rule of the
/// family that uses conntrack, or iptables-legacy's nat table).
pub fn nat_hooked() -> Result<[bool; 2], NetlinkError> {
    let mut netlink = Netlink::open(NETLINK_NETFILTER)?;
    let (mut nat, mut tracked) = ([false; 2], [false; 2]);
    netlink.exchange(DumpRequest(NFT_MSG_GETCHAIN), true, |kind, payload| {
        if kind == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN
            && let Some(family) = nat_chain_family(payload)
        {
            for (slot, of) in nat.iter_mut().zip(slots(family)) {
                *slot |= of;
            }
        }
        Ok(())
    })?;
    if nat.contains(&true) {
        netlink.exchange(DumpRequest(NFT_MSG_GETRULE), true, |kind, payload| {
            if kind == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE
                && let Some(family) = conntrack_rule_family(payload)
            {
                for (slot, of) in tracked.iter_mut().zip(slots(family)) {
                    *slot |= of;
                }
            }
            Ok(())
        })?;
    }
    let mut hooked = [nat[0] && tracked[0], nat[1] && tracked[1]];
    // iptables-legacy: the tables in use in this namespace (the files
    // exist only where its modules are loaded); its nat table tracks.
    for (slot, names) in hooked
        .iter_mut()
        .zip(["/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"])
    {
        *slot |= std::fs::read_to_string(names)
            .is_ok_and(|names| names.lines().any(|name| name == "nat"));
    }
    Ok(hooked)
}

/// The tables of this network namespace, as (family, name).
pub fn tables() -> Result<Vec<(u8, String)>, NetlinkError> {
    let mut netlink = Netlink::open(NETLINK_NETFILTER)?;
    let mut tables = Vec::new();
    netlink.exchange(DumpRequest(NFT_MSG_GETTABLE), true, |kind, payload| {
        if kind == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWTABLE {
            tables.extend(table_of(payload));
        }
        Ok(())
    })?;
    Ok(tables)
}

/// Whether firewalld's table is in this network namespace.
pub fn firewalld() -> Result<bool, NetlinkError> {
    Ok(tables()?
        .iter()
        .any(|(family, name)| *family == NFPROTO_INET && name == FIREWALLD_TABLE))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table record as nf_tables sends it: nfgenmsg, then the name
    /// (NUL-terminated, padded to 4) and a 4-byte flags attribute.
    fn record(family: u8, name: &str) -> Vec<u8> {
        let mut bytes = vec![family, 0, 0, 0];
        let value_len = name.len() + 1;
        bytes.extend_from_slice(&((4 + value_len) as u16).to_ne_bytes());
        bytes.extend_from_slice(&NFTA_TABLE_NAME.to_ne_bytes());
        bytes.extend_from_slice(name.as_bytes());
        bytes.push(0);
        bytes.resize(bytes.len().next_multiple_of(4), 0);
        bytes.extend_from_slice(&8u16.to_ne_bytes());
        bytes.extend_from_slice(&2u16.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_be_bytes());
        bytes
    }

    #[test]
    fn a_table_record_gives_its_family_and_name() {
        assert_eq!(
            table_of(&record(NFPROTO_INET, FIREWALLD_TABLE)),
            Some((NFPROTO_INET, "firewalld".to_owned()))
        );
        assert_eq!(
            table_of(&record(2, "filter")),
            Some((2, "filter".to_owned()))
        );
    }

    #[test]
    fn a_record_without_a_name_or_cut_short_gives_nothing() {
        assert_eq!(table_of(&[NFPROTO_INET, 0, 0, 0]), None);
        let mut cut = record(NFPROTO_INET, FIREWALLD_TABLE);
        cut.truncate(9);
        assert_eq!(table_of(&cut), None);
        assert_eq!(table_of(&[]), None);
    }

    #[test]
    fn the_request_dumps_every_family() {
        let request = DumpRequest(NFT_MSG_GETTABLE);
        assert_eq!(request.message_type(), 10 << 8 | 1);
        assert_eq!(DumpRequest(NFT_MSG_GETCHAIN).message_type(), 10 << 8 | 4);
        let mut bytes = [0xff; NFGENMSG_LEN];
        request.serialize(&mut bytes);
        assert_eq!(bytes, [0, 0, 0, 0]);
    }

    /// A chain record: nfgenmsg, a nested hook attribute (base chains
    /// only) and its type.
    fn chain(family: u8, hooked: bool, kind: &str) -> Vec<u8> {
        let mut bytes = vec![family, 0, 0, 0];
        let mut attribute = |kind: u16, value: &[u8]| {
            bytes.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
            bytes.extend_from_slice(&kind.to_ne_bytes());
            bytes.extend_from_slice(value);
            bytes.resize(bytes.len().next_multiple_of(4), 0);
        };
        if hooked {
            // NLA_F_NESTED, as nf_tables sets it.
            attribute(NFTA_CHAIN_HOOK | 0x8000, &[8, 0, 1, 0, 0, 0, 0, 0]);
        }
        let mut name = kind.as_bytes().to_vec();
        name.push(0);
        attribute(NFTA_CHAIN_TYPE, &name);
        bytes
    }

    #[test]
    fn only_a_base_chain_of_type_nat_hooks_nat() {
        assert_eq!(
            nat_chain_family(&chain(NFPROTO_INET, true, "nat")),
            Some(NFPROTO_INET)
        );
        assert_eq!(
            nat_chain_family(&chain(NFPROTO_IPV6, true, "nat")),
            Some(NFPROTO_IPV6)
        );
        assert_eq!(nat_chain_family(&chain(NFPROTO_IPV4, true, "filter")), None);
        assert_eq!(
            nat_chain_family(&chain(NFPROTO_IPV4, false, "nat")),
            None,
            "a regular chain hooks nothing"
        );
        assert_eq!(nat_chain_family(&[NFPROTO_IPV4, 0]), None);
    }

    /// A rule record whose expressions are named `names`.
    fn rule(family: u8, names: &[&str]) -> Vec<u8> {
        let attribute = |kind: u16, value: &[u8]| {
            let mut bytes = Vec::new();
            bytes.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
            bytes.extend_from_slice(&kind.to_ne_bytes());
            bytes.extend_from_slice(value);
            bytes.resize(bytes.len().next_multiple_of(4), 0);
            bytes
        };
        let mut list = Vec::new();
        for name in names {
            let mut text = name.as_bytes().to_vec();
            text.push(0);
            list.extend(attribute(
                NFTA_LIST_ELEM | 0x8000,
                &attribute(NFTA_EXPR_NAME, &text),
            ));
        }
        let mut bytes = vec![family, 0, 0, 0];
        bytes.extend(attribute(NFTA_RULE_EXPRESSIONS | 0x8000, &list));
        bytes
    }

    #[test]
    fn a_rule_tracks_when_an_expression_uses_conntrack() {
        assert_eq!(
            conntrack_rule_family(&rule(NFPROTO_IPV4, &["meta", "cmp", "ct", "cmp"])),
            Some(NFPROTO_IPV4)
        );
        assert_eq!(
            conntrack_rule_family(&rule(NFPROTO_INET, &["masq"])),
            Some(NFPROTO_INET)
        );
        // iptables-nft's compat: `-m conntrack`, `-j MASQUERADE` as xt.
        assert_eq!(
            conntrack_rule_family(&rule(NFPROTO_IPV6, &["match"])),
            Some(NFPROTO_IPV6)
        );
        // A jump to a chain, a counter: nothing tracked.
        assert_eq!(
            conntrack_rule_family(&rule(NFPROTO_IPV4, &["counter", "immediate"])),
            None
        );
        assert_eq!(conntrack_rule_family(&[NFPROTO_IPV4, 0, 0, 0]), None);
        assert_eq!(slots(NFPROTO_INET), [true, true]);
        assert_eq!(slots(NFPROTO_IPV6), [false, true]);
    }
}
