//! ethtool generic netlink: the message and attribute numbers we use (from the
//! kernel's uapi `ethtool_netlink_generated.h`), request builders and reply
//! parsers over `crate::netlink::genl`. Pure: no sockets here, so every request
//! is golden-byte tested.

use neli::genl::Nlattr;
use neli::types::Buffer;

use super::bitset;
#[cfg(test)]
use crate::netlink::genl::{get_family, parse_family_id, CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME};
use crate::netlink::genl::{request, single_reply};
use crate::netlink::{attr_nest, attr_str, attr_u32, attr_u8, AttrSet, NlError, NlRequest};
use crate::nic::DataSplit;

pub const FAMILY_NAME: &str = "ethtool";
pub const FAMILY_VERSION: u8 = 1;

// ETHTOOL_MSG_* (user → kernel).
pub const MSG_STRSET_GET: u8 = 1;
pub const MSG_FEATURES_GET: u8 = 11;
pub const MSG_FEATURES_SET: u8 = 12;
pub const MSG_PRIVFLAGS_GET: u8 = 13;
pub const MSG_PRIVFLAGS_SET: u8 = 14;
pub const MSG_RINGS_GET: u8 = 15;
pub const MSG_RINGS_SET: u8 = 16;
pub const MSG_CHANNELS_GET: u8 = 17;
pub const MSG_CHANNELS_SET: u8 = 18;

// Every request's first attribute is its header nest (ETHTOOL_A_*_HEADER = 1).
pub const A_HEADER: u16 = 1;
pub const A_HEADER_DEV_NAME: u16 = 2;
pub const A_HEADER_FLAGS: u16 = 3;
pub const FLAG_COMPACT_BITSETS: u32 = 1;
pub const FLAG_OMIT_REPLY: u32 = 2;

pub const A_STRSET_STRINGSETS: u16 = 2;
pub const A_STRINGSETS_STRINGSET: u16 = 1;
pub const A_STRINGSET_ID: u16 = 1;
pub const A_STRINGSET_COUNT: u16 = 2;
pub const A_STRINGSET_STRINGS: u16 = 3;
pub const A_STRINGS_STRING: u16 = 1;
pub const A_STRING_INDEX: u16 = 1;
pub const A_STRING_VALUE: u16 = 2;
/// `enum ethtool_stringset`: ETH_SS_FEATURES.
pub const ETH_SS_FEATURES: u32 = 4;

pub const A_FEATURES_HW: u16 = 2;
pub const A_FEATURES_WANTED: u16 = 3;
pub const A_FEATURES_ACTIVE: u16 = 4;

pub const A_PRIVFLAGS_FLAGS: u16 = 2;

pub const A_RINGS_RX_MAX: u16 = 2;
pub const A_RINGS_RX: u16 = 6;
pub const A_RINGS_TCP_DATA_SPLIT: u16 = 11;
/// `enum ethtool_tcp_data_split`; its 0 (unknown) reads as [`DataSplit::Unknown`] like any other value.
pub const TCP_DATA_SPLIT_DISABLED: u8 = 1;
pub const TCP_DATA_SPLIT_ENABLED: u8 = 2;

pub const A_CHANNELS_RX_MAX: u16 = 2;
pub const A_CHANNELS_COMBINED_MAX: u16 = 5;
pub const A_CHANNELS_RX_COUNT: u16 = 6;
pub const A_CHANNELS_TX_COUNT: u16 = 7;
pub const A_CHANNELS_COMBINED_COUNT: u16 = 9;

/// An ethtool request on device `ifname`: header nest first, then `attrs`.
fn ethtool(family: u16, cmd: u8, ifname: &str, hdr_flags: u32, attrs: Vec<Nlattr<u16, Buffer>>) -> NlRequest {
    let mut header = vec![attr_str(A_HEADER_DEV_NAME, ifname)];
    if hdr_flags != 0 {
        header.push(attr_u32(A_HEADER_FLAGS, hdr_flags));
    }
    let mut all = vec![attr_nest(A_HEADER, header)];
    all.extend(attrs);
    request(family, cmd, FAMILY_VERSION, all)
}

