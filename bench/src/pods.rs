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
//!    alone and beside [`PARALLEL_ADDS`] ADDs at 1 000 pods;
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
//! [`UPSTREAM_REAL_PODS`](super::results::UPSTREAM_REAL_PODS) pods, then copies of the last one's rules loaded
//! with `iptables-restore` (see [`super::iptables`]): the ruleset those ADDs
//! would write, in a minute instead of a quarter of an hour. nftables
//! portmap's rules are all its own real ADDs (about 0.1 s each, flat in
//! the size of its table). Both start from no rule at every shape.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use portmap_tests::cni::CniCommand;
use portmap_tests::tmp::TempDir;
use portmap_tests::topology::{PLUGIN_LOG, port_mappings_args};
use portmap_tests::{
    Conflist, Container, Node, PinRoot, PluginDirs, PortMapping, RuntimeAttachment,
    bridge_conflist, plugin_bin,
};
use serde_json::{Value, json};

use super::control::{Batch, deal, run_batch, run_interleaved};
use super::invoke::{Invoker, Timed, Wrapper};
use super::iptables;
use super::nftables;
use super::plan::Plan;
use super::progress::Progress;
use super::results::{
    CallAccount, POD_SHAPES, PodCell, PodPrefill, Results, Shape, StatusRow, UPSTREAM_REAL_PODS,
    Verb, size_label,
};
use super::world::{Flavor, OP_PORT_BASE};

/// The pods' IPv4 range: room for 4 000 pods (the harness's /24 holds 253).
const POD_RANGE4: &str = "10.244.0.0/20";
/// Host ports of the prefilled pods: pod `i` has `POD_PORT_BASE + 10 i ..`.
const POD_PORT_BASE: u16 = 30_000;
/// Callers that attach the prefill pods at once.
const PREFILL_CALLERS: usize = 4;
/// The table of upstream portmap's nftables backend.
const UPSTREAM_NFT_TABLE: &str = "cni_hostport";
/// STATUS calls per repetition on each node state.
const STATUS_CALLS: usize = 20;
/// STATUS calls run under `strace` on each node state, for the programs
/// they load.
const STATUS_TRACED: usize = 5;
/// Concurrent ADDs (then DELs) the loaded STATUS row runs beside.
const PARALLEL_ADDS: usize = 32;

/// Mappings of prefilled pod `index`: TCP and UDP alternating, from its
/// own block of 10 host ports.
fn pod_mappings(index: usize, count: usize) -> Vec<PortMapping> {
    (0..count)
        .map(|k| {
            let port = u16::try_from(POD_PORT_BASE as usize + index * 10 + k)
                .expect("pod ports stay below 65536");
            if k % 2 == 0 {
                PortMapping::tcp(port, 80)
            } else {
                PortMapping::udp(port, 53)
            }
        })
        .collect()
}

/// The one more pod's mappings of operation `i`: one TCP, one UDP.
fn one_more_mappings(i: usize) -> Vec<PortMapping> {
    let port = OP_PORT_BASE + u16::try_from(i % 5_000).expect("small") * 2;
    vec![PortMapping::tcp(port, 80), PortMapping::udp(port + 1, 53)]
}

fn pod_id(index: usize) -> String {
    format!("pod{index}")
}

/// A prefilled pod: its namespace and what bridge + host-local answered
/// (the `prevResult` of its port-mapping plugin calls).
struct Pod {
    container: Container,
    prev_result: Value,
    mappings: usize,
}

/// A node with the reference chain and both port-mapping plugins, its pods
/// and a probe pod (attached by bridge + host-local only) whose namespace
/// the one-more-pod operations use.
struct PodNode {
    node: Node,
    _pins: PinRoot,
    invoker: Invoker,
    ours: Conflist,
    upstream: Conflist,
    probe: Container,
    probe_prev: Value,
    pods: Vec<Pod>,
    /// Pods whose iptables portmap rules are in place, of them real ADDs.
    upstream_pods: usize,
    upstream_real: usize,
    upstream_mappings: usize,
    /// Copies made so far (their chains are numbered by it).
    upstream_copies: usize,
    /// nftables portmap (1.9.x), when it can run here.
    nftables: Option<Conflist>,
    /// Pods whose nftables portmap rules are in place (all real ADDs), and
    /// with how many mappings each.
    nftables_pods: usize,
    nftables_mappings: usize,
    trace_dir: TempDir,
    _plugins: PluginDirs,
}

