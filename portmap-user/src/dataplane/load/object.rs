//! The eBPF object this build carries, and the build id that names its
//! pinned programs.

/// The eBPF object, built by build.rs and embedded so that installing the
/// plugin is copying one file.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/portmap"));

/// [`OBJECT`] with its kfunc calls linked for the running kernel (see
/// [`kfunc`](crate::dataplane::load::kfunc)): what is loaded, never `OBJECT`
/// itself, whose calls name markers no kernel knows. Reads the kernel's
/// BTF, and a module's where vmlinux lacks its kfuncs (one pass over each
/// one's types; done by the loads that verify programs only).
///
/// `load_module`: a kfunc module that is not loaded (nf_conntrack before
/// anything on the node tracked a flow) is loaded, the way `conntrack -L`
/// loads it (see [`request_conntrack`]), so that programs loaded before
/// the node's firewall or kube-proxy started still get the kfuncs: they
/// keep what this load linked until the next build replaces them.
/// `version`, which only reports, passes `false`.
pub fn linked_for_this_kernel(
    load_module: bool,
    groups: crate::dataplane::load::kfunc::Groups,
) -> Result<crate::dataplane::load::kfunc::Linked, crate::dataplane::load::kfunc::KfuncError> {
    let btf = std::fs::read("/sys/kernel/btf/vmlinux").ok();
    let module_btf = |module: &str| {
        let path = std::path::Path::new("/sys/kernel/btf").join(module);
        std::fs::read(&path).ok().or_else(|| {
            if !load_module || module != "nf_conntrack" {
                return None;
            }
            if let Err(error) = request_conntrack() {
                log::info!("could not have the kernel load nf_conntrack: {error}");
                return None;
            }
            std::fs::read(&path).ok()
        })
    };
    crate::dataplane::load::kfunc::link_for_kernel(OBJECT, btf.as_deref(), &module_btf, groups)
}

/// Asks ctnetlink (`NFNL_SUBSYS_CTNETLINK`) for the conntrack statistics:
/// where nf_conntrack is a module not yet loaded, nfnetlink has the kernel
/// load `nf_conntrack_netlink` (and so nf_conntrack) to answer, as for
/// `conntrack -L`. Loading it tracks nothing by itself: conntrack hooks a
/// network namespace only once something there asks for it.
pub fn request_conntrack() -> Result<(), crate::node::netlink::NetlinkError> {
    use netlink_packet_core::NetlinkSerializable;

    /// `IPCTNL_MSG_CT_GET_STATS` of `NFNL_SUBSYS_CTNETLINK` (1), with its
    /// `struct nfgenmsg` (AF_UNSPEC, `NFNETLINK_V0`, resource 0).
    struct StatsRequest;
    impl NetlinkSerializable for StatsRequest {
        fn message_type(&self) -> u16 {
            (1 << 8) | 5
        }
        fn buffer_len(&self) -> usize {
            4
        }
        fn serialize(&self, buffer: &mut [u8]) {
            buffer[..4].copy_from_slice(&[0, 0, 0, 0]);
        }
    }
    let mut netlink =
        crate::node::netlink::Netlink::open(netlink_sys::protocols::NETLINK_NETFILTER)?;
    netlink.exchange(StatsRequest, false, |_, _| Ok(()))
}

/// Identifies this build's programs; part of their pin names. The FNV-1a
/// of [`OBJECT`], computed by build.rs: hashing 0.5 MB at run time cost
/// every ADD about half a millisecond.
pub fn build_id() -> u64 {
    const ID: u64 = match u64::from_str_radix(env!("PORTMAP_BUILD_ID"), 16) {
        Ok(id) => id,
        Err(_) => panic!("build.rs sets PORTMAP_BUILD_ID to 16 hex digits"),
    };
    ID
}

/// The digest of the sources [`OBJECT`] was compiled from
/// (`portmap_common::sources`), computed by build.rs: 16 hex digits.
/// `version` prints it, so a check can tell a stale object from this
/// checkout's.
pub const EBPF_SOURCES: &str = env!("PORTMAP_EBPF_SOURCES");