/// The feature names (`ETH_SS_FEATURES`), in bit order.
pub fn strset_features(family: u16, ifname: &str) -> NlRequest {
    let set = attr_nest(A_STRINGSETS_STRINGSET, vec![attr_u32(A_STRINGSET_ID, ETH_SS_FEATURES)]);
    ethtool(family, MSG_STRSET_GET, ifname, 0, vec![attr_nest(A_STRSET_STRINGSETS, vec![set])])
}

/// Features as compact bitsets (hw / wanted / active / nochange).
pub fn features_get(family: u16, ifname: &str) -> NlRequest {
    ethtool(family, MSG_FEATURES_GET, ifname, FLAG_COMPACT_BITSETS, vec![])
}

/// Turns one feature on or off by name, leaving every other feature alone.
pub fn features_set(family: u16, ifname: &str, name: &str, on: bool) -> NlRequest {
    let wanted = bitset::encode_one(A_FEATURES_WANTED, name, on);
    ethtool(family, MSG_FEATURES_SET, ifname, FLAG_OMIT_REPLY, vec![wanted])
}

/// Private flags, verbose (names and values).
pub fn privflags_get(family: u16, ifname: &str) -> NlRequest {
    ethtool(family, MSG_PRIVFLAGS_GET, ifname, 0, vec![])
}

pub fn privflags_set(family: u16, ifname: &str, name: &str, on: bool) -> NlRequest {
    let flags = bitset::encode_one(A_PRIVFLAGS_FLAGS, name, on);
    ethtool(family, MSG_PRIVFLAGS_SET, ifname, 0, vec![flags])
}

pub fn rings_get(family: u16, ifname: &str) -> NlRequest {
    ethtool(family, MSG_RINGS_GET, ifname, 0, vec![])
}

pub fn rings_set_data_split(family: u16, ifname: &str, on: bool) -> NlRequest {
    let v = if on { TCP_DATA_SPLIT_ENABLED } else { TCP_DATA_SPLIT_DISABLED };
    ethtool(family, MSG_RINGS_SET, ifname, 0, vec![attr_u8(A_RINGS_TCP_DATA_SPLIT, v)])
}

pub fn rings_set_rx(family: u16, ifname: &str, rx: u32) -> NlRequest {
    ethtool(family, MSG_RINGS_SET, ifname, 0, vec![attr_u32(A_RINGS_RX, rx)])
}

pub fn channels_get(family: u16, ifname: &str) -> NlRequest {
    ethtool(family, MSG_CHANNELS_GET, ifname, 0, vec![])
}

/// Sets the rx and/or combined channel counts (`None` leaves one alone).
pub fn channels_set(family: u16, ifname: &str, rx: Option<u32>, combined: Option<u32>) -> NlRequest {
    let mut attrs = Vec::new();
    if let Some(rx) = rx {
        attrs.push(attr_u32(A_CHANNELS_RX_COUNT, rx));
    }
    if let Some(c) = combined {
        attrs.push(attr_u32(A_CHANNELS_COMBINED_COUNT, c));
    }
    ethtool(family, MSG_CHANNELS_SET, ifname, 0, attrs)
}

// ---- replies -----------------------------------------------------------------

/// Largest string set accepted (the kernel's sets hold at most a few thousand).
pub const MAX_STRINGSET: usize = 1 << 16;

