//! The cheap test: does this network namespace hold any of upstream
//! `portmap`'s state? Asked on every ADD and DEL, so it runs no process:
//! - iptables-nft and the nftables backend: one nfnetlink GET per object
//!   (`CNI-HOSTPORT-DNAT` in the `nat` tables, the `cni_hostport` tables),
//!   only when nf_tables is in the kernel already ([`nf_tables_present`]):
//!   a request to a subsystem not loaded would load its module;
//! - legacy iptables: `/proc/net/ip{,6}_tables_names` names the legacy
//!   tables of this namespace; only when `nat` is there, the table's rules
//!   are read with `getsockopt(IPT_SO_GET_ENTRIES)` and searched for the
//!   chain's name (user chains are stored under their name).
//!
//! An answer it cannot read counts as "there may be state": the full read
//! (which runs the tools) decides then.

use std::io;

use super::{Backend, Family, Source};

const NETLINK_NETFILTER: isize = 12;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;

/// Every place upstream may have state in this namespace, cheaply tested.
pub fn sources() -> Vec<Source> {
    let mut found = Vec::new();
    if nf_tables_present() {
        match nft_sources() {
            Ok(mut nft) => found.append(&mut nft),
            Err(error) => {
                log::debug!(
                    "upstream portmap probe over nfnetlink failed ({error}); reading the tables instead"
                );
                for family in [Family::V4, Family::V6] {
                    found.push(Source {
                        backend: Backend::IptablesNft,
                        family,
                    });
                    found.push(Source {
                        backend: Backend::Nftables,
                        family,
                    });
                }
            }
        }
    }
    for family in [Family::V4, Family::V6] {
        if legacy_has_chain(family) {
            found.push(Source {
                backend: Backend::IptablesLegacy,
                family,
            });
        }
    }
    found
}

/// Whether nf_tables is in the running kernel, so an nfnetlink request
/// loads nothing: a loaded module has `/sys/module/nf_tables`; a kernel
/// without loadable modules (no `/proc/modules`) has nothing to load (and
/// nf_tables built in, or no nfnetlink socket at all); a built-in one is
/// listed in `modules.builtin`. A module not loaded holds no state.
fn nf_tables_present() -> bool {
    if std::path::Path::new("/sys/module/nf_tables").exists()
        || !std::path::Path::new("/proc/modules").exists()
    {
        return true;
    }
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    std::fs::read_to_string(format!("/lib/modules/{}/modules.builtin", release.trim()))
        .is_ok_and(|list| list.lines().any(|line| line.ends_with("/nf_tables.ko")))
}

fn nft_sources() -> io::Result<Vec<Source>> {
    let mut socket = netlink_sys::Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;
    // The four questions in one datagram (the kernel answers each message
    // of it in turn): one send, and the answers in as few reads.
    let mut asked = Vec::new();
    let mut batch = Vec::new();
    for family in [Family::V4, Family::V6] {
        let proto = match family {
            Family::V4 => NFPROTO_IPV4,
            Family::V6 => NFPROTO_IPV6,
        };
        let sequence = asked.len() as u32 + 1;
        batch.extend(request(
            NFT_MSG_GETCHAIN,
            proto,
            sequence,
            &[
                (NFTA_CHAIN_TABLE, "nat"),
                (NFTA_CHAIN_NAME, super::iptables::TOP_DNAT_CHAIN),
            ],
        ));
        asked.push((
            Source {
                backend: Backend::IptablesNft,
                family,
            },
            NFT_MSG_NEWCHAIN,
        ));
        let sequence = asked.len() as u32 + 1;
        batch.extend(request(
            NFT_MSG_GETTABLE,
            proto,
            sequence,
            &[(NFTA_TABLE_NAME, super::nft::TABLE)],
        ));
        asked.push((
            Source {
                backend: Backend::Nftables,
                family,
            },
            NFT_MSG_NEWTABLE,
        ));
    }
    socket.send(&batch, 0)?;
    let found = answers(&mut socket, &asked)?;
    Ok(asked
        .iter()
        .zip(found)
        .filter_map(|((source, _), found)| found.then_some(*source))
        .collect())
}

/// Reads until every question (sequence `i + 1` is `asked[i]`) has its
/// acknowledgement: whether its object came back (the NEW message type
/// asked for) or the kernel said ENOENT.
fn answers(socket: &mut netlink_sys::Socket, asked: &[(Source, u16)]) -> io::Result<Vec<bool>> {
    let mut found = vec![false; asked.len()];
    let mut done = vec![false; asked.len()];
    let mut buffer = vec![0u8; 16 * 1024];
    while done.iter().any(|d| !d) {
        let length = socket.recv(&mut &mut buffer[..], 0)?;
        let mut offset = 0;
        while offset + 16 <= length {
            let word = |at: usize| {
                u32::from_ne_bytes(
                    buffer[offset + at..offset + at + 4]
                        .try_into()
                        .expect("4 bytes"),
                )
            };
            let message_length = word(0) as usize;
            let kind = u16::from_ne_bytes([buffer[offset + 4], buffer[offset + 5]]);
            let index = (word(8) as usize).wrapping_sub(1);
            if message_length < 16 || offset + message_length > length {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "short netlink message",
                ));
            }
            if let Some((_, answer)) = asked.get(index) {
                if kind == NLMSG_ERROR {
                    let code = i32::from_ne_bytes(
                        buffer[offset + 16..offset + 20]
                            .try_into()
                            .expect("4 bytes"),
                    );
                    if code != 0 && -code != libc::ENOENT {
                        return Err(io::Error::from_raw_os_error(-code));
                    }
                    done[index] = true;
                } else if kind == (NFNL_SUBSYS_NFTABLES << 8) | answer {
                    found[index] = true;
                }
            }
            offset += (message_length + 3) & !3;
        }
    }
    Ok(found)
}

