//! Pure statistics over samples: percentiles, min/median over repetitions,
//! ratios. No I/O, unit-tested.

use std::time::Duration;

/// The `p`-th percentile (0..=100) of `samples` by the nearest-rank method,
/// or `None` for no samples. `samples` need not be sorted.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The median (nearest-rank lower median for an even count, so the value is
/// always one that was measured).
pub fn median(values: &[f64]) -> Option<f64> {
    percentile(values, 50.0)
}

pub fn min(values: &[f64]) -> Option<f64> {
    values.iter().copied().min_by(f64::total_cmp)
}

pub fn max(values: &[f64]) -> Option<f64> {
    values.iter().copied().max_by(f64::total_cmp)
}

/// Milliseconds as a float.
pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// p50, p90 and p99 of one batch of latencies, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Percentiles {
    pub fn of(samples_ms: &[f64]) -> Option<Percentiles> {
        Some(Percentiles {
            p50: percentile(samples_ms, 50.0)?,
            p90: percentile(samples_ms, 90.0)?,
            p99: percentile(samples_ms, 99.0)?,
        })
    }

    pub fn get(&self, which: Pct) -> f64 {
        match which {
            Pct::P50 => self.p50,
            Pct::P90 => self.p90,
            Pct::P99 => self.p99,
        }
    }
}

/// Which percentile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pct {
    P50,
    P90,
    P99,
}

impl Pct {
    pub fn name(self) -> &'static str {
        match self {
            Pct::P50 => "p50",
            Pct::P90 => "p90",
            Pct::P99 => "p99",
        }
    }
}

/// Minimum and median of one figure over its repetitions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MinMedian {
    pub min: f64,
    pub median: f64,
    pub max: f64,
    pub n: usize,
}

impl MinMedian {
    pub fn of(values: &[f64]) -> Option<MinMedian> {
        Some(MinMedian {
            min: min(values)?,
            median: median(values)?,
            max: max(values)?,
            n: values.len(),
        })
    }
}

/// Element-wise `numerator[i] / denominator[i]` for the repetitions both have
/// (the repetitions are interleaved in time, so rep i of each side ran under
/// the same machine conditions). Zero denominators are skipped.
pub fn paired_ratios(numerator: &[f64], denominator: &[f64]) -> Vec<f64> {
    numerator
        .iter()
        .zip(denominator)
        .filter(|(_, d)| **d > 0.0)
        .map(|(n, d)| n / d)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&samples, 50.0), Some(50.0));
        assert_eq!(percentile(&samples, 90.0), Some(90.0));
        assert_eq!(percentile(&samples, 99.0), Some(99.0));
        assert_eq!(percentile(&samples, 100.0), Some(100.0));
        assert_eq!(percentile(&samples, 0.0), Some(1.0));
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn small_batches_take_the_largest_for_p99() {
        let samples = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(percentile(&samples, 99.0), Some(5.0));
        assert_eq!(percentile(&samples, 90.0), Some(5.0));
        assert_eq!(percentile(&samples, 50.0), Some(3.0));
    }

    #[test]
    fn median_is_a_measured_value() {
        assert_eq!(median(&[1.0, 2.0, 3.0, 4.0]), Some(2.0));
        assert_eq!(median(&[7.0]), Some(7.0));
    }

    #[test]
    fn min_median_max() {
        let summary = MinMedian::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((summary.min, summary.median, summary.max), (1.0, 2.0, 3.0));
        assert_eq!(summary.n, 3);
        assert!(MinMedian::of(&[]).is_none());
    }

    #[test]
    fn ratios_pair_repetitions_and_skip_zero() {
        assert_eq!(
            paired_ratios(&[10.0, 20.0, 30.0], &[2.0, 0.0, 3.0]),
            [5.0, 10.0]
        );
        assert_eq!(paired_ratios(&[1.0], &[1.0, 2.0]), [1.0]);
    }

    #[test]
    fn percentiles_of_a_batch() {
        let samples: Vec<f64> = (1..=1000).map(f64::from).collect();
        let p = Percentiles::of(&samples).unwrap();
        assert_eq!((p.p50, p.p90, p.p99), (500.0, 900.0, 990.0));
        assert_eq!(p.get(Pct::P90), 900.0);
    }
}
