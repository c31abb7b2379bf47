//! Putting this build's programs in place and keeping them there: the tc
//! hooks, bridge ports, socket hooks and the namespace beacon, the load that
//! replaces an older build, and the records that let a run trust what it
//! finds.

mod beacon;
pub mod cgroup;
pub mod crash;
mod ensure;
mod error;
mod hook;
pub mod pass;
mod ports;
pub mod stale;
pub mod tcx;
mod upgrade;

pub use ensure::{LinkPins, Targets, attachments_current, ensure};
pub use error::AttachError;
pub use hook::{attach_mode, detach_clsact, is_attached, tcx_program_ids};
pub use pass::{PortsRecord, Recorded, invalidate_pass, pass_record, recorded_pass};
pub use ports::{forget_port, port_pins};
pub use upgrade::{check_pinned_layouts, probe};
