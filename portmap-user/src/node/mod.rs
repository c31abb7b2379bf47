//! Read-only facts about the host: its links and addresses ([`netlink`]),
//! the sockets listening on it ([`listeners`]), whether a container's
//! network namespace is still there ([`sandbox`]), the privileges this
//! process holds ([`privilege`]), whether anything is hooked at
//! netfilter's FORWARD ([`forward_hooks`]) and which nftables tables
//! exist, firewalld's among them ([`nft_tables`]).

pub mod forward_hooks;
pub mod listeners;
pub mod netlink;
pub mod nft_tables;
pub mod privilege;
pub mod sandbox;
