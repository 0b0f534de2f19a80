//! Golden bytes for every ethtool/genl request we send, derived by hand from
//! the uapi headers, and reply parsing over hand-built replies.

use super::*;
use crate::netlink::{attr, attr_flag, attrs_bytes};

const FAM: u16 = 0x1c;
const SEQ: u32 = 3;

/// nlmsghdr: len, type, flags (REQUEST|ACK = 0x0005), seq 3, pid 0.
fn nlhdr(len: u32, ty: u16) -> Vec<u8> {
    [&len.to_le_bytes()[..], &ty.to_le_bytes(), &[0x05, 0x00], &SEQ.to_le_bytes(), &[0, 0, 0, 0]].concat()
}

/// genlmsghdr: cmd, version, 2 reserved bytes.
fn genlhdr(cmd: u8, version: u8) -> Vec<u8> {
    vec![cmd, version, 0, 0]
}

/// ETHTOOL_A_*_HEADER nest holding DEV_NAME "eth1" (and FLAGS if non-zero).
fn header(flags: u32) -> Vec<u8> {
    #[rustfmt::skip]
    let name = vec![
        9, 0, 2, 0,                      // ETHTOOL_A_HEADER_DEV_NAME, 4 + 5 bytes
        b'e', b't', b'h', b'1', 0, 0, 0, 0, // "eth1\0" + 3 pad
    ];
    if flags == 0 {
        [vec![16, 0, 1, 0x80], name].concat() // nest type 1 | NLA_F_NESTED, 16 bytes
    } else {
        #[rustfmt::skip]
        let f = vec![8, 0, 3, 0, flags as u8, 0, 0, 0]; // ETHTOOL_A_HEADER_FLAGS u32
        [vec![24, 0, 1, 0x80], name, f].concat()
    }
}

fn check(req: NlRequest, want: Vec<u8>) {
    assert_eq!(req.to_bytes(SEQ), want, "{req:?}");
    assert_eq!(u32::from_le_bytes(want[..4].try_into().unwrap()) as usize, want.len());
}

#[test]
fn ctrl_get_family_golden() {
    #[rustfmt::skip]
    let want = [
        32, 0, 0, 0,  0x10, 0,  0x05, 0,  3, 0, 0, 0,  0, 0, 0, 0, // nlmsghdr: GENL_ID_CTRL
        3, 1, 0, 0,                                                // CTRL_CMD_GETFAMILY, version 1
        12, 0, 2, 0,  b'e', b't', b'h', b't', b'o', b'o', b'l', 0,  // CTRL_ATTR_FAMILY_NAME "ethtool\0"
    ];
    check(get_family("ethtool"), want.to_vec());
}

#[test]
fn strset_features_golden() {
    #[rustfmt::skip]
    let sets = vec![
        16, 0, 2, 0x80,              // ETHTOOL_A_STRSET_STRINGSETS (nested)
          12, 0, 1, 0x80,            //   ETHTOOL_A_STRINGSETS_STRINGSET (nested)
            8, 0, 1, 0,  4, 0, 0, 0, //     ETHTOOL_A_STRINGSET_ID = ETH_SS_FEATURES (4)
    ];
    check(strset_features(FAM, "eth1"), [nlhdr(52, FAM), genlhdr(1, 1), header(0), sets].concat());
}

#[test]
fn features_get_golden() {
    // FEATURES_GET (11) with ETHTOOL_FLAG_COMPACT_BITSETS (1) in the header.
    check(features_get(FAM, "eth1"), [nlhdr(44, FAM), genlhdr(11, 1), header(1)].concat());
}

#[test]
fn features_set_golden() {
    #[rustfmt::skip]
    let wanted = vec![
        40, 0, 3, 0x80,                   // ETHTOOL_A_FEATURES_WANTED bitset (nested), no NOMASK
          36, 0, 3, 0x80,                 //   ETHTOOL_A_BITSET_BITS
            32, 0, 1, 0x80,               //     ETHTOOL_A_BITSET_BITS_BIT
              21, 0, 2, 0,                //       BIT_NAME, 4 + 17 bytes, padded to 24
              b'r', b'x', b'-', b'n', b't', b'u', b'p', b'l', b'e', b'-',
              b'f', b'i', b'l', b't', b'e', b'r', 0, 0, 0, 0,
              4, 0, 3, 0,                 //       BIT_VALUE flag: on
    ];
    // FEATURES_SET (12) with ETHTOOL_FLAG_OMIT_REPLY (2): we re-read instead.
    check(
        features_set(FAM, "eth1", "rx-ntuple-filter", true),
        [nlhdr(84, FAM), genlhdr(12, 1), header(2), wanted].concat(),
    );
}

#[test]
fn privflags_golden() {
    check(privflags_get(FAM, "eth1"), [nlhdr(36, FAM), genlhdr(13, 1), header(0)].concat());
    #[rustfmt::skip]
    let flags = vec![
        36, 0, 2, 0x80,                   // ETHTOOL_A_PRIVFLAGS_FLAGS bitset (nested)
          32, 0, 3, 0x80,                 //   BITS
            28, 0, 1, 0x80,               //     BIT
              24, 0, 2, 0,                //       NAME, 4 + 20 bytes, no pad
              b'e', b'n', b'a', b'b', b'l', b'e', b'-', b'h', b'e', b'a',
              b'd', b'e', b'r', b'-', b's', b'p', b'l', b'i', b't', 0,
                                          //       no VALUE: off
    ];
    check(
        privflags_set(FAM, "eth1", "enable-header-split", false),
        [nlhdr(72, FAM), genlhdr(14, 1), header(0), flags].concat(),
    );
}

