//! The byte decoders of the daemon's sockets and files: client frames and
//! requests, topology textprotos, netlink replies, a takeover's state.

use crate::types::pci::PciAddr;

use crate::config::presets;
use crate::netlink::{genl, rtnl, sock_diag, AttrSet};
use crate::nic::ethtool::{bitset, genl as ethtool_genl};
use crate::nic::queue_stats;
use crate::rules::flow;
use crate::types::status::StatusCode;
use crate::wire::frame::{self, FrameError};
use crate::wire::proto::{unix_socket_proto::Payload, UnixSocketProto};

use super::{QSTATS, SOCK_DIAG, SOCK_DIAG_DUMP};

/// The frame decoder: consumes exactly header + announced body, never more
/// than it was given; incomplete input is never an error.
pub fn frame(data: &[u8]) {
    match frame::parse(data) {
        Ok(Some((_, used))) => {
            assert_eq!(Some(used), frame::body_len(data).map(|n| n + frame::HEADER_LEN));
            assert!(used <= data.len());
        }
        Ok(None) => {
            let complete = frame::body_len(data).is_some_and(|n| data.len() >= n + frame::HEADER_LEN);
            assert!(!complete, "a complete frame reported as incomplete");
        }
        Err(FrameError::Malformed(_)) => {}
        Err(e) => panic!("parse returned {e:?}"),
    }
}

/// Request decoding as the endpoints do it, on a body: a `UnixSocketProto`,
/// then the rule request or PCI address in it. Whatever the outcome, the
/// error reply it would get must fit in one frame.
pub fn request(data: &[u8]) {
    let Ok(msg) = <UnixSocketProto as prost::Message>::decode(data) else {
        return;
    };
    let mut errors = Vec::new();
    match &msg.payload {
        Some(Payload::FlowSteerRuleRequest(r)) => match flow::parse(r) {
            Ok(req) => {
                assert_eq!(req.flow.src.is_ipv6(), req.flow.dst.is_ipv6(), "families differ: {req:?}");
                // Unknown GPU / no route replies name the GPU or address.
                errors.push(format!("GPU {:?} is not managed by this daemon", req.gpu));
                errors.push(format!("{} is not an address of a managed NIC", req.flow.dst.ip()));
            }
            Err(f) => errors.push(f.message),
        },
        Some(Payload::QueueIdQuery(q)) => {
            if let Err(e) = q.gpu_pci_addr.parse::<PciAddr>() {
                errors.push(e.to_string());
            }
        }
        Some(Payload::RawBytes(b)) => {
            let text = String::from_utf8_lossy(b);
            let _ = text.trim_matches(|c: char| c == '\0' || c.is_whitespace()).parse::<PciAddr>();
        }
        _ => {}
    }
    for e in errors {
        let reply = frame::error(StatusCode::InvalidArgument, e);
        let bytes = frame::encode(&reply).expect("every error reply fits a frame");
        assert!(matches!(frame::parse(&bytes), Ok(Some(_))));
    }
}

/// The textproto topology loader (presets, `--gpu_nic_topology`): a topology
/// it accepts has passed validation.
pub fn topology(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(t) = presets::topology_from_text(text, "fuzz") {
        assert!(t.validate().is_ok());
        for (_, g) in t.gpus() {
            assert!(t.find_gpu(&g.pci).is_some());
        }
    }
}

