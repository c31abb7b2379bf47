//! Real pods on the node (issue 36) and STATUS as a runtime polls it
//! (issue 33).
//!
//! A pod here is what a runtime leaves: a network namespace whose `eth0` is
//! a veth on the node's bridge, attached by the reference `bridge` +
//! `host-local` and then ebpf-portmap (one TCP and one UDP mapping), the
//! chain run as libcni runs it. One node is filled to 0, 250 and 1 000
//! pods, then its pods are given 10 mappings each (ebpf-portmap alone, DEL
//! then ADD with the pod's own `prevResult`): 10 000 mappings on 1 000 real
//! pods. An empty twin node (no pod but the probe) is measured in the same
//! repetitions, op by op, for the "vs empty node" ratios.
//!
//! Each plugin is measured on the node in its own steady state, as a node
//! whose pods are all that plugin's. Per shape, in this order:
//! 1. upstream portmap's rules of the shape before are removed from both
//!    nodes (nat chains of both families, the `cni_hostport` tables), and
//!    the pods are grown or widened through ebpf-portmap;
//! 2. with no rule or table of upstream portmap on either node (checked;
//!    ebpf-portmap's ADD and DEL read upstream's whole state when it has
//!    any, for a node switching from it, which is not this row's node):
//!    ebpf-portmap's ADD and DEL of one more pod on the full node and on
//!    the twin, op by op; what one ADD and one DEL do (`bpf()` calls and
//!    program loads counted by `strace` on an untimed run, the netlink
//!    reads, bytes and records the plugin's own debug account reports, the
//!    CPU time of the timed runs from `wait4`); STATUS's CPU time per call,
//!    alone and beside concurrent ADDs (`status::PARALLEL_ADDS`) at 1 000 pods;
//! 3. Debian's iptables `portmap` (1.1.1) and upstream `portmap` 1.9.x with
//!    its nftables backend are given the rules of the same pods (see
//!    below), and their ADD and DEL of one more pod are timed on the full
//!    node and the twin the same way. Each writes only its own table
//!    (iptables `nat`, nftables `cni_hostport`), so neither sees the other's
//!    rules; both see ebpf-portmap's BPF state, which they never read.
//!
//! "ebpf-portmap vs upstream on the same node" thus compares the same pods
//! (namespaces, veths, addresses) with each plugin's own mappings of them,
//! paired by repetition index.
//!
//! iptables portmap's rules for the pods are real ADDs for the first
//! [`crate::results::UPSTREAM_REAL_PODS`] pods, then copies of the last one's rules loaded
//! with `iptables-restore` (see [`super::iptables`]): the ruleset those ADDs
//! would write, in a minute instead of a quarter of an hour. nftables
//! portmap's rules are all its own real ADDs (about 0.1 s each, flat in
//! the size of its table). Both start from no rule at every shape.
//!
//! The files, by what they measure: `add_del` one more pod's ADD and DEL
//! (issue 36), `status` STATUS (issue 33), `account` what one call does
//! (both use it); below them `fill` fills and clears the node and `node`
//! is the node of real pods itself. Imports point down that list only.

mod account;
mod add_del;
mod fill;
mod node;
mod status;

use std::time::Instant;

use anyhow::Context;

use crate::plan::Plan;
use crate::progress::Progress;
use crate::results::{POD_SHAPES, Results};
use node::PodNode;

/// The pods section: builds the two nodes, fills the full one shape by
/// shape, measures, and removes both (timed: 2 000 namespaces go).
pub fn measure(plan: &Plan, progress: &Progress, results: &mut Results) -> anyhow::Result<()> {
    progress.say("pods: building a node for real pods and its empty twin");
    let mut full = PodNode::new("bench-pods").context("the pods node")?;
    let mut empty = PodNode::new("bench-pods").context("the empty twin node")?;
    status::on_the_empty_node(&empty, plan, progress, results);

    let mut nftables_failed: Option<String> = None;
    for shape in POD_SHAPES {
        progress.check()?;
        fill::for_ours(&mut full, &mut empty, shape, progress, results)?;
        add_del::ours(plan, &full, &empty, shape, results);
        status::on_the_installed_node(&full, shape, plan, progress, results);
        let nftables_here =
            fill::for_peers(&mut full, shape, progress, results, &mut nftables_failed)?;
        let peer_ops = add_del::peers(plan, progress, &full, &empty, shape, nftables_here, results);
        progress.say(&add_del::shape_line(results, shape, &peer_ops));
    }
    let started = Instant::now();
    let pods = full.pods.len() + 2;
    drop(full);
    drop(empty);
    progress.say(&format!(
        "pods: {pods} pod namespaces and two nodes removed in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}
