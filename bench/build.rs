//! Builds the floor programs (bench/floor) with aya-build, for
//! `floor.rs` to embed: the bench attaches them where ebpf-portmap's
//! programs are attached, to tell the hooks' own cost from ours.

#[path = "../build-support/shared_ebpf.rs"]
mod shared_ebpf;

fn main() -> aya_build::Result<()> {
    shared_ebpf::build(
        "portmap-bench-floor",
        concat!(env!("CARGO_MANIFEST_DIR"), "/floor"),
    )
}
