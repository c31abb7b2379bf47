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

use std::io;

const NETLINK_NETFILTER: isize = 12;
const NFNL_SUBSYS_HOOK: u16 = 15;
const NFNL_MSG_HOOK_GET: u16 = 0;
const NFNLA_HOOK_HOOKNUM: u16 = 1;
const NF_INET_FORWARD: u32 = 2;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;

/// The dump request of the FORWARD hooks of `family`: `struct nlmsghdr`,
/// `struct nfgenmsg` (version 0), then `NFNLA_HOOK_HOOKNUM` (big-endian).
fn request(family: u8, sequence: u32) -> Vec<u8> {
    let mut bytes = vec![0u8; 16];
    bytes.extend_from_slice(&[family, 0, 0, 0]);
    bytes.extend_from_slice(&8u16.to_ne_bytes());
    bytes.extend_from_slice(&NFNLA_HOOK_HOOKNUM.to_ne_bytes());
    bytes.extend_from_slice(&NF_INET_FORWARD.to_be_bytes());
    let total = bytes.len() as u32;
    bytes[0..4].copy_from_slice(&total.to_ne_bytes());
    bytes[4..6].copy_from_slice(&((NFNL_SUBSYS_HOOK << 8) | NFNL_MSG_HOOK_GET).to_ne_bytes());
    bytes[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    bytes[8..12].copy_from_slice(&sequence.to_ne_bytes());
    bytes
}

/// What one read of a dump's answer holds: hooks counted, and whether the
/// dump ended (`Err`: the kernel refused it).
fn count_hooks(buffer: &[u8], hooks: &mut u32) -> io::Result<bool> {
    let mut offset = 0;
    while offset + 16 <= buffer.len() {
        let length =
            u32::from_ne_bytes(buffer[offset..offset + 4].try_into().expect("4 bytes")) as usize;
        let kind = u16::from_ne_bytes([buffer[offset + 4], buffer[offset + 5]]);
        if length < 16 || offset + length > buffer.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "short netlink message",
            ));
        }
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let code = buffer
                    .get(offset + 16..offset + 20)
                    .map_or(0, |b| i32::from_ne_bytes(b.try_into().expect("4 bytes")));
                if code != 0 {
                    return Err(io::Error::from_raw_os_error(-code));
                }
                return Ok(true);
            }
            k if k == (NFNL_SUBSYS_HOOK << 8) | NFNL_MSG_HOOK_GET => *hooks += 1,
            _ => {}
        }
        offset += (length + 3) & !3;
    }
    Ok(false)
}

/// How many functions are hooked at FORWARD in this network namespace,
/// IPv4 and IPv6 together. An error when nfnetlink_hook cannot answer
/// (a kernel before 5.14, or without `CONFIG_NETFILTER_NETLINK_HOOK`).
pub fn count() -> io::Result<u32> {
    let mut socket = netlink_sys::Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;
    let mut hooks = 0;
    let mut buffer = vec![0u8; 32 * 1024];
    for (sequence, family) in [(1, NFPROTO_IPV4), (2, NFPROTO_IPV6)] {
        socket.send(&request(family, sequence), 0)?;
        loop {
            let length = socket.recv(&mut &mut buffer[..], 0)?;
            if count_hooks(&buffer[..length], &mut hooks)? {
                break;
            }
        }
    }
    Ok(hooks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0u8; 16];
        bytes.extend_from_slice(payload);
        let total = bytes.len() as u32;
        bytes[0..4].copy_from_slice(&total.to_ne_bytes());
        bytes[4..6].copy_from_slice(&kind.to_ne_bytes());
        bytes
    }

    #[test]
    fn the_request_asks_for_the_forward_hooks_of_a_family() {
        let bytes = request(NFPROTO_IPV6, 7);
        assert_eq!(bytes.len(), 28);
        assert_eq!(u32::from_ne_bytes(bytes[0..4].try_into().unwrap()), 28);
        assert_eq!(u16::from_ne_bytes([bytes[4], bytes[5]]), 15 << 8);
        assert_eq!(u16::from_ne_bytes([bytes[6], bytes[7]]), 0x301);
        assert_eq!(bytes[16], NFPROTO_IPV6);
        assert_eq!(&bytes[24..28], &[0, 0, 0, 2], "NF_INET_FORWARD, big-endian");
    }

    #[test]
    fn hooks_are_counted_until_the_dump_ends() {
        let hook = (NFNL_SUBSYS_HOOK << 8) | NFNL_MSG_HOOK_GET;
        let mut answer = message(hook, &[0; 8]);
        answer.extend(message(hook, &[0; 4]));
        let mut hooks = 0;
        assert!(!count_hooks(&answer, &mut hooks).unwrap(), "not done yet");
        assert_eq!(hooks, 2);
        assert!(count_hooks(&message(NLMSG_DONE, &[0; 4]), &mut hooks).unwrap());
        assert_eq!(hooks, 2);
        let refused = message(NLMSG_ERROR, &(-libc::EOPNOTSUPP).to_ne_bytes());
        let error = count_hooks(&refused, &mut hooks).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EOPNOTSUPP));
    }
}
