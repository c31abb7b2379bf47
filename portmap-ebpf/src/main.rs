//! ebpf-portmap dataplane: hostPort DNAT for traffic arriving at the node
//! (tc ingress), reverse NAT of the replies (tc egress), and the cgroup
//! socket hooks for connections that start on the node.
//!
//! A packet goes `tc` (the entry points) -> `flow` (follow its flow, or
//! open one by a mapping) -> `masq` (masquerade) and `fast` (the fast-path
//! hand-over), with `fib` answering routing questions; `sock` holds the
//! socket hooks. Beneath them: `parse` (headers), `ct` (tuples, timeouts),
//! `nat` (rewrites and checksums), `counters`, `trace`, and `maps` (every
//! map and the per-CPU scratch space). `beacon` tells userspace whether the
//! node's network namespace still exists.
#![no_std]
#![no_main]

mod beacon;
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
