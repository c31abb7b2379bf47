//! Putting this build's programs in place and keeping them there: the tc
//! hooks, bridge ports, socket hooks and the namespace beacon, the load that
//! replaces an older build, and the records that let a run trust what it
//! finds.

pub mod cgroup;
pub mod crash;
mod ensure;
pub mod pass;
pub mod stale;
pub mod tcx;

pub use ensure::{
    AttachError, LinkPins, PortsRecord, Recorded, Targets, attach_mode, attachments_current,
    check_pinned_layouts, detach_clsact, ensure, forget_port, invalidate_pass, is_attached,
    pass_record, port_pins, probe, recorded_pass, tcx_program_ids,
};
