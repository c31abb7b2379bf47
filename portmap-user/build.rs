//! Builds the eBPF programs (`portmap-ebpf`) with aya-build so the object can be
//! embedded in the `ebpf-portmap` binary: installing the plugin is copying one file.
//! Also hashes the object into `PORTMAP_BUILD_ID` (see `attach::build_id`), so
//! the plugin does not hash half a megabyte on every run.

#[path = "src/dataplane/hash.rs"]
mod hash;

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
    )?;
    let out_dir = std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR");
    let object = std::path::Path::new(&out_dir).join("portmap");
    let bytes = std::fs::read(&object)
        .unwrap_or_else(|e| panic!("reading the eBPF object {}: {e}", object.display()));
    println!(
        "cargo:rustc-env=PORTMAP_BUILD_ID={:016x}",
        hash::fnv1a64(&bytes)
    );
    Ok(())
}
