//! `ebpf-portmap reconcile`: what the next plugin run (or the agent's
//! pass) does to the node, on request: the programs on every interface
//! that should carry them, and the node's addresses and settings in the
//! maps.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context;
use portmap_user::{
    ops::conf::ConfSource,
    ops::interfaces::{NodeView, Pass, reconcile},
    ops::netlink::Rtnl,
};
use serde_json::json;

use crate::cli::{
    installed,
    output::{OutputArgs, print, print_json},
};

/// Bring the attachments and node addresses in line with the node now.
///
/// Every CNI ADD, DEL, CHECK and GC does this, and so does the node
/// agent's pass; between them, an interface added or re-created, or an
/// address added, goes without the programs or unknown to the socket
/// hooks (`status` says which, and names this command). It reads the
/// plugin's entry of the CNI configuration the runtime uses, as the agent
/// does, and acts on an installed dataplane only: the first ADD installs
/// one.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  ebpf-portmap reconcile
  ebpf-portmap reconcile --cni-conf /etc/cni/net.d/87-podman-bridge.conflist")]
pub struct ReconcileArgs {
    /// The CNI configuration list that chains ebpf-portmap (default: the
    /// first file of --net-dir that names it, as the runtime reads them).
    #[arg(long, value_name = "FILE")]
    cni_conf: Option<PathBuf>,
    /// The runtime's CNI configuration directory.
    #[arg(long, value_name = "DIR", default_value = "/etc/cni/net.d")]
    net_dir: PathBuf,
}

pub fn run(args: &ReconcileArgs, out: &OutputArgs) -> anyhow::Result<ExitCode> {
    let source = match &args.cni_conf {
        Some(file) => ConfSource::File(file.clone()),
        None => ConfSource::Dir(args.net_dir.clone()),
    };
    let conf = source.load()?;
    let root = &conf.pin_root;
    let Some(layout) = installed(root)? else {
        anyhow::bail!(
            "nothing is installed under {} (the configuration's pinRoot): the first ADD installs the dataplane",
            root.display()
        );
    };
    let mut rtnl = Rtnl::open().context("cannot read the node's interfaces")?;
    let node = NodeView::read(&mut rtnl, &conf, &[])?;
    reconcile(&mut rtnl, &layout, &conf, &node, Pass::Node)?;
    let attached = node.targets().len();
    if out.json() {
        print_json(&json!({"reconciled": true, "pinRoot": root, "interfaces": attached}));
    } else {
        print(&format!(
            "reconciled under {}: {attached} interfaces carry the programs; the node's addresses are synced\n",
            root.display()
        ));
    }
    Ok(ExitCode::SUCCESS)
}
