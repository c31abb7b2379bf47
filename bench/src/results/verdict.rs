//! A target's verdict: how a value is compared with its threshold, PASS,
//! MISS or SKIP, and the judged row the report shows.

use crate::stats::MinMedian;

/// How a measured value is compared with its threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    AtLeast,
    AtMost,
    Above,
}

impl Compare {
    pub fn symbol(self) -> &'static str {
        match self {
            Compare::AtLeast => ">=",
            Compare::AtMost => "<=",
            Compare::Above => ">",
        }
    }

    fn holds(self, value: f64, threshold: f64) -> bool {
        match self {
            Compare::AtLeast => value >= threshold,
            Compare::AtMost => value <= threshold,
            Compare::Above => value > threshold,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Pass,
    Miss,
    Skip,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Miss => "MISS",
            Status::Skip => "SKIP",
        }
    }
}

/// One target, judged.
#[derive(Debug, Clone)]
pub struct TargetRow {
    pub id: String,
    pub text: String,
    pub compare: Compare,
    pub threshold: f64,
    /// The per-repetition values the verdict is taken from (their median).
    pub values: Vec<f64>,
    pub unit: &'static str,
    pub status: Status,
    pub stretch: bool,
    pub detail: String,
}

impl TargetRow {
    pub fn summary(&self) -> Option<MinMedian> {
        MinMedian::of(&self.values)
    }
}

pub(super) fn ratio_target(
    id: &str,
    text: String,
    values: Vec<f64>,
    compare: Compare,
    threshold: f64,
    stretch: bool,
    detail: String,
) -> TargetRow {
    let status = match MinMedian::of(&values) {
        None => Status::Skip,
        Some(s) if compare.holds(s.median, threshold) => Status::Pass,
        Some(_) => Status::Miss,
    };
    TargetRow {
        id: id.to_owned(),
        text,
        compare,
        threshold,
        values,
        unit: "x",
        status,
        stretch,
        detail,
    }
}

/// The unit of a target row that is reported, not judged (its detail
/// says where the numbers are).
pub const REPORTED: &str = "reported";
