//! `cargo xtask image`: the node installer's image from the release tarball,
//! saved as an OCI archive (`podman load -i`, `docker load -i`,
//! `kind load image-archive`). Podman runs confined (its own storage and
//! configuration in a temp dir, its own network namespace): nothing is left
//! in the machine's image store. Needs root.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use portmap_tests::cni::Conflist;
use portmap_tests::podman::Podman;
use portmap_tests::release::Release;
use portmap_tests::tmp::TempDir;
use portmap_tests::{NetNs, image};

#[derive(Debug, Parser)]
#[command(about = "Build the installer image from a release tarball and save it as an OCI archive")]
struct Args {
    /// The release tarball (`cargo xtask dist`).
    #[arg(long)]
    tarball: PathBuf,
    /// Where to write the OCI archive.
    #[arg(long)]
    out: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let release = Release::unpack(&args.tarball);
    let node = NetNs::new("image");
    // No container of this podman joins a network: an empty list will do.
    let conflist = Conflist::from_json(serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "epm-image",
        "plugins": [{"type": "loopback"}],
    }))
    .expect("a conflist");
    let plugins = TempDir::new("image-plugins");
    let podman = Podman::start(&node, plugins.path(), &conflist);
    let tag = image::build(&podman, &release.root, &release.version);
    let _ = std::fs::remove_file(&args.out);
    let out = args.out.to_string_lossy().into_owned();
    match podman.run(&["save", "--format", "oci-archive", "--output", &out, &tag]) {
        Ok(_) => {
            println!("image: {tag} saved to {out}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("image: {error}");
            ExitCode::FAILURE
        }
    }
}
