//! Control-plane batches: many ADDs (or DELs) run by `callers` threads at
//! once, each timed on its own, plus the batch's wall time.

use std::collections::BTreeMap;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::invoke::Timed;
use super::stats::{Percentiles, ms};

/// How many failure messages a batch keeps (the count is always exact).
const KEPT_FAILURES: usize = 5;

/// What one batch measured.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub callers: usize,
    /// Latency of every operation, in milliseconds (failed ones included).
    pub latencies_ms: Vec<f64>,
    /// CPU time of every operation's plugin processes, in milliseconds.
    pub cpu_ms: Vec<f64>,
    pub failures: usize,
    /// Failures by the plugin that failed (the first word of the message).
    pub failures_by_plugin: BTreeMap<String, usize>,
    /// The first few failure messages.
    pub failure_samples: Vec<String>,
    /// From the moment all callers were released until the last finished.
    pub wall: Duration,
}

impl Batch {
    pub fn ops(&self) -> usize {
        self.latencies_ms.len()
    }

    /// Completed operations (successful or not) per second of wall time.
    pub fn ops_per_s(&self) -> f64 {
        let secs = self.wall.as_secs_f64();
        if secs > 0.0 {
            self.ops() as f64 / secs
        } else {
            0.0
        }
    }

    pub fn percentiles(&self) -> Option<Percentiles> {
        Percentiles::of(&self.latencies_ms)
    }

    /// Median CPU time per operation, in milliseconds.
    pub fn cpu_p50(&self) -> Option<f64> {
        super::stats::median(&self.cpu_ms)
    }

    pub fn to_json(&self) -> Value {
        let p = self.percentiles();
        json!({
            "callers": self.callers,
            "ops": self.ops(),
            "failures": self.failures,
            "failures_by_plugin": self.failures_by_plugin,
            "failure_samples": self.failure_samples,
            "wall_s": self.wall.as_secs_f64(),
            "ops_per_s": self.ops_per_s(),
            "p50_ms": p.map(|p| p.p50),
            "p90_ms": p.map(|p| p.p90),
            "p99_ms": p.map(|p| p.p99),
            "cpu_p50_ms": self.cpu_p50(),
        })
    }
}

/// Runs `work[i]` on caller thread `i` (each caller runs its items in
/// order), all callers released together, and times every `op`.
pub fn run_batch<T: Sync>(work: &[Vec<T>], op: impl Fn(&T) -> Timed + Sync) -> Batch {
    let callers = work.len();
    let barrier = Barrier::new(callers + 1);
    let results: Mutex<Vec<Timed>> = Mutex::new(Vec::new());
    // The scope joins every caller before it returns, so the time since the
    // release is the batch's wall time.
    let released = std::thread::scope(|scope| {
        for items in work {
            let barrier = &barrier;
            let results = &results;
            let op = &op;
            scope.spawn(move || {
                barrier.wait();
                let mine: Vec<Timed> = items.iter().map(op).collect();
                results
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .extend(mine);
            });
        }
        // Taken before the main thread's arrival releases the callers, so
        // no operation starts before it.
        let released = Instant::now();
        barrier.wait();
        released
    });
    let wall = released.elapsed();
    let results = results
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut batch = Batch {
        callers,
        wall,
        ..Batch::default()
    };
    for timed in results {
        record(&mut batch, timed);
    }
    batch
}

/// Runs several sequential batches ("sides") interleaved operation by
/// operation, each side kept in proportion to its size (the side with the
/// smallest share done goes next), so a slow phase of the shared machine
/// hits every side alike. `op(side, item)` runs one operation. Returns one
/// batch per side; its wall time is the sum of its own operations.
pub fn run_interleaved<T>(sides: &[&[T]], op: impl Fn(usize, &T) -> Timed) -> Vec<Batch> {
    let mut done = vec![0usize; sides.len()];
    let mut batches: Vec<Batch> = sides
        .iter()
        .map(|_| Batch {
            callers: 1,
            ..Batch::default()
        })
        .collect();
    let total: usize = sides.iter().map(|s| s.len()).sum();
    for _ in 0..total {
        let next = (0..sides.len())
            .filter(|&i| done[i] < sides[i].len())
            .min_by(|&a, &b| {
                let share = |i: usize| done[i] as f64 / sides[i].len() as f64;
                share(a).total_cmp(&share(b))
            });
        let Some(side) = next else {
            break;
        };
        let timed = op(side, &sides[side][done[side]]);
        done[side] += 1;
        batches[side].wall += timed.elapsed;
        record(&mut batches[side], timed);
    }
    batches
}

fn record(batch: &mut Batch, timed: Timed) {
    batch.latencies_ms.push(ms(timed.elapsed));
    batch.cpu_ms.push(ms(timed.cpu));
    if let Err(e) = timed.result {
        batch.failures += 1;
        let plugin = e.split_whitespace().next().unwrap_or("?").to_owned();
        *batch.failures_by_plugin.entry(plugin).or_default() += 1;
        if batch.failure_samples.len() < KEPT_FAILURES {
            batch.failure_samples.push(e);
        }
    }
}

/// Splits `items` round-robin over `callers` lists.
pub fn deal<T: Clone>(items: &[T], callers: usize) -> Vec<Vec<T>> {
    let callers = callers.max(1);
    let mut work = vec![Vec::new(); callers];
    for (i, item) in items.iter().enumerate() {
        work[i % callers].push(item.clone());
    }
    work
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dealing_is_round_robin() {
        let work = deal(&[1, 2, 3, 4, 5], 2);
        assert_eq!(work, vec![vec![1, 3, 5], vec![2, 4]]);
        assert_eq!(deal(&[1], 0), vec![vec![1]]);
    }

    #[test]
    fn interleaving_keeps_sides_in_proportion() {
        let order = Mutex::new(Vec::new());
        let big = [0, 1, 2, 3, 4, 5];
        let small = [10, 11];
        let batches = run_interleaved(&[&big[..], &small[..]], |side, &item| {
            order.lock().unwrap().push((side, item));
            Timed {
                elapsed: Duration::from_millis(1),
                cpu: Duration::ZERO,
                result: Ok(Value::Null),
            }
        });
        assert_eq!(
            order.into_inner().unwrap(),
            [
                (0, 0),
                (1, 10),
                (0, 1),
                (0, 2),
                (0, 3),
                (1, 11),
                (0, 4),
                (0, 5)
            ]
        );
        assert_eq!(batches[0].ops(), 6);
        assert_eq!(batches[1].ops(), 2);
        assert_eq!(batches[1].wall, Duration::from_millis(2));
    }

    #[test]
    fn a_batch_times_every_op_and_counts_failures() {
        let work = deal(&[1u64, 2, 3, 4], 4);
        let batch = run_batch(&work, |&n| {
            std::thread::sleep(Duration::from_millis(n));
            Timed {
                elapsed: Duration::from_millis(n),
                cpu: Duration::from_millis(n) / 2,
                result: if n == 3 {
                    Err("boom".into())
                } else {
                    Ok(Value::Null)
                },
            }
        });
        assert_eq!(batch.ops(), 4);
        assert_eq!(batch.failures, 1);
        assert_eq!(batch.failure_samples, ["boom"]);
        assert_eq!(batch.failures_by_plugin.get("boom"), Some(&1));
        assert_eq!(batch.cpu_p50(), Some(1.0));
        assert!(batch.wall >= Duration::from_millis(4), "{:?}", batch.wall);
        assert!(batch.wall < Duration::from_secs(2), "{:?}", batch.wall);
    }
}
