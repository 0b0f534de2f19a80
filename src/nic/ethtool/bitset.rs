//! ethtool netlink bitsets (`ETHTOOL_A_BITSET_*`): the by-name form we send to
//! change one bit, and both reply forms (compact: size + value words; verbose:
//! a list of bits with index, name and value flag).

use neli::genl::Nlattr;
use neli::types::Buffer;

use crate::netlink::{attr_flag, attr_nest, attr_str, AttrSet, NlError};

pub const A_BITSET_SIZE: u16 = 2;
pub const A_BITSET_BITS: u16 = 3;
pub const A_BITSET_VALUE: u16 = 4;
pub const A_BITSET_BITS_BIT: u16 = 1;
pub const A_BITSET_BIT_NAME: u16 = 2;
pub const A_BITSET_BIT_VALUE: u16 = 3;

/// A bitset attribute of type `t` changing the single bit `name` to `on`.
/// Without `NOMASK`, bits not listed keep their values.
pub fn encode_one(t: u16, name: &str, on: bool) -> Nlattr<u16, Buffer> {
    let mut bit = vec![attr_str(A_BITSET_BIT_NAME, name)];
    if on {
        bit.push(attr_flag(A_BITSET_BIT_VALUE));
    }
    attr_nest(t, vec![attr_nest(A_BITSET_BITS, vec![attr_nest(A_BITSET_BITS_BIT, bit)])])
}

/// A compact bitset's value bits (`SIZE` bits of the native-endian u32 `VALUE` words).
pub fn decode_compact(set: &AttrSet) -> Result<Vec<bool>, NlError> {
    let size = set.u32(A_BITSET_SIZE).ok_or_else(|| NlError::malformed("bitset without size"))? as usize;
    let words: Vec<u32> = match set.get(A_BITSET_VALUE) {
        Some(v) => v.chunks_exact(4).map(|c| u32::from_ne_bytes(c.try_into().expect("4 bytes"))).collect(),
        None => {
            return Err(NlError::malformed(
                "compact bitset without value (did the kernel send a verbose one?)",
            ))
        }
    };
    if words.len() * 32 < size {
        return Err(NlError::malformed("bitset value shorter than its size"));
    }
    Ok((0..size).map(|i| words[i / 32] & (1 << (i % 32)) != 0).collect())
}

/// A verbose bitset's listed bits, in the order the kernel lists them (index order).
pub fn decode_verbose(set: &AttrSet) -> Result<Vec<(String, bool)>, NlError> {
    let Some(bits) = set.nested(A_BITSET_BITS)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (t, payload) in bits.iter() {
        if t != A_BITSET_BITS_BIT {
            continue;
        }
        let bit = AttrSet::parse(payload)?;
        let name =
            bit.string(A_BITSET_BIT_NAME).ok_or_else(|| NlError::malformed("bitset bit without name"))?;
        out.push((name, bit.has(A_BITSET_BIT_VALUE)));
    }
    Ok(out)
}

#[cfg(all(test, target_endian = "little"))]
mod tests {
    use super::*;
    use crate::netlink::{attr, attr_u32, attrs_bytes};

    // Attributes only the kernel's replies carry.
    const A_BITSET_NOMASK: u16 = 1;
    const A_BITSET_BIT_INDEX: u16 = 1;

    #[test]
    fn encode_one_golden_bytes() {
        let on = attrs_bytes(vec![encode_one(3, "rx-gro", true)]);
        #[rustfmt::skip]
        let want_on = [
            28, 0, 3, 0x80,                 // WANTED-style nest (type 3 | NLA_F_NESTED), 28 bytes
              24, 0, 3, 0x80,               //   ETHTOOL_A_BITSET_BITS
                20, 0, 1, 0x80,             //     ETHTOOL_A_BITSET_BITS_BIT
                  11, 0, 2, 0,              //       BIT_NAME, "rx-gro\0" (7) + 1 pad
                  b'r', b'x', b'-', b'g', b'r', b'o', 0, 0,
                  4, 0, 3, 0,               //       BIT_VALUE flag: on
        ];
        assert_eq!(on, want_on);
        let off = attrs_bytes(vec![encode_one(3, "rx-gro", false)]);
        #[rustfmt::skip]
        let want_off = [
            24, 0, 3, 0x80,
              20, 0, 3, 0x80,
                16, 0, 1, 0x80,
                  11, 0, 2, 0, b'r', b'x', b'-', b'g', b'r', b'o', 0, 0,
                  // no BIT_VALUE: off
        ];
        assert_eq!(off, want_off);
    }

    #[test]
    fn decode_compact_reads_value_bits() {
        let bytes = attrs_bytes(vec![
            attr(A_BITSET_NOMASK, &[]),
            attr_u32(A_BITSET_SIZE, 40),
            attr(A_BITSET_VALUE, &[0b0000_0101, 0, 0, 0x80, 0x01, 0, 0, 0]),
        ]);
        let bits = decode_compact(&AttrSet::parse(&bytes).unwrap()).unwrap();
        assert_eq!(bits.len(), 40);
        let set: Vec<usize> = bits.iter().enumerate().filter(|(_, b)| **b).map(|(i, _)| i).collect();
        assert_eq!(set, vec![0, 2, 31, 32]);
        let short = attrs_bytes(vec![attr_u32(A_BITSET_SIZE, 40), attr(A_BITSET_VALUE, &[0; 4])]);
        assert!(decode_compact(&AttrSet::parse(&short).unwrap()).is_err());
    }

    #[test]
    fn decode_verbose_reads_names_and_values() {
        let bit = |i: u32, name: &str, on: bool| {
            let mut v = vec![attr_u32(A_BITSET_BIT_INDEX, i), attr_str(A_BITSET_BIT_NAME, name)];
            if on {
                v.push(attr_flag(A_BITSET_BIT_VALUE));
            }
            attr_nest(A_BITSET_BITS_BIT, v)
        };
        let bytes = attrs_bytes(vec![
            attr_u32(A_BITSET_SIZE, 2),
            attr_nest(
                A_BITSET_BITS,
                vec![bit(0, "enable-header-split", true), bit(1, "enable-max-rx-buffer-size", false)],
            ),
        ]);
        let flags = decode_verbose(&AttrSet::parse(&bytes).unwrap()).unwrap();
        assert_eq!(
            flags,
            vec![("enable-header-split".to_string(), true), ("enable-max-rx-buffer-size".to_string(), false)]
        );
    }
}
