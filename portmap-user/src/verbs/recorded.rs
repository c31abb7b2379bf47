//! Each CNI run's outcome and duration, recorded in the pinned `verb_stats`
//! map ([`crate::dataplane::verb_stats`]), which the node agent exports.
//! Every exit is counted, the requests refused before the plugin is reached
//! (a broken conflist: codes 1, 4, 6, 7) included: they are what an alert
//! on failures exists for. Nothing is created on a node where the dataplane
//! is not installed (a DEL there must leave nothing behind), and a failure
//! to record is logged at debug level only: the verb's result never depends
//! on its record.

use std::{path::PathBuf, time::Duration};

use crate::{
    cni::{Outcome, env::Command},
    dataplane::{scope, verb_stats::VerbStats},
};

/// The slot index of `command` in [`portmap_common::verb_stats::VERBS`];
/// `None` for VERSION, which is not counted.
fn verb_index(command: Command) -> Option<usize> {
    match command {
        Command::Add => Some(0),
        Command::Del => Some(1),
        Command::Check => Some(2),
        Command::Gc => Some(3),
        Command::Status => Some(4),
        Command::Version => None,
    }
}

/// Records `outcome` (best effort) under the pin root the verb resolved,
/// else under `pin_root()`, the configuration's; `took` is how long the run
/// took.
pub fn record(outcome: &Outcome, took: Duration, pin_root: impl FnOnce() -> PathBuf) {
    let Some(verb) = outcome.command.and_then(verb_index) else {
        return;
    };
    // Where the verb found this namespace's state. A request refused
    // before the plugin looked (a configuration error) resolves it here,
    // so that such a failure is counted too.
    let layout = match scope::last_resolved() {
        Some(layout) => layout,
        None => match scope::resolve(&pin_root(), scope::Access::Read) {
            Ok(layout) => layout,
            Err(error) => {
                log::debug!("{} not recorded: {error}", outcome_verb(verb));
                return;
            }
        },
    };
    let stats = match VerbStats::open(&layout) {
        Ok(Some(stats)) => Ok(stats),
        // Nothing installed (never an ADD here, or uninstalled): nothing
        // to count into, and a run must not start a pin tree of its own.
        Ok(None) if !layout.maps_dir().exists() => return,
        Ok(None) => VerbStats::open_or_create(&layout),
        Err(error) => Err(error),
    };
    match stats {
        Ok(stats) => stats.record(verb, outcome.code, took),
        Err(error) => log::debug!("{} not recorded: {error}", outcome_verb(verb)),
    }
}

fn outcome_verb(verb: usize) -> &'static str {
    portmap_common::verb_stats::VERBS[verb]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counted_verb_has_its_slot_name() {
        for command in [
            Command::Add,
            Command::Del,
            Command::Check,
            Command::Gc,
            Command::Status,
        ] {
            let index = verb_index(command).expect("a counted verb");
            assert_eq!(outcome_verb(index), command.as_str());
        }
        assert_eq!(verb_index(Command::Version), None);
    }
}
