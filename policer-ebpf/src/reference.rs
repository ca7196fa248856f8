//! Reference XDP programs for the benchmark (`cargo xtask bench`): floors
//! measured in the same run as the policer. Not part of the product.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]

#[cfg(target_arch = "bpf")]
mod programs {
    use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};

    #[xdp]
    pub fn xdp_pass(_ctx: XdpContext) -> u32 {
        xdp_action::XDP_PASS
    }

    #[xdp]
    pub fn xdp_drop(_ctx: XdpContext) -> u32 {
        xdp_action::XDP_DROP
    }

    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
}

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("reference XDP programs for the benchmark; built for bpfel-unknown-none by policer-user");
}
