//! The `SIOCETHTOOL` ioctl, for what ethtool netlink lacks: ntuple rules,
//! the RSS indirection table and driver statistics. [`EthtoolIoctl`] owns the
//! socket the ioctls go through; every buffer handed to the kernel is built
//! and sized inside this file, which is why the unsafe stays here.

use std::ffi::c_void;
use std::mem::size_of;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

use crate::netlink::c_string;
use crate::types::ifname::{ifname_field, IFNAMSIZ};

pub const SIOCETHTOOL: u32 = 0x8946;

pub const ETHTOOL_GDRVINFO: u32 = 0x03;
pub const ETHTOOL_GSTRINGS: u32 = 0x1b;
pub const ETHTOOL_GSTATS: u32 = 0x1d;
pub const ETHTOOL_GRXRINGS: u32 = 0x2d;
pub const ETHTOOL_GRXCLSRLCNT: u32 = 0x2e;
pub const ETHTOOL_GRXCLSRULE: u32 = 0x2f;
pub const ETHTOOL_GRXCLSRLALL: u32 = 0x30;
pub const ETHTOOL_SRXCLSRLDEL: u32 = 0x31;
pub const ETHTOOL_SRXCLSRLINS: u32 = 0x32;
pub const ETHTOOL_GSSET_INFO: u32 = 0x37;
pub const ETHTOOL_GRXFHINDIR: u32 = 0x38;
pub const ETHTOOL_SRXFHINDIR: u32 = 0x39;

/// `enum ethtool_stringset`: ETH_SS_STATS.
pub const ETH_SS_STATS: u32 = 1;
pub const ETH_GSTRING_LEN: usize = 32;
/// Flag in GRXCLSRLCNT's `data`: the driver accepts special locations.
pub const RX_CLS_LOC_SPECIAL: u64 = 0x8000_0000;

/// `struct ethtool_flow_ext`: 20 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EthtoolFlowExt {
    pub padding: [u8; 2],
    pub h_dest: [u8; 6],
    pub vlan_etype: u16,
    pub vlan_tci: u16,
    pub data: [u32; 2],
}

/// `struct ethtool_rx_flow_spec`: 168 bytes. `h_u`/`m_u` are the 52-byte
/// `union ethtool_flow_union`, kept as bytes (see `rxnfc.rs` for the layouts).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthtoolRxFlowSpec {
    pub flow_type: u32,
    pub h_u: [u8; 52],
    pub h_ext: EthtoolFlowExt,
    pub m_u: [u8; 52],
    pub m_ext: EthtoolFlowExt,
    pub ring_cookie: u64,
    pub location: u32,
}

impl Default for EthtoolRxFlowSpec {
    fn default() -> Self {
        EthtoolRxFlowSpec {
            flow_type: 0,
            h_u: [0; 52],
            h_ext: EthtoolFlowExt::default(),
            m_u: [0; 52],
            m_ext: EthtoolFlowExt::default(),
            ring_cookie: 0,
            location: 0,
        }
    }
}

/// `struct ethtool_rxnfc` without its trailing `rule_locs[]`: 192 bytes.
/// `rule_cnt` shares its slot with `rss_context` (a union in C).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EthtoolRxnfc {
    pub cmd: u32,
    pub flow_type: u32,
    pub data: u64,
    pub fs: EthtoolRxFlowSpec,
    pub rule_cnt: u32,
}

/// Offset of `rule_locs[]` in `struct ethtool_rxnfc`: right after `rule_cnt`,
/// inside the struct's tail padding (the kernel writes them there).
pub const RXNFC_RULE_LOCS_OFFSET: usize = 188;

/// `struct ethtool_sset_info` with room for one count (we query one set).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct EthtoolSsetInfo {
    cmd: u32,
    reserved: u32,
    sset_mask: u64,
    data: [u32; 1],
}

/// `struct ifreq` as SIOCETHTOOL reads it: the name and `ifr_data`, padded to
/// the 40 bytes the kernel copies in.
#[repr(C)]
struct IfreqData {
    name: [u8; IFNAMSIZ],
    data: *mut c_void,
    _pad: [u8; 16],
}

