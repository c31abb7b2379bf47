fn main() -> aya_build::Result<()> {
    aya_build::emit_bpf_target_arch_cfg()
}
