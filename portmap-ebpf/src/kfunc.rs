//! The kernel's conntrack kfuncs, as raw call instructions that userspace
//! links before loading (see [`portmap_common::kfunc`]): each call carries
//! its kfunc's marker, which becomes the kfunc's BTF ID, or `r0 = 0` on a
//! kernel without it (a lookup or allocation that finds or makes nothing).
//! Used by `confirm` (lookup, timeout, release) and `knat` (allocation,
//! NAT, insertion, and the lookup and release).

use core::arch::asm;

use portmap_common::kfunc;

use crate::maps::CtOpts;

/// `bpf_skb_ct_lookup(skb, tuple, tuple_len, opts, CT_OPTS_LEN)`: a
/// referenced `struct nf_conn *`, or null.
///
/// # Safety
/// `skb` is the program's context; `tuple` points to `tuple_len` readable
/// bytes and `opts` to `CT_OPTS_LEN` writable ones; a non-null result is
/// released exactly once with [`ct_release`] and not used after.
#[inline(always)]
pub unsafe fn skb_ct_lookup(
    skb: *mut core::ffi::c_void,
    tuple: *mut u32,
    tuple_len: u32,
    opts: *mut CtOpts,
) -> *mut core::ffi::c_void {
    let ct: *mut core::ffi::c_void;
    // SAFETY: the caller's contract; a call clobbers r1-r5 and returns in
    // r0, as declared.
    unsafe {
        asm!(
            ".quad {insn}",
            insn = const kfunc::call_insn(kfunc::CT_LOOKUP.marker),
            inlateout("r1") skb => _,
            inlateout("r2") tuple => _,
            inlateout("r3") u64::from(tuple_len) => _,
            inlateout("r4") opts => _,
            inlateout("r5") u64::from(kfunc::CT_OPTS_LEN) => _,
            lateout("r0") ct,
        );
    }
    ct
}

/// `bpf_skb_ct_alloc(skb, tuple, tuple_len, opts, CT_OPTS_LEN)`: a new
/// entry for the tuple (its original direction), not yet in the table, or
/// null (the table full, memory short, an entry of the tuple in the
/// table, or the kfunc missing).
///
/// # Safety
/// As [`skb_ct_lookup`]; a non-null result is consumed exactly once by
/// [`ct_insert_entry`] (an allocation cannot be freed otherwise).
#[inline(always)]
pub unsafe fn skb_ct_alloc(
    skb: *mut core::ffi::c_void,
    tuple: *mut u32,
    tuple_len: u32,
    opts: *mut CtOpts,
) -> *mut core::ffi::c_void {
    let ct: *mut core::ffi::c_void;
    // SAFETY: as in skb_ct_lookup.
    unsafe {
        asm!(
            ".quad {insn}",
            insn = const kfunc::call_insn(kfunc::CT_ALLOC.marker),
            inlateout("r1") skb => _,
            inlateout("r2") tuple => _,
            inlateout("r3") u64::from(tuple_len) => _,
            inlateout("r4") opts => _,
            inlateout("r5") u64::from(kfunc::CT_OPTS_LEN) => _,
            lateout("r0") ct,
        );
    }
    ct
}

/// `bpf_ct_set_nat_info(ct, addr, port, manip)`: the NAT of an allocated
/// entry (`manip` 1, `NF_NAT_MANIP_DST`: its original direction's
/// destination becomes `addr`, a `union nf_inet_addr`, and `port`, in host
/// order). Returns 0 or a negative errno.
///
/// # Safety
/// `ct` is an allocation [`skb_ct_alloc`] returned, not yet inserted;
/// `addr` points to 16 readable bytes.
#[inline(always)]
pub unsafe fn ct_set_nat_info(
    ct: *mut core::ffi::c_void,
    addr: *mut u32,
    port: u16,
    manip: u32,
) -> i64 {
    let result: i64;
    // SAFETY: as in skb_ct_lookup.
    unsafe {
        asm!(
            ".quad {insn}",
            insn = const kfunc::call_insn(kfunc::CT_SET_NAT.marker),
            inlateout("r1") ct => _,
            inlateout("r2") addr => _,
            inlateout("r3") u64::from(port) => _,
            inlateout("r4") u64::from(manip) => _,
            lateout("r5") _,
            lateout("r0") result,
        );
    }
    result
}

/// `bpf_ct_insert_entry(ct)`: inserts an allocation, which it consumes
/// whatever the outcome; a reference to the inserted entry, or null (an
/// entry of the tuple already there).
///
/// # Safety
/// `ct` is an allocation [`skb_ct_alloc`] returned, inserted once; a
/// non-null result is released exactly once with [`ct_release`].
#[inline(always)]
pub unsafe fn ct_insert_entry(ct: *mut core::ffi::c_void) -> *mut core::ffi::c_void {
    let inserted: *mut core::ffi::c_void;
    // SAFETY: as in skb_ct_lookup.
    unsafe {
        asm!(
            ".quad {insn}",
            insn = const kfunc::call_insn(kfunc::CT_INSERT.marker),
            inlateout("r1") ct => _,
            lateout("r2") _,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
            lateout("r0") inserted,
        );
    }
    inserted
}

/// `bpf_ct_change_timeout(ct, timeout_ms)`.
///
/// # Safety
/// `ct` is a reference [`skb_ct_lookup`] returned, not yet released.
#[inline(always)]
pub unsafe fn ct_change_timeout(ct: *mut core::ffi::c_void, timeout_ms: u32) {
    // SAFETY: the caller's contract; clobbers as a call does.
    unsafe {
        asm!(
            ".quad {insn}",
            insn = const kfunc::call_insn(kfunc::CT_CHANGE_TIMEOUT.marker),
            inlateout("r1") ct => _,
            inlateout("r2") u64::from(timeout_ms) => _,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
            lateout("r0") _,
        );
    }
}

/// `bpf_ct_release(ct)`.
///
/// # Safety
/// `ct` is a reference [`skb_ct_lookup`] or [`ct_insert_entry`]
/// returned, released once.
#[inline(always)]
pub unsafe fn ct_release(ct: *mut core::ffi::c_void) {
    // SAFETY: the caller's contract; clobbers as a call does.
    unsafe {
        asm!(
            ".quad {insn}",
            insn = const kfunc::call_insn(kfunc::CT_RELEASE.marker),
            inlateout("r1") ct => _,
            lateout("r2") _,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
            lateout("r0") _,
        );
    }
}