/// The netlink reply decoders. Byte 0 picks the decoder; the rest is one
/// payload, or (for the multi-reply decoders) replies each prefixed by a
/// 2-byte little-endian length.
pub fn netlink(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let replies = split_replies(rest);
    match which {
        // The TCP socket lookup of the flow check: a found socket names
        // exactly the tuple asked for, never a listener.
        SOCK_DIAG => {
            let (local, remote) = ("127.0.0.1:5000".parse().unwrap(), "127.0.0.1:40001".parse().unwrap());
            if let Ok(Some(s)) = sock_diag::parse_answer(rest, local, remote) {
                assert_ne!(s.state, 10, "a listener is not the socket");
            }
            return;
        }
        // The dump by ports: only held sockets of those ports, never a
        // listener; no more connections than messages.
        SOCK_DIAG_DUMP => {
            let mut found = Vec::new();
            let _ = sock_diag::parse_dump(rest, 7, (5000, 40001), &mut found);
            assert!(found.iter().all(|c| (c.local.port(), c.remote.port()) == (5000, 40001)));
            assert!(found.iter().all(|c| c.socket.state != 10), "a listener is not a connection");
            assert!(found.len() <= rest.len() / sock_diag::DIAG_MSG);
            return;
        }
        // Per-queue receive counters: each queue once, in order.
        QSTATS => {
            if let Ok(q) = queue_stats::parse_qstats(&replies) {
                assert!(q.windows(2).all(|w| w[0] <= w[1]), "sorted: {q:?}");
            }
            return;
        }
        _ => {}
    }
    match which % 12 {
        0 => drop(rtnl::parse_addr(rest)),
        1 => drop(rtnl::parse_link(rest)),
        2 => {
            if let Ok(r) = rtnl::parse_route(rest) {
                let _ = (r.family(), r.table(), r.route_type(), r.is_tunable(), r.metrics(), r.describe());
                let _ = r.metric(2);
                let _ = r.with_metrics(&[(2, 10)]).replace_request().to_bytes(1);
            }
        }
        3 => drop(genl::reply_attrs(rest)),
        4 => drop(genl::parse_family_id(&replies)),
        5 => drop(ethtool_genl::parse_strset(&replies)),
        6 => drop(ethtool_genl::parse_features(&replies)),
        7 => drop(ethtool_genl::parse_privflags(&replies)),
        8 => drop(ethtool_genl::parse_rings(&replies)),
        9 => drop(ethtool_genl::parse_channels(&replies)),
        10 => {
            if let Ok(set) = AttrSet::parse(rest) {
                let _ = bitset::decode_compact(&set);
                let _ = bitset::decode_verbose(&set);
            }
        }
        _ => {
            if let Ok(set) = AttrSet::parse(rest) {
                for (t, _) in set.iter() {
                    let _ = (set.u8(t), set.u32(t), set.string(t), set.nested(t));
                }
            }
        }
    }
}

fn split_replies(mut b: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while b.len() >= 2 {
        let n = (u16::from_le_bytes([b[0], b[1]]) as usize).min(b.len() - 2);
        out.push(b[2..2 + n].to_vec());
        b = &b[2 + n..];
    }
    out
}

/// The takeover's state as a successor reads it: the message, each rule
/// table rebuilt for a NIC of 4096 slots with two GPUs, the simulated NICs'
/// tables and the undo logs. Anything malformed is an error, never a panic
/// or a table whose books do not add up.
pub fn handover(data: &[u8]) {
    let _ = handover_tables(data);
}

/// What [`handover`] makes of `data`: per rule table, the rules booked or
/// why it was refused, and whether every undo log read back (`None`: not a
/// state).
pub fn handover_tables(data: &[u8]) -> Option<(Vec<Result<usize, String>>, bool)> {
    use crate::handover::Offer;
    use crate::rules::table::NicRules;
    use crate::wire::handover::{offer, Record};
    let offer = <Offer as prost::Message>::decode(data).ok()?;
    let Some(offer::Answer::State(st)) = offer.answer else { return None };
    let queues = [vec![8, 9, 10, 11], vec![12, 13, 14, 15]];
    let mut tables = Vec::new();
    for t in &st.tables {
        let rebuilt = NicRules::from_wire(t, 4096, &queues).map(|rules| {
            let n = Record::unpack_all(&t.rules).map(|r| r.count()).unwrap_or(0);
            assert_eq!(rules.len(), n, "every record booked once");
            assert!(rules.iter().all(|(_, e)| e.loc < 4096 && queues[e.gpu].contains(&e.queue)));
            n
        });
        tables.push(rebuilt);
    }
    for n in &st.sim {
        let _ = Record::unpack_all(&n.rules).map(|r| r.count());
    }
    let primed = st.primed.into_iter().all(|p| crate::nic::prime::PrimedNic::from_wire(p).is_ok());
    let tuning = st.tuning.is_none_or(|t| crate::host::tuning::HostTuning::from_wire(t).is_ok());
    Some((tables, primed && tuning))
}