/// Commands whose whole buffer is one [`EthtoolRxnfc`].
const RXNFC_CMDS: [u32; 5] =
    [ETHTOOL_GRXRINGS, ETHTOOL_GRXCLSRLCNT, ETHTOOL_GRXCLSRULE, ETHTOOL_SRXCLSRLDEL, ETHTOOL_SRXCLSRLINS];

/// Extra stat slots beyond the count we read first: the count only changes
/// when the driver reconfigures (e.g. its queue count), and GSTATS/GSTRINGS
/// write the driver's current count without a user bound.
const STATS_SLACK: usize = 4096;

/// A socket used only as a handle for `SIOCETHTOOL`; the interface is named
/// per call. Lives in the network namespace it was opened in.
#[derive(Debug)]
pub struct EthtoolIoctl {
    sock: OwnedFd,
}

impl EthtoolIoctl {
    pub fn open() -> Result<Self, Errno> {
        let sock = socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)
            .or_else(|_| socket(AddressFamily::Unix, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None))?;
        Ok(EthtoolIoctl { sock })
    }

    /// # Safety
    /// `data` must point to a writable buffer at least as large as what the
    /// kernel reads and writes for the command in its first four bytes, given
    /// the sizes filled into that buffer's header.
    unsafe fn raw(&self, ifname: &str, data: *mut c_void) -> Result<(), Errno> {
        let mut ifr = IfreqData { name: ifname_bytes(ifname)?, data, _pad: [0; 16] };
        // SAFETY: `ifr` is a valid 40-byte ifreq living across the call; the
        // caller guarantees `data` per this function's contract.
        let rc = unsafe { libc::ioctl(self.sock.as_raw_fd(), SIOCETHTOOL as _, &mut ifr as *mut IfreqData) };
        Errno::result(rc).map(drop)
    }

    /// GDRVINFO (`ethtool -i`): driver name, driver version, firmware version, bus info.
    pub fn drvinfo(&self, ifname: &str) -> Result<[String; 4], Errno> {
        // struct ethtool_drvinfo: cmd, five 32-byte strings, 12 reserved
        // bytes, five u32 counts: 196 bytes.
        let mut buf = [0u8; 196];
        buf[..4].copy_from_slice(&ETHTOOL_GDRVINFO.to_ne_bytes());
        // SAFETY: the kernel copies sizeof(struct ethtool_drvinfo) = 196
        // bytes in and out; `buf` has exactly that size.
        unsafe { self.raw(ifname, buf.as_mut_ptr().cast())? };
        let field = |i: usize| c_string(&buf[4 + 32 * i..4 + 32 * (i + 1)]);
        Ok([field(0), field(1), field(2), field(3)])
    }

    /// A command whose buffer is exactly one `struct ethtool_rxnfc`.
    pub fn rxnfc(&self, ifname: &str, nfc: &mut EthtoolRxnfc) -> Result<(), Errno> {
        if !RXNFC_CMDS.contains(&nfc.cmd) {
            return Err(Errno::EINVAL);
        }
        // SAFETY: for these commands the kernel copies exactly
        // sizeof(struct ethtool_rxnfc) = 192 bytes in and out (no FLOW_RSS
        // and no rule_locs), and `nfc` is a 192-byte repr(C) struct.
        unsafe { self.raw(ifname, (nfc as *mut EthtoolRxnfc).cast()) }
    }

    /// GRXCLSRLALL: the locations of the installed rules (at most `max`) and
    /// the size of the rule table.
    pub fn rule_locs(&self, ifname: &str, max: u32) -> Result<(u64, Vec<u32>), Errno> {
        // u32 words: cmd @0, data (u64) @8, rule_cnt @184, rule_locs @188.
        let head = RXNFC_RULE_LOCS_OFFSET / 4;
        let mut buf = vec![0u32; (head + max as usize).max(size_of::<EthtoolRxnfc>() / 4)];
        buf[0] = ETHTOOL_GRXCLSRLALL;
        buf[184 / 4] = max;
        // SAFETY: the kernel reads and writes the 192-byte rxnfc header and
        // writes at most `rule_cnt` (= `max`) locations from byte 188; `buf`
        // holds max(192, 188 + 4 * max) bytes.
        unsafe { self.raw(ifname, buf.as_mut_ptr().cast())? };
        let data = u64::from(buf[2]) | (u64::from(buf[3]) << 32);
        let cnt = (buf[184 / 4] as usize).min(max as usize);
        Ok((data, buf[head..head + cnt].to_vec()))
    }

    /// The number of strings in string set `set`, `None` if the driver has none.
    pub fn sset_count(&self, ifname: &str, set: u32) -> Result<Option<u32>, Errno> {
        let mut info = EthtoolSsetInfo { cmd: ETHTOOL_GSSET_INFO, sset_mask: 1 << set, ..Default::default() };
        // SAFETY: with one bit in `sset_mask` the kernel reads the 16-byte
        // header and writes at most one u32 after it; `info` has 24 bytes.
        unsafe { self.raw(ifname, (&mut info as *mut EthtoolSsetInfo).cast())? };
        Ok((info.sset_mask & (1 << set) != 0).then_some(info.data[0]))
    }

    /// The strings of set `set` (`count` from [`Self::sset_count`]).
    pub fn strings(&self, ifname: &str, set: u32, count: u32) -> Result<Vec<String>, Errno> {
        let cap = count as usize + STATS_SLACK;
        // u32 words: cmd, string_set, len, then cap * 32 bytes of strings.
        let mut buf = vec![0u32; 3 + cap * ETH_GSTRING_LEN / 4];
        buf[0] = ETHTOOL_GSTRINGS;
        buf[1] = set;
        buf[2] = count;
        // SAFETY: the kernel writes the 12-byte header and `len` * 32 bytes,
        // `len` being the driver's current count (= `count` unless the driver
        // reconfigured in between; `STATS_SLACK` entries of headroom cover that).
        unsafe { self.raw(ifname, buf.as_mut_ptr().cast())? };
        let len = (buf[2] as usize).min(cap);
        let bytes: Vec<u8> =
            buf[3..3 + len * ETH_GSTRING_LEN / 4].iter().flat_map(|w| w.to_ne_bytes()).collect();
        Ok(bytes.chunks(ETH_GSTRING_LEN).map(c_string).collect())
    }

    /// The driver's statistics (`count` from [`Self::sset_count`] of ETH_SS_STATS).
    pub fn stats(&self, ifname: &str, count: u32) -> Result<Vec<u64>, Errno> {
        let cap = count as usize + STATS_SLACK;
        let mut buf = vec![0u64; 1 + cap];
        buf[0] = u64::from_ne_bytes(words(ETHTOOL_GSTATS, count));
        // SAFETY: the kernel writes the 8-byte header and n_stats * 8 bytes,
        // n_stats being the driver's current count (see `strings`).
        unsafe { self.raw(ifname, buf.as_mut_ptr().cast())? };
        let n =
            (u32::from_ne_bytes(buf[0].to_ne_bytes()[4..].try_into().expect("4 bytes")) as usize).min(cap);
        Ok(buf[1..1 + n].to_vec())
    }

    /// The RSS indirection table.
    pub fn rss_get(&self, ifname: &str) -> Result<Vec<u32>, Errno> {
        let mut head = [ETHTOOL_GRXFHINDIR, 0];
        // SAFETY: with size 0 the kernel reads and writes only the 8-byte header.
        unsafe { self.raw(ifname, head.as_mut_ptr().cast())? };
        let size = head[1] as usize;
        let mut buf = vec![0u32; 2 + size];
        buf[0] = ETHTOOL_GRXFHINDIR;
        buf[1] = size as u32;
        // SAFETY: the kernel rejects a size other than the device's (EINVAL)
        // and otherwise writes `size` entries after the header; `buf` has them.
        unsafe { self.raw(ifname, buf.as_mut_ptr().cast())? };
        Ok(buf[2..].to_vec())
    }

    /// Replaces the RSS indirection table (`table.len()` must be the device's size).
    pub fn rss_set(&self, ifname: &str, table: &[u32]) -> Result<(), Errno> {
        // A size of 0 would reset the table to the driver's default spread.
        if table.is_empty() {
            return Err(Errno::EINVAL);
        }
        let mut buf = Vec::with_capacity(2 + table.len());
        buf.extend_from_slice(&[ETHTOOL_SRXFHINDIR, table.len() as u32]);
        buf.extend_from_slice(table);
        // SAFETY: the kernel reads the header and, if `size` matches the
        // device's table, `size` entries, all of which `buf` holds.
        unsafe { self.raw(ifname, buf.as_mut_ptr().cast()) }
    }
}

