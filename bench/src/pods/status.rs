//! STATUS as a runtime polls it (issue 33): its CPU time and latency per
//! call on a node with nothing installed, at every shape, and beside
//! [`PARALLEL_ADDS`] concurrent ADDs at 1 000 pods; the programs each call
//! loads, counted under strace.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use portmap_tests::PortMapping;
use portmap_tests::cni::CniCommand;
use serde_json::{Value, json};

use super::node::{PodNode, one_more_mappings};
use crate::control::{deal, run_batch};
use crate::invoke::{Timed, Wrapper};
use crate::plan::Plan;
use crate::progress::Progress;
use crate::results::{CallAccount, POD_SHAPES, Results, Shape, StatusRow};
use crate::stats::Pct;
use crate::world::Flavor;

/// STATUS calls per repetition on each node state.
const STATUS_CALLS: usize = 20;
/// STATUS calls run under `strace` on each node state, for the programs
/// they load.
const STATUS_TRACED: usize = 5;
/// Concurrent ADDs (then DELs) the loaded STATUS row runs beside.
const PARALLEL_ADDS: usize = 32;

impl PodNode {
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

/// STATUS on the node where nothing is installed: the first call probes
/// (loads and verifies the programs, then records it), later ones not.
pub(super) fn on_the_empty_node(
    empty: &PodNode,
    plan: &Plan,
    progress: &Progress,
    results: &mut Results,
) {
    let first = empty.counted(None, |wrapper| empty.status(wrapper));
    let first_cpu = empty.status(&Wrapper::NONE);
    let mut row = empty.status_row(
        "empty".into(),
        "no pod, nothing installed (fresh pin root)".into(),
        STATUS_CALLS * plan.reps,
    );
    row.first_call_cpu_ms = Some(crate::stats::ms(first_cpu.cpu));
    row.first_call = Some(first);
    progress.say(&status_line(&row));
    results.status.push(row);
}

/// STATUS on the full node at `shape`, installed, and at 1 000 pods of 2
/// mappings also beside concurrent ADDs.
pub(super) fn on_the_installed_node(
    full: &PodNode,
    shape: Shape,
    plan: &Plan,
    progress: &Progress,
    results: &mut Results,
) {
    let row = full.status_row(
        format!("installed-{}", shape.key()),
        format!("{}, installed", shape.label()),
        STATUS_CALLS * plan.reps,
    );
    progress.say(&status_line(&row));
    results.status.push(row);
    if shape == POD_SHAPES[2] {
        let row = status_beside_adds(full, shape, plan);
        progress.say(&status_line(&row));
        results.status.push(row);
    }
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
        row.calls
            .percentiles()
            .map_or("n/a".into(), |p| format!("{:.1} ms", p.get(Pct::P50))),
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
