//! The hairpin rows themselves: which pod a pod dials through the node
//! (route), in which family, with which tests, and the id of each row.
//! Data only, here in the results that key their cells and judge their
//! targets by it; the `hairpin` section, which measures the rows, imports
//! it from here.

use crate::load::Test;

/// Whose hostPort a pod dials through the node's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The pod that serves the port.
    ToItself,
    /// Another pod on the same bridge.
    ToAnotherPod,
}

impl Route {
    pub const BOTH: [Route; 2] = [Route::ToItself, Route::ToAnotherPod];

    pub fn key(self) -> &'static str {
        match self {
            Route::ToItself => "itself",
            Route::ToAnotherPod => "other-pod",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Route::ToItself => "pod -> nodeIP:hostPort mapped to itself",
            Route::ToAnotherPod => "pod -> nodeIP:hostPort of another pod",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const BOTH: [Family; 2] = [Family::V4, Family::V6];

    pub fn key(self) -> &'static str {
        match self {
            Family::V4 => "v4",
            Family::V6 => "v6",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

/// The tests of the hairpin rows (throughput has no hairpin target).
pub const TESTS: [Test; 3] = [Test::TcpRr, Test::TcpCrr, Test::UdpRr];

/// The id of a hairpin target row, e.g. `hairpin-itself-v4-tcp_crr`.
pub fn row_id(route: Route, family: Family, test: Test) -> String {
    format!("hairpin-{}-{}-{}", route.key(), family.key(), test.key())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_ids_name_route_family_and_test() {
        assert_eq!(
            row_id(Route::ToItself, Family::V4, Test::TcpCrr),
            "hairpin-itself-v4-tcp_crr"
        );
        assert_eq!(
            row_id(Route::ToAnotherPod, Family::V6, Test::UdpRr),
            "hairpin-other-pod-v6-udp_rr"
        );
    }

    #[test]
    fn row_ids_are_unique() {
        let mut ids: Vec<String> = Route::BOTH
            .iter()
            .flat_map(|&r| {
                Family::BOTH
                    .iter()
                    .flat_map(move |&f| TESTS.iter().map(move |&t| row_id(r, f, t)))
            })
            .collect();
        let all = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), all, "two hairpin rows share an id: {ids:?}");
    }
}
