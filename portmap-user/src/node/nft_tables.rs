//! The nftables tables of this network namespace, asked of nf_tables (one
//! `NFT_MSG_GETTABLE` dump over every family): whether firewalld keeps its
//! ruleset here (its `inet firewalld` table). firewalld's FORWARD chain
//! accepts flows conntrack holds as DNAT and judges the rest by its zones,
//! and a hostPort flow this dataplane translates is no DNAT to netfilter,
//! so `status` says what that means on the node (see README, "Firewalls").
//! Read-only; nothing is loaded on purpose (a namespace where nothing
//! uses nftables answers with no table).

use netlink_packet_core::NetlinkSerializable;
use netlink_sys::protocols::NETLINK_NETFILTER;

use crate::node::netlink::{Netlink, NetlinkError};

/// `include/uapi/linux/netfilter/nfnetlink.h` and `nf_tables.h`.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NFTA_TABLE_NAME: u16 = 1;
const NFPROTO_UNSPEC: u8 = 0;
const NFPROTO_INET: u8 = 1;
/// `struct nfgenmsg`: family, version (`NFNETLINK_V0`), resource id.
const NFGENMSG_LEN: usize = 4;

/// The name of firewalld's table (family `inet`, nftables backend).
pub const FIREWALLD_TABLE: &str = "firewalld";

/// The dump request of every table of every family.
struct TablesRequest;

impl NetlinkSerializable for TablesRequest {
    fn message_type(&self) -> u16 {
        (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE
    }

    fn buffer_len(&self) -> usize {
        NFGENMSG_LEN
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer[..NFGENMSG_LEN].copy_from_slice(&[NFPROTO_UNSPEC, 0, 0, 0]);
    }
}

/// The family and name of the table a `NFT_MSG_NEWTABLE` message (one
/// record of the dump: `struct nfgenmsg`, then attributes) describes.
fn table_of(payload: &[u8]) -> Option<(u8, String)> {
    let family = *payload.first()?;
    let mut attributes = payload.get(NFGENMSG_LEN..)?;
    while attributes.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([attributes[0], attributes[1]]));
        // The type's top bits are flags (nested, byte order).
        let kind = u16::from_ne_bytes([attributes[2], attributes[3]]) & 0x3fff;
        if len < 4 || len > attributes.len() {
            return None;
        }
        if kind == NFTA_TABLE_NAME {
            let value = &attributes[4..len];
            let name = value.split(|b| *b == 0).next().unwrap_or(value);
            return Some((family, String::from_utf8_lossy(name).into_owned()));
        }
        attributes = attributes.get(len.next_multiple_of(4)..).unwrap_or(&[]);
    }
    None
}

/// The tables of this network namespace, as (family, name).
pub fn tables() -> Result<Vec<(u8, String)>, NetlinkError> {
    let mut netlink = Netlink::open(NETLINK_NETFILTER)?;
    let mut tables = Vec::new();
    netlink.exchange(TablesRequest, true, |kind, payload| {
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
        let request = TablesRequest;
        assert_eq!(request.message_type(), 10 << 8 | 1);
        let mut bytes = [0xff; NFGENMSG_LEN];
        request.serialize(&mut bytes);
        assert_eq!(bytes, [0, 0, 0, 0]);
    }
}
