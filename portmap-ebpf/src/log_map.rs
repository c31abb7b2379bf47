//! An object with aya-log's ring buffer and nothing of the dataplane: the
//! node agent loads it with that map's pin (no program is ever loaded
//! from it), so that aya-log's `EbpfLogger` reads the ring buffer the
//! dataplane's programs write. aya-log 0.3 opens its map only from a
//! loaded object or by a program's ID, and asking the kernel for a
//! program by ID takes CAP_SYS_ADMIN, which the agent does without;
//! loading the dataplane's own object would make every one of its maps.
#![no_std]
#![no_main]

use aya_ebpf::{bindings::TC_ACT_OK, macros::classifier, programs::TcContext};
use aya_log_ebpf::info;

/// Never loaded: it only makes the object carry aya-log's map.
#[classifier]
pub fn log_map(ctx: TcContext) -> i32 {
    info!(&ctx, "never loaded");
    TC_ACT_OK
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