/// Two u32s laid out as the first 8 bytes of a struct (`cmd`, then a count).
fn words(a: u32, b: u32) -> [u8; 8] {
    let mut w = [0u8; 8];
    w[..4].copy_from_slice(&a.to_ne_bytes());
    w[4..].copy_from_slice(&b.to_ne_bytes());
    w
}

fn ifname_bytes(ifname: &str) -> Result<[u8; IFNAMSIZ], Errno> {
    ifname_field(ifname).ok_or(Errno::ENODEV)
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use super::*;

    #[test]
    fn layouts_match_the_kernel_abi() {
        assert_eq!(size_of::<EthtoolFlowExt>(), 20);
        assert_eq!(size_of::<EthtoolRxFlowSpec>(), 168);
        assert_eq!(offset_of!(EthtoolRxFlowSpec, flow_type), 0);
        assert_eq!(offset_of!(EthtoolRxFlowSpec, h_u), 4);
        assert_eq!(offset_of!(EthtoolRxFlowSpec, h_ext), 56);
        assert_eq!(offset_of!(EthtoolRxFlowSpec, m_u), 76);
        assert_eq!(offset_of!(EthtoolRxFlowSpec, m_ext), 128);
        assert_eq!(offset_of!(EthtoolRxFlowSpec, ring_cookie), 152);
        assert_eq!(offset_of!(EthtoolRxFlowSpec, location), 160);
        assert_eq!(size_of::<EthtoolRxnfc>(), 192);
        assert_eq!(offset_of!(EthtoolRxnfc, cmd), 0);
        assert_eq!(offset_of!(EthtoolRxnfc, flow_type), 4);
        assert_eq!(offset_of!(EthtoolRxnfc, data), 8);
        assert_eq!(offset_of!(EthtoolRxnfc, fs), 16);
        assert_eq!(offset_of!(EthtoolRxnfc, rule_cnt), 184);
        assert_eq!(offset_of!(EthtoolSsetInfo, sset_mask), 8);
        assert_eq!(offset_of!(EthtoolSsetInfo, data), 16);
        assert_eq!(size_of::<IfreqData>(), 40);
        assert_eq!(offset_of!(IfreqData, data), 16);
        assert_eq!(size_of::<IfreqData>(), size_of::<libc::ifreq>());
    }

    #[test]
    fn command_numbers() {
        assert_eq!(SIOCETHTOOL as libc::c_ulong, 0x8946);
        let cmds = [
            ETHTOOL_GRXCLSRLCNT,
            ETHTOOL_GRXCLSRULE,
            ETHTOOL_GRXCLSRLALL,
            ETHTOOL_SRXCLSRLDEL,
            ETHTOOL_SRXCLSRLINS,
            ETHTOOL_GSSET_INFO,
            ETHTOOL_GRXFHINDIR,
            ETHTOOL_SRXFHINDIR,
        ];
        assert_eq!(cmds, [0x2e, 0x2f, 0x30, 0x31, 0x32, 0x37, 0x38, 0x39]);
    }

    #[test]
    fn interface_names_are_checked() {
        assert!(ifname_bytes("eth1").is_ok());
        assert_eq!(ifname_bytes(""), Err(Errno::ENODEV));
        assert_eq!(ifname_bytes("0123456789abcdef"), Err(Errno::ENODEV));
        assert_eq!(ifname_bytes("a\0b"), Err(Errno::ENODEV));
    }

    #[test]
    fn rxnfc_refuses_commands_with_other_buffers() {
        let io = EthtoolIoctl::open().unwrap();
        let mut nfc = EthtoolRxnfc { cmd: ETHTOOL_GRXCLSRLALL, ..Default::default() };
        assert_eq!(io.rxnfc("lo", &mut nfc), Err(Errno::EINVAL));
    }
}
