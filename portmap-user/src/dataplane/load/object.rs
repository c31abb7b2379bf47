//! The eBPF object this build carries, and the build id that names its
//! pinned programs.

/// The eBPF object, built by build.rs and embedded so that installing the
/// plugin is copying one file.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/portmap"));

/// [`OBJECT`] with its kfunc calls linked for the running kernel (see
/// [`kfunc`](crate::dataplane::load::kfunc)): what is loaded, never `OBJECT`
/// itself, whose calls name markers no kernel knows. Reads the kernel's
/// BTF (one pass over its types; done by the loads that verify programs
/// only).
pub fn linked_for_this_kernel()
-> Result<crate::dataplane::load::kfunc::Linked, crate::dataplane::load::kfunc::KfuncError> {
    let btf = std::fs::read("/sys/kernel/btf/vmlinux").ok();
    crate::dataplane::load::kfunc::link_for_kernel(OBJECT, btf.as_deref())
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