/// An nfnetlink request: `struct nlmsghdr`, `struct nfgenmsg`, then the
/// string attributes (NUL-terminated, padded to 4 bytes).
fn request(message: u16, family: u8, sequence: u32, attributes: &[(u16, &str)]) -> Vec<u8> {
    let mut bytes = vec![0u8; 16];
    bytes.extend_from_slice(&[family, 0, 0, 0]);
    for (kind, value) in attributes {
        let length = 4 + value.len() + 1;
        bytes.extend_from_slice(&(length as u16).to_ne_bytes());
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.extend_from_slice(value.as_bytes());
        bytes.push(0);
        while !bytes.len().is_multiple_of(4) {
            bytes.push(0);
        }
    }
    let total = bytes.len() as u32;
    bytes[0..4].copy_from_slice(&total.to_ne_bytes());
    bytes[4..6].copy_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | message).to_ne_bytes());
    bytes[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    bytes[8..12].copy_from_slice(&sequence.to_ne_bytes());
    bytes
}

/// `struct ipt_getinfo` (and `ip6t_getinfo`, the same layout).
#[repr(C)]
struct GetInfo {
    name: [u8; 32],
    valid_hooks: u32,
    hook_entry: [u32; 5],
    underflow: [u32; 5],
    num_entries: u32,
    size: u32,
}

const SO_GET_INFO: libc::c_int = 64;
const SO_GET_ENTRIES: libc::c_int = 65;
/// `offsetof(struct ipt_get_entries, entrytable)`: the entries hold 64-bit
/// counters, so they start 8-byte aligned after `name[32]` and `size`.
const ENTRIES_OFFSET: usize = 40;

/// Whether the legacy `nat` table of `family` in this namespace has
/// upstream's chain. Never loads a module: the table must already be listed.
fn legacy_has_chain(family: Family) -> bool {
    let names = match family {
        Family::V4 => "/proc/net/ip_tables_names",
        Family::V6 => "/proc/net/ip6_tables_names",
    };
    let listed = std::fs::read_to_string(names)
        .is_ok_and(|text| text.lines().any(|line| line.trim() == "nat"));
    if !listed {
        return false;
    }
    match legacy_nat_entries(family) {
        Ok(entries) => contains(&entries, super::iptables::TOP_DNAT_CHAIN.as_bytes()),
        Err(error) => {
            log::debug!(
                "legacy {family} nat table not readable ({error}); reading it with the tools"
            );
            true
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn legacy_nat_entries(family: Family) -> io::Result<Vec<u8>> {
    let (domain, level) = match family {
        Family::V4 => (libc::AF_INET, libc::IPPROTO_IP),
        Family::V6 => (libc::AF_INET6, libc::IPPROTO_IPV6),
    };
    // SAFETY: plain socket call; the descriptor is closed below.
    let fd = unsafe {
        libc::socket(
            domain,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::IPPROTO_RAW,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let result = (|| {
        let mut info = GetInfo {
            name: [0; 32],
            valid_hooks: 0,
            hook_entry: [0; 5],
            underflow: [0; 5],
            num_entries: 0,
            size: 0,
        };
        info.name[..3].copy_from_slice(b"nat");
        let mut length = std::mem::size_of::<GetInfo>() as libc::socklen_t;
        // SAFETY: `info` is a valid, writable `ipt_getinfo` of `length` bytes.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                level,
                SO_GET_INFO,
                (&raw mut info).cast(),
                &raw mut length,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut entries = vec![0u8; ENTRIES_OFFSET + info.size as usize];
        entries[..3].copy_from_slice(b"nat");
        entries[32..36].copy_from_slice(&info.size.to_ne_bytes());
        let mut length = entries.len() as libc::socklen_t;
        // SAFETY: `entries` is a writable `ipt_get_entries` of `length` bytes.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                level,
                SO_GET_ENTRIES,
                entries.as_mut_ptr().cast(),
                &raw mut length,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(entries)
    })();
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_request_is_laid_out_as_nfnetlink_expects() {
        let bytes = request(
            NFT_MSG_GETCHAIN,
            NFPROTO_IPV4,
            7,
            &[(NFTA_CHAIN_TABLE, "nat")],
        );
        // 16 header + 4 nfgenmsg + 4 attribute header + "nat\0".
        assert_eq!(bytes.len(), 28);
        assert_eq!(u32::from_ne_bytes(bytes[0..4].try_into().unwrap()), 28);
        assert_eq!(u16::from_ne_bytes([bytes[4], bytes[5]]), 0x0a04);
        assert_eq!(u16::from_ne_bytes([bytes[6], bytes[7]]), 5);
        assert_eq!(u32::from_ne_bytes(bytes[8..12].try_into().unwrap()), 7);
        assert_eq!(bytes[16], NFPROTO_IPV4);
        assert_eq!(u16::from_ne_bytes([bytes[20], bytes[21]]), 8);
        assert_eq!(&bytes[24..28], b"nat\0");
        let padded = request(
            NFT_MSG_GETTABLE,
            NFPROTO_IPV6,
            1,
            &[(NFTA_TABLE_NAME, "cni_hostport")],
        );
        assert_eq!(padded.len() % 4, 0);
        assert_eq!(
            u16::from_ne_bytes([padded[20], padded[21]]),
            17,
            "length without padding"
        );
    }

    #[test]
    fn the_getinfo_layout_matches_the_kernels() {
        assert_eq!(std::mem::size_of::<GetInfo>(), 84);
    }
}
