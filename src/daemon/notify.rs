//! Service-manager notifications (systemd `Type=notify`).
//!
//! When the service manager sets `NOTIFY_SOCKET`, the daemon sends one datagram
//! per state change to that Unix socket: `READY=1` once it serves (right after
//! the ready line is logged), `STOPPING=1` when shutdown starts, and `STATUS=`
//! lines that `systemctl status` shows. The address is a filesystem path, or an
//! abstract-namespace name written with a leading `@`. Without `NOTIFY_SOCKET`
//! every call is a no-op; a failed send is logged and otherwise ignored (the
//! daemon works the same without a service manager).

use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The environment variable naming the service manager's socket.
pub const ENV: &str = "NOTIFY_SOCKET";

/// Where notifications go, parsed from a `NOTIFY_SOCKET` value.
pub fn parse_address(value: &str) -> Result<SocketAddr, String> {
    if let Some(name) = value.strip_prefix('@') {
        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt;
            return SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| e.to_string());
        }
        #[cfg(not(target_os = "linux"))]
        return Err(format!("abstract socket \"{}\" needs Linux", name.escape_debug()));
    }
    if !value.starts_with('/') {
        return Err("expected an absolute path or @name".into());
    }
    SocketAddr::from_pathname(value).map_err(|e| e.to_string())
}

/// Sends `message` (newline-separated `KEY=VALUE` assignments) to the service
/// manager, if there is one.
pub fn send(message: &str) {
    let Ok(value) = std::env::var(ENV) else { return };
    if let Err(e) = send_to(&value, message) {
        tracing::warn!(socket = %value, error = %e, "could not notify the service manager");
    }
}

fn send_to(value: &str, message: &str) -> Result<(), String> {
    let addr = parse_address(value)?;
    let sock = UnixDatagram::unbound().map_err(|e| e.to_string())?;
    let sent = sock.send_to_addr(message.as_bytes(), &addr).map_err(|e| e.to_string())?;
    if sent != message.len() {
        return Err(format!("short send ({sent} of {} bytes)", message.len()));
    }
    Ok(())
}

/// One `STATUS=` line: newlines would start a new assignment, so they become spaces.
pub fn status(text: &str) -> String {
    format!("STATUS={}", text.replace('\n', " "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn addresses_are_paths_or_abstract_names() {
        let a = parse_address("/run/systemd/notify").unwrap();
        assert_eq!(a.as_pathname(), Some(std::path::Path::new("/run/systemd/notify")));
        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt;
            let a = parse_address("@org/systemd/notify").unwrap();
            assert_eq!(a.as_abstract_name(), Some(&b"org/systemd/notify"[..]));
        }
        assert!(parse_address("relative/notify").is_err());
        assert!(parse_address("").is_err());
    }

    #[test]
    fn a_datagram_reaches_a_path_socket_and_an_abstract_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        send_to(path.to_str().unwrap(), "READY=1\nSTATUS=up").unwrap();
        let mut buf = [0u8; 256];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=up");

        #[cfg(target_os = "linux")]
        {
            let name = format!("@tcpx-rxdm-notify-unit-{}", std::process::id());
            let rx = UnixDatagram::bind_addr(&parse_address(&name).unwrap()).unwrap();
            rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            send_to(&name, "STOPPING=1").unwrap();
            let n = rx.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"STOPPING=1");
        }
        // Nobody listening: an error, not a panic.
        assert!(send_to(dir.path().join("absent").to_str().unwrap(), "READY=1").is_err());
    }

    #[test]
    fn status_is_one_line() {
        assert_eq!(status("a\nb"), "STATUS=a b");
    }
}