#[test]
fn rings_golden() {
    check(rings_get(FAM, "eth1"), [nlhdr(36, FAM), genlhdr(15, 1), header(0)].concat());
    // ETHTOOL_A_RINGS_TCP_DATA_SPLIT (11), u8: 2 = enabled, 1 = disabled; 3 pad.
    let on = vec![5, 0, 11, 0, 2, 0, 0, 0];
    check(rings_set_data_split(FAM, "eth1", true), [nlhdr(44, FAM), genlhdr(16, 1), header(0), on].concat());
    let off = vec![5, 0, 11, 0, 1, 0, 0, 0];
    check(
        rings_set_data_split(FAM, "eth1", false),
        [nlhdr(44, FAM), genlhdr(16, 1), header(0), off].concat(),
    );
    // ETHTOOL_A_RINGS_RX (6), u32 1024 = 0x400.
    let rx = vec![8, 0, 6, 0, 0x00, 0x04, 0, 0];
    check(rings_set_rx(FAM, "eth1", 1024), [nlhdr(44, FAM), genlhdr(16, 1), header(0), rx].concat());
}

#[test]
fn channels_golden() {
    check(channels_get(FAM, "eth1"), [nlhdr(36, FAM), genlhdr(17, 1), header(0)].concat());
    // ETHTOOL_A_CHANNELS_RX_COUNT (6) = 2, then COMBINED_COUNT (9) = 8.
    let both = vec![8, 0, 6, 0, 2, 0, 0, 0, 8, 0, 9, 0, 8, 0, 0, 0];
    check(
        channels_set(FAM, "eth1", Some(2), Some(8)),
        [nlhdr(52, FAM), genlhdr(18, 1), header(0), both].concat(),
    );
    let rx = vec![8, 0, 6, 0, 2, 0, 0, 0];
    check(channels_set(FAM, "eth1", Some(2), None), [nlhdr(44, FAM), genlhdr(18, 1), header(0), rx].concat());
}

// ---- replies -------------------------------------------------------------

fn reply(attrs: Vec<neli::genl::Nlattr<u16, Buffer>>) -> Vec<Vec<u8>> {
    vec![[vec![1, 1, 0, 0], attrs_bytes(attrs)].concat()]
}

#[test]
fn parses_family_id() {
    let r =
        reply(vec![attr_str(CTRL_ATTR_FAMILY_NAME, "ethtool"), attr(CTRL_ATTR_FAMILY_ID, &[0x1c, 0, 0, 0])]);
    assert_eq!(parse_family_id(&r).unwrap(), 0x1c);
    assert!(parse_family_id(&reply(vec![])).is_err());
    assert!(parse_family_id(&[]).is_err());
}

#[test]
fn parses_string_set() {
    let s =
        |i, v| attr_nest(A_STRINGS_STRING, vec![attr_u32(A_STRING_INDEX, i), attr_str(A_STRING_VALUE, v)]);
    let set = attr_nest(
        A_STRINGSETS_STRINGSET,
        vec![
            attr_u32(A_STRINGSET_ID, ETH_SS_FEATURES),
            attr_u32(A_STRINGSET_COUNT, 3),
            attr_nest(A_STRINGSET_STRINGS, vec![s(0, "tx-scatter-gather"), s(2, "rx-gro")]),
        ],
    );
    let r = reply(vec![attr_nest(A_STRSET_STRINGSETS, vec![set])]);
    assert_eq!(parse_strset(&r).unwrap(), vec!["tx-scatter-gather", "", "rx-gro"]);
}

#[test]
fn parses_features_privflags_rings_channels() {
    let compact =
        |t, word: u32| attr_nest(t, vec![attr_flag(1), attr_u32(2, 20), attr(4, &word.to_le_bytes())]);
    let r = reply(vec![
        compact(A_FEATURES_HW, 0b1010),
        compact(A_FEATURES_WANTED, 0),
        compact(A_FEATURES_ACTIVE, 0b1),
    ]);
    let f = parse_features(&r).unwrap();
    assert_eq!((f.hw.len(), f.hw[1], f.hw[3], f.hw[0]), (20, true, true, false));
    assert_eq!((f.active[0], f.active[1]), (true, false));

    assert!(parse_privflags(&reply(vec![])).unwrap().is_empty());

    let r = reply(vec![
        attr_u32(A_RINGS_RX_MAX, 4096),
        attr_u32(A_RINGS_RX, 1024),
        attr_u8(A_RINGS_TCP_DATA_SPLIT, 2),
    ]);
    let rings = parse_rings(&r).unwrap();
    assert_eq!(rings, Rings { rx: Some(1024), rx_max: Some(4096), data_split: DataSplit::Enabled });
    assert_eq!(parse_rings(&reply(vec![])).unwrap().data_split, DataSplit::Unknown);

    let veth = reply(vec![attr_u32(A_CHANNELS_RX_MAX, 4), attr_u32(A_CHANNELS_RX_COUNT, 4), attr_u32(7, 4)]);
    let c = parse_channels(&veth).unwrap();
    assert_eq!((c.rx_queues(), c.combined, c.tx), (4, 0, 4));
    let gve = reply(vec![attr_u32(A_CHANNELS_COMBINED_MAX, 16), attr_u32(A_CHANNELS_COMBINED_COUNT, 16)]);
    assert_eq!(parse_channels(&gve).unwrap().rx_queues(), 16);
}
