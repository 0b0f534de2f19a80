//! Turning a `FlowSteerRuleRequest` into an exact flow key, a target GPU and a
//! queue hint, with every malformed input rejected as INVALID_ARGUMENT.

use std::net::{IpAddr, SocketAddr};

use super::RuleFailure;
use crate::nic::FlowSpec;
use crate::types::pci::PciAddr;
use crate::types::status::StatusCode;
use crate::wire::proto::{FlowSteerRuleRequest, SocketAddress};

use crate::types::flow::{TCP_V4_FLOW, TCP_V6_FLOW};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRequest {
    pub flow: FlowSpec,
    pub gpu: Option<PciAddr>,
    pub queue: Option<u32>,
}

fn invalid(msg: impl Into<String>) -> RuleFailure {
    RuleFailure::new(StatusCode::InvalidArgument, msg)
}

fn socket_addr(a: Option<&SocketAddress>, which: &str, v6: bool) -> Result<SocketAddr, RuleFailure> {
    let a = a.ok_or_else(|| invalid(format!("flow_steer_ntuple.{which} is missing")))?;
    let text = a.ip_address.as_deref().ok_or_else(|| invalid(format!("{which}.ip_address is missing")))?;
    let ip: IpAddr = text.parse().map_err(|_| {
        invalid(format!("{which}.ip_address \"{}\" is not an IP address", text.escape_debug()))
    })?;
    if ip.is_ipv6() != v6 {
        let family = if v6 { "TCP_V6_FLOW" } else { "TCP_V4_FLOW" };
        return Err(invalid(format!("{which}.ip_address {text} does not match flow_type {family}")));
    }
    let port = a.port.ok_or_else(|| invalid(format!("{which}.port is missing")))?;
    let port = u16::try_from(port).map_err(|_| invalid(format!("{which}.port {port} is outside 0-65535")))?;
    Ok(SocketAddr::new(ip, port))
}

/// Validates a rule request.
pub fn parse(req: &FlowSteerRuleRequest) -> Result<RuleRequest, RuleFailure> {
    let nt = req.flow_steer_ntuple.as_ref().ok_or_else(|| invalid("flow_steer_ntuple is missing"))?;
    let v6 = match nt.flow_type {
        Some(t) if t == TCP_V4_FLOW as i32 => false,
        Some(t) if t == TCP_V6_FLOW as i32 => true,
        Some(t) => return Err(invalid(format!("flow_type {t} is not TCP_V4_FLOW (1) or TCP_V6_FLOW (5)"))),
        None => return Err(invalid("flow_type is missing")),
    };
    let src = socket_addr(nt.src.as_ref(), "src", v6)?;
    let dst = socket_addr(nt.dst.as_ref(), "dst", v6)?;
    let gpu = match req.gpu_pci_addr.as_deref() {
        None | Some("") => None,
        Some(s) => Some(s.parse::<PciAddr>().map_err(|e| invalid(format!("gpu_pci_addr: {e}")))?),
    };
    let queue = match req.queue_id {
        None => None,
        Some(q) => Some(u32::try_from(q).map_err(|_| invalid(format!("queue_id {q} is negative")))?),
    };
    Ok(RuleRequest { flow: FlowSpec { src, dst }, gpu, queue })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::proto::FlowSteerNtupleProto;

    fn req(ft: i32, src: &str, sp: i32, dst: &str, dp: i32) -> FlowSteerRuleRequest {
        let a = |ip: &str, port| SocketAddress { ip_address: Some(ip.into()), port: Some(port) };
        FlowSteerRuleRequest {
            flow_steer_ntuple: Some(FlowSteerNtupleProto {
                flow_type: Some(ft),
                src: Some(a(src, sp)),
                dst: Some(a(dst, dp)),
            }),
            queue_id: Some(9),
            gpu_pci_addr: Some("0000:04:00.0".into()),
        }
    }

    #[test]
    fn accepts_v4_and_v6() {
        let r = parse(&req(1, "10.1.0.2", 40000, "10.0.0.1", 5000)).unwrap();
        assert_eq!(r.flow.src, "10.1.0.2:40000".parse().unwrap());
        assert_eq!((r.queue, r.gpu.unwrap().to_string().as_str()), (Some(9), "0000:04:00.0"));
        let r = parse(&req(5, "fd00::2", 41000, "fd00::1", 5000)).unwrap();
        assert!(r.flow.is_v6());
    }

    #[test]
    fn rejects_bad_input() {
        let cases = [
            (req(2, "10.1.0.2", 1, "10.0.0.1", 2), "flow_type 2"),
            (req(1, "fd00::2", 1, "10.0.0.1", 2), "does not match"),
            (req(5, "10.1.0.2", 1, "fd00::1", 2), "does not match"),
            (req(1, "10.1.0.300", 1, "10.0.0.1", 2), "not an IP"),
            (req(1, "10.1.0.2", 70000, "10.0.0.1", 2), "outside 0-65535"),
            (req(1, "10.1.0.2", 1, "10.0.0.1", -1), "outside 0-65535"),
        ];
        for (r, want) in cases {
            let e = parse(&r).unwrap_err();
            assert_eq!(e.code, StatusCode::InvalidArgument);
            assert!(e.message.contains(want), "{}", e.message);
        }
        let mut r = req(1, "10.1.0.2", 1, "10.0.0.1", 2);
        r.flow_steer_ntuple = None;
        assert!(parse(&r).unwrap_err().message.contains("missing"));
        let mut r = req(1, "10.1.0.2", 1, "10.0.0.1", 2);
        r.gpu_pci_addr = Some("gpu0".into());
        assert!(parse(&r).unwrap_err().message.contains("gpu_pci_addr"));
    }
}
