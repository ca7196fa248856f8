//! STUB (lead's placeholder until the kernel-bans branch lands).
pub const RULE_BAN: u32 = 1 << 8;
pub const MAX_BAN_AFTER: u32 = 1 << 18;
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BanParams {
    pub ban_for_ns: u64,
    pub ban_max_ns: u64,
    pub ban_after: u32,
    pub _pad: u32,
}
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ban {
    pub end_ns: u64,
    pub len_ns: u64,
    pub start_ns: u64,
    pub drops: u64,
    pub rule_slot: u32,
    pub count: u32,
}
