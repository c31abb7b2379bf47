//! Filling the node: its pods attached and widened through ebpf-portmap,
//! iptables and nftables portmap's rules for the same pods, and every rule
//! of theirs removed again before ebpf-portmap's rows of the next shape.

use std::sync::Mutex;
use std::time::Instant;

use anyhow::anyhow;
use portmap_tests::cni::CniCommand;
use portmap_tests::{Node, PortMapping};

use super::node::{POD_PORT_BASE, Pod, PodNode, pod_id, pod_mappings};
use crate::control::deal;
use crate::iptables;
use crate::nftables;
use crate::progress::Progress;
use crate::results::{PodPrefill, Results, Shape, UPSTREAM_REAL_PODS, size_label};
use crate::world::Flavor;

/// Callers that attach the prefill pods at once.
const PREFILL_CALLERS: usize = 4;
/// The table of upstream portmap's nftables backend.
const UPSTREAM_NFT_TABLE: &str = "cni_hostport";

impl PodNode {
    /// Attaches pods through the whole chain (with ebpf-portmap), up to
    /// `count`, [`PREFILL_CALLERS`] at a time.
    pub(super) fn grow(&mut self, count: usize) -> Result<(), String> {
        let indices: Vec<usize> = (self.pods.len()..count).collect();
        if indices.is_empty() {
            return Ok(());
        }
        let made: Mutex<Vec<(usize, Pod)>> = Mutex::new(Vec::new());
        let failed: Mutex<Option<String>> = Mutex::new(None);
        let work = deal(&indices, PREFILL_CALLERS);
        std::thread::scope(|scope| {
            for items in &work {
                let (made, failed, this) = (&made, &failed, &*self);
                scope.spawn(move || {
                    for &index in items {
                        let container = this.node.add_container(&pod_id(index));
                        let mappings = pod_mappings(index, 2);
                        let added = this
                            .invoker
                            .chain_add(&this.ours, &container.with_port_mappings(&mappings));
                        match added.result {
                            Ok(prev_result) => made.lock().expect("pods").push((
                                index,
                                Pod {
                                    container,
                                    prev_result,
                                    mappings: 2,
                                },
                            )),
                            Err(e) => {
                                failed
                                    .lock()
                                    .expect("failure")
                                    .get_or_insert(format!("pod {index}: {e}"));
                                return;
                            }
                        }
                    }
                });
            }
        });
        let mut made = made.into_inner().expect("pods");
        made.sort_by_key(|(index, _)| *index);
        self.pods.extend(made.into_iter().map(|(_, pod)| pod));
        match failed.into_inner().expect("failure") {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Gives every pod `count` mappings: ebpf-portmap alone, DEL of the
    /// old ones then ADD of the new ones with the pod's `prevResult`.
    pub(super) fn widen(&mut self, count: usize) -> Result<(), String> {
        let indices: Vec<usize> = (0..self.pods.len())
            .filter(|&i| self.pods[i].mappings != count)
            .collect();
        let failed: Mutex<Option<String>> = Mutex::new(None);
        let work = deal(&indices, PREFILL_CALLERS);
        std::thread::scope(|scope| {
            for items in &work {
                let (failed, this) = (&failed, &*self);
                scope.spawn(move || {
                    for &index in items {
                        let pod = &this.pods[index];
                        let old = pod_mappings(index, pod.mappings);
                        let new = pod_mappings(index, count);
                        let rt = |m: &[PortMapping]| pod.container.with_port_mappings(m);
                        let del = this.invoker.port_plugin(
                            &this.ours,
                            CniCommand::Del,
                            &rt(&old),
                            &pod.prev_result,
                        );
                        let add = this.invoker.port_plugin(
                            &this.ours,
                            CniCommand::Add,
                            &rt(&new),
                            &pod.prev_result,
                        );
                        if let Err(e) = del.result.and(add.result) {
                            failed
                                .lock()
                                .expect("failure")
                                .get_or_insert(format!("pod {index}: {e}"));
                            return;
                        }
                    }
                });
            }
        });
        for pod in &mut self.pods {
            pod.mappings = count;
        }
        match failed.into_inner().expect("failure") {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// iptables portmap's rules for every pod with `mappings` each: real
    /// ADDs for the first [`UPSTREAM_REAL_PODS`], copies of the last real
    /// one's rules for the others. A new mapping count starts over from
    /// empty nat tables. Returns how.
    pub(super) fn fill_upstream(&mut self, mappings: usize) -> Result<String, String> {
        if mappings != self.upstream_mappings {
            iptables::flush_nat(&self.node.ns)?;
            self.upstream_pods = 0;
            self.upstream_real = 0;
            self.upstream_mappings = mappings;
        }
        let target = self.pods.len();
        while self.upstream_real < target.min(UPSTREAM_REAL_PODS) {
            let index = self.upstream_real;
            let pod = &self.pods[index];
            let rt = pod
                .container
                .with_port_mappings(&pod_mappings(index, mappings));
            self.invoker
                .port_plugin(&self.upstream, CniCommand::Add, &rt, &pod.prev_result)
                .result
                .map_err(|e| format!("iptables portmap ADD of pod {index}: {e}"))?;
            self.upstream_real += 1;
            self.upstream_pods = self.upstream_pods.max(self.upstream_real);
        }
        if self.upstream_pods < target {
            let template = self.upstream_real - 1;
            let first = self.upstream_pods;
            let copies = self.upstream_copies..self.upstream_copies + (target - first);
            let template_base = POD_PORT_BASE as usize + template * 10;
            let start = self.upstream_copies;
            let port = move |k: usize, p: u16| -> u16 {
                let pod = first + (k - start);
                let offset = (p as usize).wrapping_sub(template_base);
                u16::try_from(POD_PORT_BASE as usize + pod * 10 + offset).unwrap_or(p)
            };
            iptables::synthesize(&self.node.ns, &pod_id(template), "copy-", copies, port)?;
            self.upstream_copies += target - first;
            self.upstream_pods = target;
        }
        Ok(if target <= self.upstream_real {
            "real ADDs".to_owned()
        } else {
            format!(
                "real ADDs for {} pods, copies of the last one's rules (iptables-restore) for {}",
                self.upstream_real,
                target - self.upstream_real
            )
        })
    }

    /// nftables portmap's rules for every pod with `mappings` each, all
    /// real ADDs ([`PREFILL_CALLERS`] at a time) with the pod's own
    /// `prevResult`. A new mapping count starts over from no table.
    pub(super) fn fill_nftables(&mut self, mappings: usize) -> Result<String, String> {
        let Some(list) = &self.nftables else {
            return Err(nftables::skip_reason().unwrap_or_default());
        };
        if mappings != self.nftables_mappings {
            nftables::flush(&self.node.ns)?;
            self.nftables_pods = 0;
            self.nftables_mappings = mappings;
        }
        let indices: Vec<usize> = (self.nftables_pods..self.pods.len()).collect();
        let failed: Mutex<Option<String>> = Mutex::new(None);
        let work = deal(&indices, PREFILL_CALLERS);
        std::thread::scope(|scope| {
            for items in &work {
                let (failed, this) = (&failed, &*self);
                scope.spawn(move || {
                    for &index in items {
                        let pod = &this.pods[index];
                        let rt = pod
                            .container
                            .with_port_mappings(&pod_mappings(index, mappings));
                        let added =
                            this.invoker
                                .port_plugin(list, CniCommand::Add, &rt, &pod.prev_result);
                        if let Err(e) = added.result {
                            failed
                                .lock()
                                .expect("failure")
                                .get_or_insert(format!("nftables portmap ADD of pod {index}: {e}"));
                            return;
                        }
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().expect("failure") {
            return Err(e);
        }
        self.nftables_pods = self.pods.len();
        Ok(format!(
            "real ADDs of nftables portmap for every pod from no table, {PREFILL_CALLERS} at a time"
        ))
    }

    /// Removes every rule, chain and table of iptables and nftables
    /// portmap from the node (nothing else in it writes any), so
    /// ebpf-portmap's next calls see a node whose pods are all its own.
    pub(super) fn clear_upstream(&mut self) -> Result<(), String> {
        iptables::flush_nat(&self.node.ns)?;
        self.upstream_pods = 0;
        self.upstream_real = 0;
        self.upstream_mappings = 0;
        if self.nftables.is_some() {
            nftables::flush(&self.node.ns)?;
        }
        self.nftables_pods = 0;
        self.nftables_mappings = 0;
        upstream_leftover(&self.node).map_or(Ok(()), Err)
    }
}

/// What of upstream portmap's state `node` still has (a `CNI-` chain in a
/// nat table, a `cni_hostport` table), the state ebpf-portmap's ADD and
/// DEL look for; `None` when there is none.
fn upstream_leftover(node: &Node) -> Option<String> {
    let mut found = Vec::new();
    for save in ["iptables-save", "ip6tables-save"] {
        let dump = node
            .ns
            .command(save)
            .args(["-t", "nat"])
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default();
        found.extend(
            dump.lines()
                .filter(|line| line.starts_with(":CNI-"))
                .map(|line| format!("{save}: {}", line.split(' ').next().unwrap_or(line))),
        );
    }
    if let Ok(peer) = nftables::peer() {
        for family in ["ip", "ip6"] {
            let listed = node
                .ns
                .command("nft")
                .env("PATH", &peer.path_env)
                .args(["list", "table", family, UPSTREAM_NFT_TABLE])
                .output()
                .is_ok_and(|out| out.status.success());
            if listed {
                found.push(format!("nftables table {family} {UPSTREAM_NFT_TABLE}"));
            }
        }
    }
    (!found.is_empty()).then(|| {
        format!(
            "upstream portmap's state is still on the node: {}",
            found.join(", ")
        )
    })
}

/// Readies the full node for ebpf-portmap's rows of `shape`: iptables and
/// nftables portmap's rules of the shape before go from both nodes
/// (ebpf-portmap is measured on a node of its own pods only, see the
/// section's doc), the full node's pods are grown or widened through
/// ebpf-portmap, and neither node may then hold any state of upstream's.
pub(super) fn for_ours(
    full: &mut PodNode,
    empty: &mut PodNode,
    shape: Shape,
    progress: &Progress,
    results: &mut Results,
) -> anyhow::Result<()> {
    for (node, which) in [(&mut *full, "full"), (&mut *empty, "empty twin")] {
        node.clear_upstream().map_err(|e| {
            anyhow!("pods: removing upstream portmap's rules from the {which} node: {e}")
        })?;
    }
    let started = Instant::now();
    let grown = if shape.mappings_per_pod == 2 {
        full.grow(shape.pods)
    } else {
        full.widen(shape.mappings_per_pod)
    };
    grown.map_err(|e| anyhow!("pods: filling the node to {}: {e}", shape.label()))?;
    let ours_seconds = started.elapsed().as_secs_f64();
    results.pod_prefill.push(PodPrefill {
        shape,
        flavor: Flavor::Ours,
        method: if shape.mappings_per_pod == 2 {
            format!(
                "bridge + host-local + ebpf-portmap, {PREFILL_CALLERS} pods at a time"
            )
        } else {
            format!(
                "ebpf-portmap alone on each pod, DEL of its 2 mappings then ADD of {}, {PREFILL_CALLERS} at a time",
                shape.mappings_per_pod
            )
        },
        seconds: ours_seconds,
        nat_rules: None,
    });
    progress.say(&format!(
        "pods: node at {} ({} mappings) in {ours_seconds:.1} s",
        shape.label(),
        size_label(shape.mappings())
    ));
    for (node, which) in [(&*full, "full"), (&*empty, "empty twin")] {
        if let Some(left) = upstream_leftover(&node.node) {
            return Err(anyhow!(
                "pods: {which} node before ebpf-portmap's rows of {}: {left}",
                shape.label()
            ));
        }
    }
    Ok(())
}

/// Gives the same pods iptables portmap's rules, then nftables portmap's
/// where it can run and has not failed at an earlier shape (a failure is
/// recorded as a skip, named in `nftables_failed`, and its later rows are
/// left out). Returns whether nftables portmap's rows run at `shape`.
pub(super) fn for_peers(
    full: &mut PodNode,
    shape: Shape,
    progress: &Progress,
    results: &mut Results,
    nftables_failed: &mut Option<String>,
) -> anyhow::Result<bool> {
    let started = Instant::now();
    let upstream_how = full
        .fill_upstream(shape.mappings_per_pod)
        .map_err(|e| anyhow!("pods: iptables portmap's rules for {}: {e}", shape.label()))?;
    results.pod_prefill.push(PodPrefill {
        shape,
        flavor: Flavor::Upstream,
        method: upstream_how,
        seconds: started.elapsed().as_secs_f64(),
        nat_rules: Some(iptables::nat_rule_count(&full.node.ns)),
    });
    let nftables_here = if full.nftables.is_some() && nftables_failed.is_none() {
        let started = Instant::now();
        match full.fill_nftables(shape.mappings_per_pod) {
            Ok(how) => {
                let seconds = started.elapsed().as_secs_f64();
                let rules = nftables::rule_count(&full.node.ns);
                progress.say(&format!(
                    "pods: nftables portmap's rules for {} in {seconds:.1} s ({rules} rules)",
                    shape.label()
                ));
                results.pod_prefill.push(PodPrefill {
                    shape,
                    flavor: Flavor::Nftables,
                    method: how,
                    seconds,
                    nat_rules: Some(rules),
                });
                true
            }
            Err(e) => {
                let reason = format!(
                    "pods: nftables portmap's rules for {}: {e}; its later pod rows are skipped",
                    shape.label()
                );
                progress.say(&reason);
                results.skipped.push(reason.clone());
                *nftables_failed = Some(reason);
                false
            }
        }
    } else {
        false
    };
    Ok(nftables_here)
}
