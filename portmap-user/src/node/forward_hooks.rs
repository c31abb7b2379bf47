//! Whether anything is hooked at netfilter's FORWARD in this network
//! namespace, asked of nfnetlink_hook (Linux 5.14, `NFNL_SUBSYS_HOOK`): one
//! dump per family of the functions registered at `NF_INET_FORWARD`
//! (iptables' filter table, an nftables base chain of hook forward, in the
//! inet family too, which registers both). Connection tracking itself
//! hooks elsewhere (PREROUTING, INPUT, OUTPUT, POSTROUTING).
//!
//! The fast path's fallback on kernels without the conntrack kfuncs
//! reads it (`dataplane::features::fast_path_flags`): with nothing at
//! FORWARD, the fast path skips no rule. Read-only, no module is loaded
//! on purpose (nfnetlink may load nfnetlink_hook on demand where it is a
//! module, which is a read-only facility).

use netlink_packet_core::{DefaultNla, Emitable, NetlinkSerializable};
use netlink_sys::protocols::NETLINK_NETFILTER;

use crate::node::netlink::{Netlink, NetlinkError};

/// `include/uapi/linux/netfilter/nfnetlink_hook.h` and `netfilter.h`.
const NFNL_SUBSYS_HOOK: u16 = 12;
const NFNL_MSG_HOOK_GET: u16 = 0;
const NFNLA_HOOK_HOOKNUM: u16 = 1;
const NF_INET_FORWARD: u32 = 2;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
/// `struct nfgenmsg`: family, version (`NFNETLINK_V0`), resource id.
const NFGENMSG_LEN: usize = 4;
/// The message type of a hook dump's request and of each hook it reports.
const HOOK_MESSAGE: u16 = (NFNL_SUBSYS_HOOK << 8) | NFNL_MSG_HOOK_GET;

/// The dump request of the FORWARD hooks of one family: `struct
/// nfgenmsg`, then `NFNLA_HOOK_HOOKNUM` (big-endian, as nfnetlink wants).
struct ForwardHooksRequest {
    family: u8,
}

impl ForwardHooksRequest {
    fn hooknum() -> DefaultNla {
        DefaultNla::new(NFNLA_HOOK_HOOKNUM, NF_INET_FORWARD.to_be_bytes().to_vec())
    }
}

impl NetlinkSerializable for ForwardHooksRequest {
    fn message_type(&self) -> u16 {
        HOOK_MESSAGE
    }

    fn buffer_len(&self) -> usize {
        NFGENMSG_LEN + Self::hooknum().buffer_len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer[..NFGENMSG_LEN].copy_from_slice(&[self.family, 0, 0, 0]);
        Self::hooknum().emit(&mut buffer[NFGENMSG_LEN..]);
    }
}

/// How many functions are hooked at FORWARD in this network namespace,
/// IPv4 and IPv6 together. An error when nfnetlink_hook cannot answer
/// (a kernel before 5.14, or without `CONFIG_NETFILTER_NETLINK_HOOK`).
pub fn count() -> Result<u32, NetlinkError> {
    let mut netlink = Netlink::open(NETLINK_NETFILTER)?;
    let mut hooks = 0;
    for family in [NFPROTO_IPV4, NFPROTO_IPV6] {
        netlink.exchange(ForwardHooksRequest { family }, true, |kind, _| {
            if kind == HOOK_MESSAGE {
                hooks += 1;
            }
            Ok(())
        })?;
    }
    Ok(hooks)
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{
        NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    };

    use super::*;

    #[test]
    fn the_request_asks_for_the_forward_hooks_of_a_family() {
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let mut message = NetlinkMessage::new(
            header,
            NetlinkPayload::InnerMessage(ForwardHooksRequest {
                family: NFPROTO_IPV6,
            }),
        );
        message.finalize();
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        assert_eq!(bytes.len(), 28, "header, nfgenmsg, one 4-byte attribute");
        assert_eq!(
            u16::from_ne_bytes([bytes[4], bytes[5]]),
            12 << 8,
            "NFNL_SUBSYS_HOOK (12), NFNL_MSG_HOOK_GET (0)"
        );
        assert_eq!(u16::from_ne_bytes([bytes[6], bytes[7]]), 0x301);
        assert_eq!(&bytes[16..20], &[NFPROTO_IPV6, 0, 0, 0]);
        assert_eq!(u16::from_ne_bytes([bytes[20], bytes[21]]), 8);
        assert_eq!(
            u16::from_ne_bytes([bytes[22], bytes[23]]),
            NFNLA_HOOK_HOOKNUM
        );
        assert_eq!(&bytes[24..28], &[0, 0, 0, 2], "NF_INET_FORWARD, big-endian");
    }
}
