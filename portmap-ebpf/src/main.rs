//! ebpf-portmap dataplane: hostPort DNAT for traffic arriving at the node
//! (tc ingress), reverse NAT of the replies (tc egress), and the cgroup
//! socket hooks for connections that start on the node.
//!
//! A packet goes `tc` (the entry points) -> `flow` (follow its flow, or
//! open one by a mapping; `icmp` for an ICMP error about one) -> `masq` (masquerade) and `fast` (the fast-path
//! hand-over), with `fib` answering routing questions; `sock` holds the
//! socket hooks. Beneath them: `parse` (headers), `ct` (tuples, timeouts),
//! `nat` (rewrites and checksums), `counters`, `trace`, `events` (the rare
//! events, logged through aya-log for the node agent), `mark` (the mark
//! ingress leaves for egress), and `maps` (every map and the per-CPU
//! scratch space, with the fast path's offer in it). `beacon` tells
//! userspace whether the node's network namespace still exists.
//!
//! Imports only point down these layers, never back up (a test of the
//! workspace checks that no module imports one that imports it):
//! 1. `parse`, then `maps`;
//! 2. `ct`, `nat`, `fib`, `counters`, `trace`, `events`, `mark`;
//! 3. `masq`, `confirm` (the kernel's conntrack verdict), then `fast`,
//!    then `flow` and `icmp` (errors about translated flows);
//! 4. the entry points `tc`, `sock`, `beacon`.
#![no_std]
// Inline asm for the kfunc calls (see `confirm`): BPF asm is unstable.
#![feature(asm_experimental_arch)]
#![no_main]

mod beacon;
mod confirm;
mod counters;
mod ct;
mod events;
mod fast;
mod fib;
mod flow;
mod icmp;
mod kfunc;
mod knat;
mod maps;
mod mark;
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
