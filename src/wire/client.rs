//! A small blocking client for tests and tools: one request, one reply, and fd
//! replies received with `MSG_CMSG_CLOEXEC` and checked for `MSG_CTRUNC`.

use std::io::{self, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

use super::frame;
use super::proto::{
    unix_socket_proto::Payload, ApplicationRegisterRequest, FlowSteerNtupleProto, FlowSteerRuleRequest,
    QueueIdQuery, SocketAddress, UnixSocketProto,
};

/// What an fd endpoint answered: a descriptor, or a proto (an error status).
#[derive(Debug)]
pub enum FdReply {
    Fd(OwnedFd),
    Message(UnixSocketProto),
}

pub struct Client {
    stream: UnixStream,
}

impl Client {
    pub fn connect(path: impl AsRef<Path>) -> io::Result<Client> {
        let stream = UnixStream::connect(path)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Client { stream })
    }

    /// Wraps a connected stream as it is (no read timeout).
    pub fn from_stream(stream: UnixStream) -> Client {
        Client { stream }
    }

    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    pub fn send(&mut self, msg: &UnixSocketProto) -> io::Result<()> {
        let bytes = frame::encode(msg).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        self.stream.write_all(&bytes)
    }

    pub fn send_bytes(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Reads one framed reply.
    pub fn recv(&mut self) -> io::Result<UnixSocketProto> {
        let mut head = [0u8; 2];
        self.stream.read_exact(&mut head)?;
        self.recv_body(head)
    }

    fn recv_body(&mut self, head: [u8; 2]) -> io::Result<UnixSocketProto> {
        let mut body = vec![0u8; u16::from_be_bytes(head) as usize];
        self.stream.read_exact(&mut body)?;
        let mut framed = head.to_vec();
        framed.extend_from_slice(&body);
        match frame::parse(&framed) {
            Ok(Some((msg, _))) => Ok(msg),
            Ok(None) => unreachable!("a whole frame was read"),
            Err(e) => Err(io::Error::new(io::ErrorKind::InvalidData, e)),
        }
    }

    pub fn request(&mut self, msg: &UnixSocketProto) -> io::Result<UnixSocketProto> {
        self.send(msg)?;
        self.recv()
    }

    /// Reads a reply that is either one byte carrying an fd, or a framed message.
    pub fn recv_fd_reply(&mut self) -> io::Result<FdReply> {
        let mut first = [0u8; 1];
        let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 4]);
        let (bytes, fds, truncated) = {
            let mut iov = [IoSliceMut::new(&mut first)];
            let msg =
                recvmsg::<()>(self.stream.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)
                    .map_err(io::Error::from)?;
            let mut fds = Vec::new();
            for c in msg.cmsgs().map_err(io::Error::from)? {
                if let ControlMessageOwned::ScmRights(rights) = c {
                    fds.extend(rights);
                }
            }
            (msg.bytes, fds, msg.flags.contains(MsgFlags::MSG_CTRUNC))
        };
        // SAFETY: each fd came from SCM_RIGHTS just now and is owned by nobody else.
        let mut owned: Vec<OwnedFd> = fds.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }).collect();
        if truncated {
            return Err(io::Error::other("control message truncated (MSG_CTRUNC)"));
        }
        if bytes == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        match owned.len() {
            1 => Ok(FdReply::Fd(owned.remove(0))),
            0 => {
                let mut second = [0u8; 1];
                self.stream.read_exact(&mut second)?;
                Ok(FdReply::Message(self.recv_body([first[0], second[0]])?))
            }
            n => Err(io::Error::other(format!("expected one fd, got {n}"))),
        }
    }
}

// ---- request builders ---------------------------------------------------

pub fn raw_request(text: &str) -> UnixSocketProto {
    frame::raw(text.as_bytes())
}

pub fn queue_query(gpu: &str) -> UnixSocketProto {
    UnixSocketProto {
        payload: Some(Payload::QueueIdQuery(QueueIdQuery { gpu_pci_addr: gpu.to_string() })),
        status: None,
    }
}

pub fn register(register_client: bool) -> UnixSocketProto {
    UnixSocketProto {
        payload: Some(Payload::ApplicationRegisterRequest(ApplicationRegisterRequest {
            register_client: Some(register_client),
        })),
        status: None,
    }
}

/// A flow-steering request; `flow_type` 1 = TCP_V4_FLOW, 5 = TCP_V6_FLOW.
pub fn rule_request(
    flow_type: i32,
    src: (&str, i32),
    dst: (&str, i32),
    gpu: Option<&str>,
    queue: Option<i32>,
) -> UnixSocketProto {
    let addr = |(ip, port): (&str, i32)| SocketAddress { ip_address: Some(ip.to_string()), port: Some(port) };
    UnixSocketProto {
        payload: Some(Payload::FlowSteerRuleRequest(FlowSteerRuleRequest {
            flow_steer_ntuple: Some(FlowSteerNtupleProto {
                flow_type: Some(flow_type),
                src: Some(addr(src)),
                dst: Some(addr(dst)),
            }),
            queue_id: queue,
            gpu_pci_addr: gpu.map(str::to_string),
        })),
        status: None,
    }
}

/// `raw_bytes` of a reply, if that is its payload.
pub fn raw_bytes(msg: &UnixSocketProto) -> Option<&[u8]> {
    match &msg.payload {
        Some(Payload::RawBytes(b)) => Some(b),
        _ => None,
    }
}

/// Status code of a reply (0 when absent).
pub fn status_code(msg: &UnixSocketProto) -> i32 {
    msg.status.as_ref().map(|s| s.code).unwrap_or(0)
}
