//! PCI addresses in the normalised `dddd:bb:dd.f` lowercase form.

use std::fmt;
use std::str::FromStr;

/// A PCI function address. Clients may send any case and may omit the domain;
/// everything we store, print and name sockets after is the normalised form.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciAddr {
    pub domain: u16,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid PCI address \"{}\" (expected dddd:bb:dd.f)", .0.escape_debug())]
pub struct PciAddrError(pub String);

impl FromStr for PciAddr {
    type Err = PciAddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PciAddrError(s.to_string());
        let t = s.trim();
        let (rest, function) = t.rsplit_once('.').ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, dev] => (*d, *b, *dev),
            [b, dev] => ("0", *b, *dev),
            _ => return Err(bad()),
        };
        let hex = |x: &str, max_len: usize| -> Result<u32, PciAddrError> {
            if x.is_empty() || x.len() > max_len || !x.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad());
            }
            u32::from_str_radix(x, 16).map_err(|_| bad())
        };
        let domain = hex(domain, 4)?;
        let bus = hex(bus, 2)?;
        let device = hex(device, 2)?;
        let function = hex(function, 1)?;
        if device > 0x1f || function > 7 {
            return Err(bad());
        }
        Ok(PciAddr { domain: domain as u16, bus: bus as u8, device: device as u8, function: function as u8 })
    }
}

impl fmt::Display for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:02x}:{:02x}.{:x}", self.domain, self.bus, self.device, self.function)
    }
}

impl fmt::Debug for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_case_and_domain() {
        let a: PciAddr = "0000:8A:00.0".parse().unwrap();
        assert_eq!(a.to_string(), "0000:8a:00.0");
        let b: PciAddr = "04:00.0".parse().unwrap();
        assert_eq!(b.to_string(), "0000:04:00.0");
        assert_eq!(a.bus, 0x8a);
    }

    #[test]
    fn rejects_garbage() {
        for s in ["", "0000:04:00", "zz:00.0", "0000:04:20.0", "0000:04:00.8", "1:2:3:4.0", "00000:04:00.0"] {
            assert!(s.parse::<PciAddr>().is_err(), "{s} accepted");
        }
    }
}