/// `bridge` (cni0) + `host-local` over [`POD_RANGE4`] + `kind`.
fn pod_conflist(name: &str, kind: &str, pins: Option<&std::path::Path>, node: &Node) -> Conflist {
    let mut json = bridge_conflist(name, kind, pins, node.data_dir())
        .json()
        .clone();
    json["plugins"][0]["ipam"]["ranges"][0] = json!([{ "subnet": POD_RANGE4 }]);
    Conflist::from_json(json).expect("a valid conflist")
}

impl PodNode {
    fn new(name: &str) -> anyhow::Result<PodNode> {
        let node = Node::new();
        let pins = PinRoot::new();
        let plugins = PluginDirs::with_plugin_copy(&plugin_bin());
        // The PATH holding `nft` (nftables portmap's), harmless to the others.
        let invoker = Invoker::new(plugins.path().to_path_buf(), node.ns.handle())
            .with_env(nftables::plugin_env());
        let ours = pod_conflist(name, "ebpf-portmap", Some(pins.path()), &node);
        let upstream = pod_conflist(name, "portmap", None, &node);
        let nftables = nftables::peer().is_ok().then(|| {
            nftables::link_into(plugins.path());
            let mut json = upstream.json().clone();
            let plugins = json["plugins"].as_array_mut().expect("plugins array");
            nftables::configure(plugins.last_mut().expect("the port plugin"));
            Conflist::from_json(json).expect("a valid conflist")
        });
        let mut bridge_only = ours.json().clone();
        bridge_only["plugins"]
            .as_array_mut()
            .expect("plugins array")
            .truncate(1);
        let bridge_only = Conflist::from_json(bridge_only).expect("a valid conflist");
        let probe = node.add_container("probe");
        let probe_prev = invoker
            .chain_add(&bridge_only, &probe.with_port_mappings(&[]))
            .result
            .map_err(|e| anyhow!("{name}: ADD of the probe pod: {e}"))?;
        Ok(PodNode {
            node,
            _pins: pins,
            invoker,
            ours,
            upstream,
            probe,
            probe_prev,
            pods: Vec::new(),
            upstream_pods: 0,
            upstream_real: 0,
            upstream_mappings: 0,
            upstream_copies: 0,
            nftables,
            nftables_pods: 0,
            nftables_mappings: 0,
            trace_dir: TempDir::new("bench-trace"),
            _plugins: plugins,
        })
    }

    fn list(&self, flavor: Flavor) -> &Conflist {
        match flavor {
            Flavor::Upstream => &self.upstream,
            Flavor::Nftables => self
                .nftables
                .as_ref()
                .expect("nftables portmap is only run where it can run"),
            _ => &self.ours,
        }
    }

    /// The one more pod of operation `id`: the probe's namespace and
    /// interfaces, a container ID of its own.
    fn one_more(&self, id: &str, mappings: &[PortMapping]) -> RuntimeAttachment {
        let mut rt = self.probe.attachment(port_mappings_args(mappings));
        rt.container_id = id.to_owned();
        rt
    }

    /// The port-mapping plugin `flavor` alone for the one more pod `id`.
    fn one_more_op(
        &self,
        flavor: Flavor,
        command: CniCommand,
        id: &str,
        mappings: &[PortMapping],
    ) -> Timed {
        self.invoker.port_plugin(
            self.list(flavor),
            command,
            &self.one_more(id, mappings),
            &self.probe_prev,
        )
    }

