//! What is loaded for this kernel: the embedded eBPF [`object`], its kfunc
//! calls linked by [`kfunc`], and the kernel's [`features`].

pub mod features;
pub mod kfunc;
pub mod object;
