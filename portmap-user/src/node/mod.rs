//! Read-only facts about the host: its links and addresses ([`netlink`]),
//! the sockets listening on it ([`listeners`]), whether a container's
//! network namespace is still there ([`sandbox`]) and the privileges this
//! process holds ([`privilege`]).

pub mod listeners;
pub mod netlink;
pub mod privilege;
pub mod sandbox;
