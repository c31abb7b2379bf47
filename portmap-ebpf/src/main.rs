//! ebpf-portmap dataplane: hostPort DNAT for traffic arriving at the node
//! (tc ingress) and reverse NAT of the replies (tc egress).
#![no_std]
#![no_main]

mod counters;
mod ct;
mod fast;
mod fib;
mod flow;
mod maps;
mod masq;
mod nat;
mod parse;
mod sock;
mod tc;
mod trace;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
