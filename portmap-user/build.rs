//! Builds the eBPF programs (`portmap-ebpf`) with aya-build so the object can be
//! embedded in the `ebpf-portmap` binary: installing the plugin is copying one file.
fn main() -> aya_build::Result<()> {
    // The eBPF crate also compiles the shared schema; aya-build only watches
    // the eBPF crate itself.
    println!(
        "cargo:rerun-if-changed={}",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../portmap-common")
    );
    let root_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../portmap-ebpf");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "portmap-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
