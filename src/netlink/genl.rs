//! Generic netlink over [`NlConn`]: the message builder, family-id lookup
//! through the controller (`CTRL_CMD_GETFAMILY`) and reply attributes. Shared
//! by the ethtool backend and the devmem binder; the family-specific requests
//! live with them.

use neli::consts::nl::NlmF;
use neli::genl::{Genlmsghdr, GenlmsghdrBuilder, Nlattr};
use neli::types::{Buffer, GenlBuffer};

use super::{attr_str, to_bytes, AttrSet, NlConn, NlError, NlRequest};

// Generic netlink controller (family id lookup).
pub const GENL_ID_CTRL: u16 = 0x10;
pub const CTRL_CMD_GETFAMILY: u8 = 3;
pub const CTRL_ATTR_FAMILY_ID: u16 = 1;
pub const CTRL_ATTR_FAMILY_NAME: u16 = 2;

/// A request (with ACK) to `family`: genl header `cmd`/`version`, then `attrs`.
pub fn request(family: u16, cmd: u8, version: u8, attrs: Vec<Nlattr<u16, Buffer>>) -> NlRequest {
    let hdr: Genlmsghdr<u8, u16> = GenlmsghdrBuilder::default()
        .cmd(cmd)
        .version(version)
        .attrs(attrs.into_iter().collect::<GenlBuffer<u16, Buffer>>())
        .build()
        .expect("cmd and version are set");
    NlRequest { nl_type: family, flags: NlmF::ACK, payload: to_bytes(&hdr) }
}

/// Generic netlink controller: look up the id of family `name`.
pub fn get_family(name: &str) -> NlRequest {
    request(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1, vec![attr_str(CTRL_ATTR_FAMILY_NAME, name)])
}

pub fn parse_family_id(replies: &[Vec<u8>]) -> Result<u16, NlError> {
    let attrs = single_reply(replies)?;
    attrs
        .get(CTRL_ATTR_FAMILY_ID)
        .and_then(|b| b.get(..2))
        .map(|b| u16::from_ne_bytes([b[0], b[1]]))
        .ok_or_else(|| NlError::malformed("CTRL_ATTR_FAMILY_ID missing"))
}

/// The id of family `name`, asked on the generic netlink socket `conn`. An
/// unknown family is the kernel's `ENOENT`.
pub fn resolve_family(conn: &mut NlConn, name: &str) -> Result<u16, NlError> {
    conn.transact(&get_family(name)).and_then(|r| parse_family_id(&r))
}

/// The attributes of a genl reply (after the 4-byte genl header).
pub fn reply_attrs(payload: &[u8]) -> Result<AttrSet, NlError> {
    let body = payload.get(4..).ok_or_else(|| NlError::malformed("genl reply shorter than its header"))?;
    AttrSet::parse(body)
}

/// The attributes of the one reply a request expects.
pub fn single_reply(replies: &[Vec<u8>]) -> Result<AttrSet, NlError> {
    match replies {
        [one] => reply_attrs(one),
        _ => Err(NlError::malformed(format!("expected one reply, got {}", replies.len()))),
    }
}
