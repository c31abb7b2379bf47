//! Builds the eBPF programs (`portmap-ebpf`) with aya-build so the object can be
//! embedded in the `ebpf-portmap` binary: installing the plugin is copying one file.
//! Also hashes the object into `PORTMAP_BUILD_ID` (see `attach::build_id`), so
//! the plugin does not hash half a megabyte on every run.

#[path = "../build-support/shared_ebpf.rs"]
mod shared_ebpf;

fn main() -> aya_build::Result<()> {
    // Paths from the environment cargo runs this script in, not baked in
    // when it was compiled: cargo reuses a compiled build script across
    // checkouts that share a target directory (its hashes hold relative
    // paths), and a copy whose paths named another checkout watched that
    // checkout's eBPF sources, so this one's changes never rebuilt the
    // object (a bench run measured a stale object that way).
    let manifest_dir =
        std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let workspace = manifest_dir
        .parent()
        .expect("portmap-user sits in the workspace root");
    // The eBPF crate also compiles the shared schema; aya-build only watches
    // the eBPF crate itself.
    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("portmap-common").display()
    );
    let root_dir = workspace.join("portmap-ebpf");
    shared_ebpf::build(
        "portmap-ebpf",
        root_dir.to_str().expect("a UTF-8 checkout path"),
    )?;
    let out_dir = std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR");
    let object = std::path::Path::new(&out_dir).join("portmap");
    let bytes = std::fs::read(&object)
        .unwrap_or_else(|e| panic!("reading the eBPF object {}: {e}", object.display()));
    println!(
        "cargo:rustc-env=PORTMAP_BUILD_ID={:016x}",
        portmap_common::fnv::fnv1a64(&bytes)
    );
    let sources = portmap_common::sources::ebpf_sources_digest(workspace).unwrap_or_else(|e| {
        panic!(
            "reading the eBPF sources under {}: {e}",
            workspace.display()
        )
    });
    println!("cargo:rustc-env=PORTMAP_EBPF_SOURCES={sources:016x}");
    Ok(())
}
