//! The floor of the bench's "what the programs cost" rows: a tc program
//! and a connect4 program that decide nothing. Attached at the hooks
//! ebpf-portmap uses (bench/src/floor.rs), they cost what the kernel
//! charges for running any program there: the hook's dispatch, the call,
//! the return. What ebpf-portmap costs beyond them is its own code.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::TC_ACT_OK,
    macros::{cgroup_sock_addr, classifier},
    programs::{SockAddrContext, TcContext},
};

/// Leaves every packet as it is.
#[classifier]
pub fn floor_tc(_ctx: TcContext) -> i32 {
    TC_ACT_OK
}

/// Allows every connect().
#[cgroup_sock_addr(connect4)]
pub fn floor_connect4(_ctx: SockAddrContext) -> i32 {
    1
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