/// The strings of the one string set in a STRSET_GET reply, in index order.
pub fn parse_strset(replies: &[Vec<u8>]) -> Result<Vec<String>, NlError> {
    let attrs = single_reply(replies)?;
    let sets = attrs.nested(A_STRSET_STRINGSETS)?.ok_or_else(|| NlError::malformed("no string sets"))?;
    let set = sets.nested(A_STRINGSETS_STRINGSET)?.ok_or_else(|| NlError::malformed("no string set"))?;
    let count = set.u32(A_STRINGSET_COUNT).unwrap_or(0) as usize;
    // The count sizes the table before any string is read: bound it, so a
    // corrupt reply is an error rather than a multi-gigabyte allocation.
    if count > MAX_STRINGSET {
        return Err(NlError::malformed(format!("string set count {count} exceeds {MAX_STRINGSET}")));
    }
    let mut out = vec![String::new(); count];
    if let Some(strings) = set.nested(A_STRINGSET_STRINGS)? {
        for (_, s) in strings.iter().filter(|(t, _)| *t == A_STRINGS_STRING) {
            let s = AttrSet::parse(s)?;
            let idx = s.u32(A_STRING_INDEX).ok_or_else(|| NlError::malformed("string without index"))?;
            let slot = out.get_mut(idx as usize).ok_or_else(|| NlError::malformed("string index ≥ count"))?;
            *slot = s.string(A_STRING_VALUE).unwrap_or_default();
        }
    }
    Ok(out)
}

/// Feature state by bit: `(changeable, active)` bitmaps from a compact FEATURES_GET reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Features {
    pub hw: Vec<bool>,
    pub active: Vec<bool>,
}

pub fn parse_features(replies: &[Vec<u8>]) -> Result<Features, NlError> {
    let attrs = single_reply(replies)?;
    let get = |t| -> Result<Vec<bool>, NlError> {
        let set =
            attrs.nested(t)?.ok_or_else(|| NlError::malformed(format!("feature bitset {t} missing")))?;
        bitset::decode_compact(&set)
    };
    Ok(Features { hw: get(A_FEATURES_HW)?, active: get(A_FEATURES_ACTIVE)? })
}

pub fn parse_privflags(replies: &[Vec<u8>]) -> Result<Vec<(String, bool)>, NlError> {
    let attrs = single_reply(replies)?;
    match attrs.nested(A_PRIVFLAGS_FLAGS)? {
        Some(set) => bitset::decode_verbose(&set),
        None => Ok(Vec::new()),
    }
}

/// Ring parameters we care about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rings {
    pub rx: Option<u32>,
    pub rx_max: Option<u32>,
    pub data_split: DataSplit,
}

pub fn parse_rings(replies: &[Vec<u8>]) -> Result<Rings, NlError> {
    let attrs = single_reply(replies)?;
    let data_split = match attrs.u8(A_RINGS_TCP_DATA_SPLIT) {
        Some(TCP_DATA_SPLIT_DISABLED) => DataSplit::Disabled,
        Some(TCP_DATA_SPLIT_ENABLED) => DataSplit::Enabled,
        _ => DataSplit::Unknown,
    };
    Ok(Rings { rx: attrs.u32(A_RINGS_RX), rx_max: attrs.u32(A_RINGS_RX_MAX), data_split })
}

/// Channel counts; the kernel omits the kinds a driver does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Channels {
    pub rx: u32,
    pub tx: u32,
    pub combined: u32,
    pub rx_max: u32,
    pub combined_max: u32,
}

impl Channels {
    /// Queues that receive: combined channels, or rx-only ones on drivers
    /// (like veth) that have no combined channels.
    pub fn rx_queues(&self) -> u32 {
        if self.combined > 0 {
            self.combined
        } else {
            self.rx
        }
    }
}

pub fn parse_channels(replies: &[Vec<u8>]) -> Result<Channels, NlError> {
    let a = single_reply(replies)?;
    let v = |t| a.u32(t).unwrap_or(0);
    Ok(Channels {
        rx: v(A_CHANNELS_RX_COUNT),
        tx: v(A_CHANNELS_TX_COUNT),
        combined: v(A_CHANNELS_COMBINED_COUNT),
        rx_max: v(A_CHANNELS_RX_MAX),
        combined_max: v(A_CHANNELS_COMBINED_MAX),
    })
}

#[cfg(all(test, target_endian = "little"))]
mod tests;
