//! Upstream `portmap` 1.9 with `"backend": "nftables"`, as the tests and
//! the bench run it: the plugins `cargo xtask setup` unpacks from Debian's
//! unstable suite (`target/tools/debian-unstable/root`, or
//! `$EPM_CONTAINERD_ROOT`) and Debian 12's `nft`, unpacked (never
//! installed) into `target/tools/nftables` (or `$EPM_NFT_TOOLS`), whose
//! `bin/nft` wrapper upstream's knftables finds first on its `PATH`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::plugins::{RUNTIME_ROOT_ENV, workspace_root};

/// Names the directory `cargo xtask setup` unpacked `nft` into.
pub const NFT_TOOLS_ENV: &str = "EPM_NFT_TOOLS";

/// Where to find upstream portmap 1.9 and an `nft` for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamNft {
    /// Holds `portmap`, `bridge`, `host-local` 1.9.
    pub plugin_dir: PathBuf,
    /// Holds `nft`: put it first on the plugins' `PATH` ([`Self::path_env`]).
    pub nft_bin_dir: PathBuf,
}

impl UpstreamNft {
    /// The unpacked plugins and `nft`, or why they are missing (a test
    /// prints it and skips).
    pub fn find() -> Result<UpstreamNft, String> {
        let tools = |env: &str, default: &str| match std::env::var_os(env) {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => workspace_root().join(default),
        };
        let found = UpstreamNft {
            plugin_dir: tools(RUNTIME_ROOT_ENV, "target/tools/debian-unstable/root")
                .join("usr/lib/cni"),
            nft_bin_dir: tools(NFT_TOOLS_ENV, "target/tools/nftables").join("bin"),
        };
        for needed in [found.plugin_dir.join("portmap"), found.nft()] {
            if !needed.is_file() {
                return Err(format!(
                    "{} is missing: run `cargo xtask setup` (it unpacks upstream portmap 1.9 and nft)",
                    needed.display()
                ));
            }
        }
        Ok(found)
    }

    /// The `nft` wrapper.
    pub fn nft(&self) -> PathBuf {
        self.nft_bin_dir.join("nft")
    }

    /// `PATH` for the plugins: the `nft` directory, then this process's.
    pub fn path_env(&self) -> OsString {
        prepend_path(&self.nft_bin_dir, std::env::var_os("PATH"))
    }
}

fn prepend_path(dir: &Path, path: Option<OsString>) -> OsString {
    let rest = path.unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&rest)))
        .expect("the tools directory holds no ':'")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nft_comes_first_on_the_path() {
        assert_eq!(
            prepend_path(Path::new("/t/nftables/bin"), Some("/usr/bin:/bin".into())),
            "/t/nftables/bin:/usr/bin:/bin"
        );
    }
}
