//! The eBPF build shared by every build-script run of one target directory.
//! Included by the build scripts that embed eBPF programs
//! (`portmap-user/build.rs`, `bench/build.rs`) with `#[path]`: a build
//! script cannot depend on a module of another crate's build script.
//!
//! aya-build compiles a package's programs with its own cargo, in a target
//! directory under the build script's `OUT_DIR`. Cargo gives every build of
//! the embedding crate its own `OUT_DIR`: each profile (dev, dist), target
//! triple (musl for the plugin, the host for tests) and command (clippy,
//! build, test). Each of them compiled `core`, aya-ebpf and the programs
//! from nothing, 40-60 s of CPU each, six times in one `cargo xtask test`.
//! Here aya-build is pointed at one `OUT_DIR` per package under the outer
//! target directory instead: its cargo then finds the programs built and
//! fresh (its fingerprints see the same sources and flags), and its own
//! lock on that directory serialises builds that run at once (the shipped
//! build beside the debug one). The objects are copied from there into
//! this run's `OUT_DIR`, where the crate embeds them from.

use std::env;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

/// Cargo's build directory (`build.build-dir`, cargo 1.91) as a variable.
const BUILD_DIR_VAR: &str = "CARGO_BUILD_BUILD_DIR";

/// Builds `package` (at `root_dir`) with aya-build in the shared
/// directory, then copies every object it wrote into this run's `OUT_DIR`.
pub fn build(package: &'static str, root_dir: &str) -> aya_build::Result<()> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let builds = shared_root(&out_dir).join("ebpf-build");
    let shared = builds.join(package);
    fs::create_dir_all(&shared)?;
    // Held until the objects are copied: another run's aya-build rewrites
    // them in place, and a copy taken meanwhile would be torn.
    let lock = File::create(shared.join(".lock"))?;
    lock.lock()?;
    // SAFETY: the build script runs one thread here; nothing reads the
    // environment meanwhile.
    unsafe { env::set_var("OUT_DIR", &shared) };
    // aya-build gives each package a target directory of its own; one
    // build directory (cargo's intermediate artifacts) under them all lets
    // the packages share `core`, compiler_builtins and aya-ebpf, which the
    // bench's floor programs otherwise compiled again (about 30 s of CPU).
    // Not the outer target directory itself: a `cargo build --release`
    // there holds the lock of the `release` folder the inner cargo would
    // wait for. Set here, over whatever the outer build was given, so that
    // every package's build lands in the same place.
    let outer_build_dir = env::var_os(BUILD_DIR_VAR);
    // SAFETY: as above; the inner cargo inherits it.
    unsafe { env::set_var(BUILD_DIR_VAR, builds.join("build")) };
    let built = aya_build::build_ebpf(
        [aya_build::Package {
            name: package,
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    );
    // SAFETY: as above.
    unsafe {
        env::set_var("OUT_DIR", &out_dir);
        match outer_build_dir {
            Some(dir) => env::set_var(BUILD_DIR_VAR, dir),
            None => env::remove_var(BUILD_DIR_VAR),
        }
    }
    built?;
    for entry in fs::read_dir(&shared)? {
        let entry = entry?;
        if entry.file_type()?.is_file() && entry.file_name() != ".lock" {
            fs::copy(entry.path(), out_dir.join(entry.file_name()))?;
        }
    }
    Ok(())
}

/// The outer target directory that `out_dir` lies in: the topmost
/// ancestor holding the `CACHEDIR.TAG` cargo writes into a target directory
/// and into each target triple's folder in it. Without one, `out_dir`
/// itself: the build is then not shared, as with aya-build alone.
fn shared_root(out_dir: &Path) -> PathBuf {
    out_dir
        .ancestors()
        .filter(|dir| dir.join("CACHEDIR.TAG").is_file())
        .last()
        .unwrap_or(out_dir)
        .to_path_buf()
}
