//! Read-only facts about the host: its links and addresses ([`netlink`]),
//! the sockets listening on it ([`listeners`]) and the privileges this
//! process holds ([`privilege`]).

pub mod listeners;
pub mod netlink;
pub mod privilege;
