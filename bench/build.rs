//! Builds the floor programs (bench/floor) with aya-build, for
//! `floor.rs` to embed: the bench attaches them where ebpf-portmap's
//! programs are attached, to tell the hooks' own cost from ours.

fn main() -> aya_build::Result<()> {
    let root_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/floor");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "portmap-bench-floor",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
