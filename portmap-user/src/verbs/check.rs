//! CHECK: every mapping of the container is installed as ADD left it, and
//! with `containerSockets` its network namespace is registered.
//!
//! A runtime restoring its containers after a restart asks CHECK whether
//! their networks still work (Nomad 1.9+ does, for every allocation, and
//! re-creates the network of one whose CHECK fails). After a restart of the
//! runtime, the agent or this plugin the pins are all there and CHECK
//! passes; after a reboot bpffs and /run start empty, and CHECK fails
//! first thing, saying the container has no mappings under the pin root
//! and must be added again, rather than naming a missing attachment.

use super::interfaces::NodeView;
use super::interfaces::{Pass, reconcile};
use super::shared::PluginError;
use super::shared::require_privilege;
use crate::cni::Request;
use crate::dataplane::attach;
use crate::dataplane::container_netns;
use crate::dataplane::ownership::Store;
use crate::dataplane::ownership::StoreError;
use crate::dataplane::pin::PinLayout;
use crate::dataplane::scope;
use crate::node::netlink::Rtnl;

pub(super) fn check(req: &Request) -> Result<(), PluginError> {
    let translations = super::add::planned(req);
    let layout = scope::resolve(&req.conf.pin_root, scope::Access::Read)?;
    let installed = layout.map(portmap_common::map_names::OWNERS).exists();
    if translations.is_empty() && !installed && !req.conf.container_sockets {
        return Ok(());
    }
    // Privilege first: without it nothing under the pin root can be read,
    // which is not the same as nothing being there.
    require_privilege()?;
    if !translations.is_empty() && !installed {
        return Err(not_added(req, &layout, false));
    }
    let mut rtnl = Rtnl::open()?;
    let node = NodeView::read(&mut rtnl, &req.conf, &req.interfaces)?;
    if installed && let Err(error) = reconcile(&mut rtnl, &layout, &req.conf, &node, Pass::Call) {
        // What it could not attach is reported below.
        log::warn!("CHECK: the attachments were not brought up to date: {error}");
    }
    if req.conf.container_sockets
        && let Some(netns) = req.netns.as_deref()
    {
        let cookie = container_netns::cookie_at(netns)?;
        if !container_netns::is_registered(&layout, &req.owner, cookie) {
            return Err(PluginError::NotRegistered {
                container_id: req.owner.container_id.clone(),
                netns: netns.to_owned(),
            });
        }
    }
    if translations.is_empty() {
        return Ok(());
    }
    if let Some(index) = node
        .targets()
        .into_iter()
        .find(|&index| !attach::is_attached(&layout, index))
    {
        return Err(PluginError::NotAttached { index });
    }
    let maps = Store::open(&layout)?;
    if !maps.has_owner(&req.owner)? {
        return Err(not_added(req, &layout, true));
    }
    maps.verify(&req.owner, &translations)?;
    Ok(())
}

/// The failure of a CHECK of a container that holds nothing under
/// `layout` (see the module docs).
fn not_added(req: &Request, layout: &PinLayout, dataplane: bool) -> PluginError {
    PluginError::Store(StoreError::NotAdded {
        container_id: req.owner.container_id.clone(),
        pin_root: layout.root().to_path_buf(),
        dataplane,
    })
}