    /// Attaches pods through the whole chain (with ebpf-portmap), up to
    /// `count`, [`PREFILL_CALLERS`] at a time.
    fn grow(&mut self, count: usize) -> Result<(), String> {
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
    fn widen(&mut self, count: usize) -> Result<(), String> {
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
    fn fill_upstream(&mut self, mappings: usize) -> Result<String, String> {
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
    fn fill_nftables(&mut self, mappings: usize) -> Result<String, String> {
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
    fn clear_upstream(&mut self) -> Result<(), String> {
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

    /// The plugin's log (its debug account lines).
    fn log(&self) -> PathBuf {
        self.node.data_dir().join(PLUGIN_LOG)
    }

    /// One untimed call under `strace` with the plugin's debug log on:
    /// `run` gets the wrapper and makes the call.
    fn counted(
        &self,
        account_verb: Option<&str>,
        run: impl FnOnce(&Wrapper<'_>) -> Timed,
    ) -> Result<CallAccount, String> {
        let trace = self.trace_dir.path().join("strace.out");
        let _ = std::fs::remove_file(&trace);
        let prefix: Vec<OsString> = [
            "strace",
            "-f",
            "-qq",
            "-e",
            "trace=bpf",
            "-e",
            "signal=none",
            "-o",
        ]
        .iter()
        .map(OsString::from)
        .chain([trace.clone().into_os_string()])
        .collect();
        let env = [("EPM_LOG_LEVEL", "debug")];
        let timed = run(&Wrapper {
            prefix: &prefix,
            env: &env,
        });
        timed.result?;
        let text = std::fs::read_to_string(&trace)
            .map_err(|e| format!("strace wrote nothing at {}: {e}", trace.display()))?;
        let bpf_by_command = count_bpf(&text);
        let netlink = match account_verb {
            Some(verb) => last_account(
                &std::fs::read_to_string(self.log()).unwrap_or_default(),
                verb,
            ),
            None => Default::default(),
        };
        Ok(CallAccount {
            bpf_calls: bpf_by_command.values().sum(),
            program_loads: bpf_by_command.get("BPF_PROG_LOAD").copied().unwrap_or(0),
            bpf_by_command,
            netlink,
        })
    }

    /// The STATUS request of ebpf-portmap's configuration (cniVersion
    /// 1.1.0, the first with STATUS; the reference plugins speak 1.0.0).
    fn status_config(&self) -> Value {
        let plugin = self.ours.plugins().last().expect("plugins");
        let mut config = portmap_tests::cni::plugin_config(&self.ours, plugin, &Value::Null, None);
        config["cniVersion"] = json!("1.1.0");
        config
    }

    fn status(&self, wrapper: &Wrapper<'_>) -> Timed {
        self.invoker.exec_wrapped(
            "ebpf-portmap",
            CniCommand::Status,
            &self.probe.attachment(Value::Null),
            &self.status_config(),
            wrapper,
        )
    }

    /// `calls` STATUS calls, one after another, then [`STATUS_TRACED`]
    /// more under strace for the programs they load.
    fn status_row(&self, key: String, state: String, calls: usize) -> StatusRow {
        let batch = run_batch(&[vec![(); calls]], |()| self.status(&Wrapper::NONE));
        let account = self.status_traced();
        StatusRow {
            key,
            state,
            calls: batch,
            account,
            traced_calls: STATUS_TRACED,
            first_call_cpu_ms: None,
            first_call: None,
            beside: None,
        }
    }

    /// Programs loaded and bpf() calls over [`STATUS_TRACED`] STATUS calls.
    fn status_traced(&self) -> Result<CallAccount, String> {
        let mut total = CallAccount::default();
        for _ in 0..STATUS_TRACED {
            let one = self.counted(None, |wrapper| self.status(wrapper))?;
            total.bpf_calls += one.bpf_calls;
            total.program_loads += one.program_loads;
            for (command, calls) in one.bpf_by_command {
                *total.bpf_by_command.entry(command).or_default() += calls;
            }
        }
        Ok(total)
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

/// `bpf()` calls by command (`BPF_OBJ_GET`, ...) in an `strace -e
/// trace=bpf` log.
pub fn count_bpf(trace: &str) -> BTreeMap<String, u64> {
    let mut by_command = BTreeMap::new();
    for line in trace.lines() {
        let Some((_, call)) = line.split_once("bpf(") else {
            continue;
        };
        let command = call.split([',', ')']).next().unwrap_or_default().trim();
        *by_command.entry(command.to_owned()).or_default() += 1;
    }
    by_command
}

/// The `key=value` pairs of the last `{verb} account:` line of a plugin log.
pub fn last_account(log: &str, verb: &str) -> BTreeMap<String, u64> {
    let marker = format!("{verb} account:");
    log.lines()
        .rev()
        .find_map(|line| line.split_once(&marker).map(|(_, rest)| rest))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// One more pod's ADD and DEL with `flavor` on the full node and on the
/// empty twin, op by op, `ops` of each per repetition.
fn one_more_pod(
    plan: &Plan,
    full: &PodNode,
    empty: &PodNode,
    shape: Shape,
    flavor: Flavor,
    ops: usize,
) -> [(Verb, Vec<Batch>, Vec<Batch>); 2] {
    let nodes = [full, empty];
    let mut add = (Vec::new(), Vec::new());
    let mut del = (Vec::new(), Vec::new());
    let tag = match flavor {
        Flavor::Upstream => "u",
        Flavor::Nftables => "n",
        _ => "e",
    };
    for rep in 0..plan.reps {
        let items: Vec<(String, Vec<PortMapping>)> = (0..ops)
            .map(|i| {
                (
                    format!("m{tag}{}r{rep}-{i}", shape.key()),
                    one_more_mappings(i),
                )
            })
            .collect();
        let sides = [items.as_slice(), items.as_slice()];
        let mut adds = run_interleaved(&sides, |side, (id, mappings)| {
            nodes[side].one_more_op(flavor, CniCommand::Add, id, mappings)
        })
        .into_iter();
        let mut dels = run_interleaved(&sides, |side, (id, mappings)| {
            nodes[side].one_more_op(flavor, CniCommand::Del, id, mappings)
        })
        .into_iter();
        add.0.push(adds.next().expect("two sides"));
        add.1.push(adds.next().expect("two sides"));
        del.0.push(dels.next().expect("two sides"));
        del.1.push(dels.next().expect("two sides"));
    }
    [(Verb::Add, add.0, add.1), (Verb::Del, del.0, del.1)]
}

fn p50(batches: &[Batch]) -> String {
    super::stats::median(&super::results::pct_per_rep(
        batches,
        super::stats::Pct::P50,
    ))
    .map_or("n/a".into(), |v| format!("{v:.1} ms"))
}

/// The pods section: builds the two nodes, fills the full one shape by
/// shape, measures, and removes both (timed: 2 000 namespaces go).
pub fn measure(plan: &Plan, progress: &Progress, results: &mut Results) -> anyhow::Result<()> {
    progress.say("pods: building a node for real pods and its empty twin");
    let mut full = PodNode::new("bench-pods").context("the pods node")?;
    let mut empty = PodNode::new("bench-pods").context("the empty twin node")?;

    // STATUS on a node where nothing is installed: the first call probes
    // (loads and verifies the programs, then records it), later ones not.
    let first = empty.counted(None, |wrapper| empty.status(wrapper));
    let first_cpu = empty.status(&Wrapper::NONE);
    let mut row = empty.status_row(
        "empty".into(),
        "no pod, nothing installed (fresh pin root)".into(),
        STATUS_CALLS * plan.reps,
    );
    row.first_call_cpu_ms = Some(super::stats::ms(first_cpu.cpu));
    row.first_call = Some(first);
    progress.say(&status_line(&row));
    results.status.push(row);

    let mut nftables_failed: Option<String> = None;
    for shape in POD_SHAPES {
        progress.check()?;
        // Upstream's rules of the shape before go first: ebpf-portmap is
        // measured on a node of its own pods only (see the module doc).
        for (node, which) in [(&mut full, "full"), (&mut empty, "empty twin")] {
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
        for (node, which) in [(&full, "full"), (&empty, "empty twin")] {
            if let Some(left) = upstream_leftover(&node.node) {
                return Err(anyhow!(
                    "pods: {which} node before ebpf-portmap's rows of {}: {left}",
                    shape.label()
                ));
            }
        }

        // ebpf-portmap: one more pod, then one counted ADD and DEL.
        let ours = one_more_pod(plan, &full, &empty, shape, Flavor::Ours, plan.scale_ops.0);
        let counted_mappings = one_more_mappings(9_999);
        let add_account = full.counted(Some("ADD"), |wrapper| {
            full.invoker.port_plugin_wrapped(
                &full.ours,
                CniCommand::Add,
                &full.one_more("counted", &counted_mappings),
                &full.probe_prev,
                wrapper,
            )
        });
        let del_account = full.counted(Some("DEL"), |wrapper| {
            full.invoker.port_plugin_wrapped(
                &full.ours,
                CniCommand::Del,
                &full.one_more("counted", &counted_mappings),
                &full.probe_prev,
                wrapper,
            )
        });
        for ((verb, reps, empty_reps), account) in ours.into_iter().zip([add_account, del_account])
        {
            results.pods.push(PodCell {
                shape,
                flavor: Flavor::Ours,
                verb,
                reps,
                empty_reps,
                account: Some(account),
            });
        }

        // STATUS on the installed node.
        let row = full.status_row(
            format!("installed-{}", shape.key()),
            format!("{}, installed", shape.label()),
            STATUS_CALLS * plan.reps,
        );
        progress.say(&status_line(&row));
        results.status.push(row);
        if shape == POD_SHAPES[2] {
            let row = status_beside_adds(&full, shape, plan);
            progress.say(&status_line(&row));
            results.status.push(row);
        }

        // Now the same pods get upstream's rules, for its rows.
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
                    nftables_failed = Some(reason);
                    false
                }
            }
        } else {
            false
        };

        // iptables and nftables portmap on the node of the same pods:
        // batches sized by one untimed ADD + DEL so a slow table stays
        // within the allowance.
        let mut peer_ops = Vec::new();
        for peer in [Flavor::Upstream, Flavor::Nftables] {
            if peer == Flavor::Nftables && !nftables_here {
                continue;
            }
            let warm = one_more_mappings(9_998);
            let pair = full
                .one_more_op(peer, CniCommand::Add, "uwarm", &warm)
                .elapsed
                + full
                    .one_more_op(peer, CniCommand::Del, "uwarm", &warm)
                    .elapsed;
            let fit = (plan
                .upstream_scale_allowance
                .min(progress.left() / 8)
                .as_secs_f64()
                / (pair.as_secs_f64() * 2.0 * plan.reps as f64)) as usize;
            let ops = fit.clamp(1, plan.scale_ops.1);
            peer_ops.push(format!("{} {ops}", peer.label()));
            for (verb, reps, empty_reps) in one_more_pod(plan, &full, &empty, shape, peer, ops) {
                results.pods.push(PodCell {
                    shape,
                    flavor: peer,
                    verb,
                    reps,
                    empty_reps,
                    account: None,
                });
            }
        }
        let cells = |flavor, verb| {
            results
                .pod_cell(flavor, shape, verb)
                .map_or("n/a".into(), |c| {
                    format!(
                        "{} ({}x empty)",
                        p50(&c.reps),
                        super::stats::median(&c.ratio_to_empty(super::stats::Pct::P50))
                            .map_or("n/a".into(), |r| format!("{r:.2}"))
                    )
                })
        };
        progress.say(&format!(
            "pods: {}: ebpf-portmap ADD {}, DEL {}; iptables portmap ADD {}, DEL {}; nftables portmap ADD {}, DEL {} (ops/rep: {}); ADD account: {}",
            shape.label(),
            cells(Flavor::Ours, Verb::Add),
            cells(Flavor::Ours, Verb::Del),
            cells(Flavor::Upstream, Verb::Add),
            cells(Flavor::Upstream, Verb::Del),
            cells(Flavor::Nftables, Verb::Add),
            cells(Flavor::Nftables, Verb::Del),
            peer_ops.join(", "),
            results
                .pod_cell(Flavor::Ours, shape, Verb::Add)
                .and_then(|c| c.account.as_ref())
                .map_or("n/a".into(), |a| a.as_ref().map_or_else(Clone::clone, CallAccount::summary))
        ));
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

/// STATUS calls while [`PARALLEL_ADDS`] callers ADD (then DEL) one more pod
/// each on the node, as a node starting many pods at once sees it.
fn status_beside_adds(node: &PodNode, shape: Shape, plan: &Plan) -> StatusRow {
    let items: Vec<(String, Vec<PortMapping>)> = (0..plan.alone_parallel)
        .map(|i| (format!("par-status-{i}"), one_more_mappings(2_000 + i)))
        .collect();
    let work = deal(&items, PARALLEL_ADDS);
    let done = AtomicBool::new(false);
    let statuses: Mutex<Vec<Timed>> = Mutex::new(Vec::new());
    // What the first failed ADD answered, so a failure says why.
    let first_error: Mutex<Option<String>> = Mutex::new(None);
    let adds = std::thread::scope(|scope| {
        scope.spawn(|| {
            // At least a few calls, however quick the ADDs are.
            let mut made = 0;
            while !done.load(Ordering::SeqCst) || made < 5 {
                let timed = node.status(&Wrapper::NONE);
                statuses.lock().expect("statuses").push(timed);
                made += 1;
            }
        });
        // Set however the batch ends, a panic included: the STATUS loop
        // waits for it.
        let stop = StopOnDrop(&done);
        let adds = run_batch(&work, |(id, mappings)| {
            let timed = node.one_more_op(Flavor::Ours, CniCommand::Add, id, mappings);
            if let Err(e) = &timed.result {
                first_error
                    .lock()
                    .expect("first error")
                    .get_or_insert_with(|| e.clone());
            }
            timed
        });
        drop(stop);
        adds
    });
    let _ = run_batch(&work, |(id, mappings)| {
        node.one_more_op(Flavor::Ours, CniCommand::Del, id, mappings)
    });
    let statuses = statuses.into_inner().expect("statuses");
    let wall: Duration = statuses.iter().map(|t| t.elapsed).sum();
    // The calls are done: a batch of them, replayed, keeps their times.
    let mut batch = run_batch(&[statuses], Timed::clone);
    batch.wall = wall;
    StatusRow {
        key: format!("beside-adds-{}", shape.key()),
        state: format!(
            "{}, installed, during {} ADDs by {PARALLEL_ADDS} callers at once ({} failed{})",
            shape.label(),
            adds.ops(),
            adds.failures,
            first_error
                .into_inner()
                .expect("first error")
                .map_or(String::new(), |e| format!("; the first: {e}"))
        ),
        calls: batch,
        account: node.status_traced(),
        traced_calls: STATUS_TRACED,
        first_call_cpu_ms: None,
        first_call: None,
        beside: Some(adds),
    }
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn status_line(row: &StatusRow) -> String {
    format!(
        "pods: STATUS on {}: {} calls, CPU p50 {} ms, latency p50 {}, {} failed; {}",
        row.state,
        row.calls.ops(),
        row.calls
            .cpu_p50()
            .map_or("n/a".into(), |v| format!("{v:.2}")),
        p50(std::slice::from_ref(&row.calls)),
        row.calls.failures,
        match &row.account {
            Ok(a) => format!(
                "{} traced calls: {} bpf() calls, {} programs loaded",
                row.traced_calls, a.bpf_calls, a.program_loads
            ),
            Err(e) => format!("traced calls failed: {e}"),
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strace_lines_count_bpf_calls_and_program_loads() {
        let trace = "123 bpf(BPF_OBJ_GET, {pathname=\"/sys/fs/bpf/x\"}, 24) = 3\n\
                     123 bpf(BPF_PROG_LOAD, {prog_type=BPF_PROG_TYPE_SCHED_CLS}, 148 <unfinished ...>\n\
                     124 <... bpf resumed>) = 4\n\
                     123 bpf(BPF_MAP_LOOKUP_ELEM, {map_fd=3}, 32) = -1 ENOENT\n";
        let counted = count_bpf(trace);
        assert_eq!(counted.get("BPF_OBJ_GET"), Some(&1));
        assert_eq!(counted.get("BPF_PROG_LOAD"), Some(&1));
        assert_eq!(counted.get("BPF_MAP_LOOKUP_ELEM"), Some(&1));
        assert_eq!(counted.values().sum::<u64>(), 3);
        assert!(count_bpf("").is_empty());
    }

    #[test]
    fn the_last_account_line_of_the_verb_is_read() {
        let log = "2026-12-03T11:00:00Z DEBUG [1] ADD account: netlink_reads=9 link_records=4\n\
                   2026-12-03T11:00:01Z DEBUG [2] DEL account: netlink_reads=5\n\
                   2026-12-03T11:00:02Z DEBUG [3] ADD account: netlink_reads=7 netlink_bytes=900 link_records=3\n";
        let add = last_account(log, "ADD");
        assert_eq!(add.get("netlink_reads"), Some(&7));
        assert_eq!(add.get("netlink_bytes"), Some(&900));
        assert_eq!(last_account(log, "DEL").len(), 1);
        assert!(last_account(log, "CHECK").is_empty());
    }

    #[test]
    fn pods_have_ports_of_their_own_tcp_and_udp() {
        let two = pod_mappings(3, 2);
        assert_eq!(
            two,
            [PortMapping::tcp(30_030, 80), PortMapping::udp(30_031, 53)]
        );
        let ten = pod_mappings(999, 10);
        assert_eq!(ten.len(), 10);
        assert_eq!(ten[9], PortMapping::udp(39_999, 53));
        let more = one_more_mappings(4);
        assert_eq!(
            more,
            [PortMapping::tcp(20_008, 80), PortMapping::udp(20_009, 53)]
        );
    }
}
