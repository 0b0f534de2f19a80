//! Host tuning's undo log as a takeover hands it on: the successor puts back
//! what the first daemon of its line changed.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use super::HostTuning;
use crate::netlink::rtnl::Route;
use crate::wire::handover as wire;

fn path(bytes: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(bytes))
}

impl HostTuning {
    /// The undo log as a takeover hands it on.
    pub fn to_wire(&self) -> wire::HostTuning {
        wire::HostTuning {
            files: self
                .files
                .iter()
                .map(|(p, before)| wire::TunedFile {
                    path: p.as_os_str().as_bytes().to_vec(),
                    before: before.clone(),
                })
                .collect(),
            routes: self
                .routes
                .iter()
                .map(|r| wire::Route {
                    header: r.header.to_vec(),
                    attrs: r
                        .attrs
                        .iter()
                        .map(|(kind, value)| wire::RouteAttr { kind: (*kind).into(), value: value.clone() })
                        .collect(),
                })
                .collect(),
            teardown: self.teardown.as_ref().map(|p| p.as_os_str().as_bytes().to_vec()),
        }
    }

    /// The undo log handed on by the daemon this one took over from,
    /// disarmed: dropping it restores nothing, because until the takeover
    /// commits the tuning is the other daemon's, which still serves.
    /// [`HostTuning::restore`] still restores. One it cannot read in full is
    /// refused whole.
    pub fn from_wire(w: wire::HostTuning) -> Result<HostTuning, String> {
        let bad = |why: String| format!("the host tuning's undo log: {why}");
        let mut routes = Vec::with_capacity(w.routes.len());
        for r in w.routes {
            let header: [u8; 12] = r
                .header
                .as_slice()
                .try_into()
                .map_err(|_| bad(format!("a route header of {} bytes, not 12", r.header.len())))?;
            let mut attrs = Vec::with_capacity(r.attrs.len());
            for a in r.attrs {
                let kind =
                    u16::try_from(a.kind).map_err(|_| bad(format!("route attribute type {}", a.kind)))?;
                attrs.push((kind, a.value));
            }
            routes.push(Route { header, attrs });
        }
        Ok(HostTuning {
            files: w.files.into_iter().map(|f| (path(&f.path), f.before)).collect(),
            routes,
            teardown: w.teardown.as_deref().map(path),
            armed: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_routes_and_script_travel_whole_and_disarmed() {
        let route = Route {
            header: [10, 0, 0, 0, 254, 3, 0, 1, 0, 0, 0, 0],
            attrs: vec![(1, vec![10, 0, 0, 0]), (15, vec![])],
        };
        let t = HostTuning {
            files: vec![
                ("/proc/sys/net/ipv4/tcp_mtu_probing".into(), "1\n".into()),
                ("/a/b".into(), "".into()),
            ],
            routes: vec![route.clone()],
            teardown: Some("/etc/tcpx/teardown.sh".into()),
            armed: true,
        };
        let mut back = HostTuning::from_wire(t.to_wire()).unwrap();
        assert_eq!((&back.files, &back.routes, &back.teardown), (&t.files, &t.routes, &t.teardown));
        assert!(!back.armed, "a handed log restores nothing when dropped until armed");
        back.teardown = None;
        std::mem::forget(t);
        let mut w = back.to_wire();
        w.routes[0].attrs[0].kind = 70_000;
        assert_eq!(
            HostTuning::from_wire(w).unwrap_err(),
            "the host tuning's undo log: route attribute type 70000"
        );
    }
}
