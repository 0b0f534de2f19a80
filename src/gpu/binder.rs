//! Choosing the queue binder for `--bind_backend`.
//!
//! `auto`: no binding with the simulated NIC; otherwise GPUDirect-TCPX (COS
//! kernel ioctls) if the kernel has it, else upstream devmem TCP, else a clear
//! error naming why each failed. The probe is the first real bind: a kernel
//! without the TCPX ioctls answers `ENOTTY` at once and nothing is left behind.

use std::sync::Mutex;

use super::devmem::DevmemBinder;
use super::tcpx::{DmaBufPages, KernelDmaBufPages, TcpxBinder, TcpxError};
use super::{BindError, BindFailure, Binding, QueueBinder, RxPool};
use crate::types::pci::PciAddr;

/// Which binder `--bind_backend` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinderKind {
    /// `none` with a simulated NIC, else tcpx with devmem as the fallback.
    Auto,
    Tcpx,
    Devmem,
    None,
}

impl BinderKind {
    /// The flag's words, in the order of the variants.
    pub const NAMES: &'static [&'static str] = &["auto", "tcpx", "devmem", "none"];
}

impl std::str::FromStr for BinderKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(BinderKind::Auto),
            "tcpx" => Ok(BinderKind::Tcpx),
            "devmem" => Ok(BinderKind::Devmem),
            "none" => Ok(BinderKind::None),
            _ => Err(format!("unknown bind backend \"{s}\"")),
        }
    }
}

/// The binder for `kind`; `sim_nic` is true when the NICs are simulated.
pub fn select_binder(kind: BinderKind, sim_nic: bool) -> Box<dyn QueueBinder> {
    match kind {
        BinderKind::Auto if sim_nic => Box::new(NoBinder),
        BinderKind::Auto => Box::new(AutoBinder::new(KernelDmaBufPages)),
        BinderKind::Tcpx => Box::new(TcpxBinder::<KernelDmaBufPages>::default()),
        BinderKind::Devmem => Box::new(DevmemBinder),
        BinderKind::None => Box::new(NoBinder),
    }
}

/// Which mechanism `auto` settled on after its first successful bind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    Tcpx,
    Devmem,
}

/// `--bind_backend auto` on real NICs.
#[derive(Debug)]
pub struct AutoBinder<K = KernelDmaBufPages> {
    tcpx: TcpxBinder<K>,
    devmem: DevmemBinder,
    settled: Mutex<Option<Settled>>,
}

impl<K: DmaBufPages> AutoBinder<K> {
    pub fn new(kernel: K) -> Self {
        AutoBinder { tcpx: TcpxBinder::with_kernel(kernel), devmem: DevmemBinder, settled: Mutex::new(None) }
    }

    fn settle(&self, s: Settled) {
        *self.settled.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
    }
}

impl<K: DmaBufPages> QueueBinder for AutoBinder<K> {
    fn backend(&self) -> &'static str {
        match *self.settled.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(Settled::Tcpx) => "tcpx",
            Some(Settled::Devmem) => "devmem",
            None => "auto",
        }
    }

    fn bind(
        &self,
        pool: &dyn RxPool,
        gpu: PciAddr,
        ifname: &str,
        nic_pci: Option<PciAddr>,
        queues: &[u32],
    ) -> Result<Box<dyn Binding>, BindError> {
        let settled = *self.settled.lock().unwrap_or_else(|p| p.into_inner());
        if settled == Some(Settled::Devmem) {
            return self.devmem.bind(pool, gpu, ifname, nic_pci, queues);
        }
        // Only the first bind may fall back: once settled on tcpx, a failure is real.
        let tcpx = match self.tcpx.bind(pool, gpu, ifname, nic_pci, queues) {
            Ok(b) => {
                self.settle(Settled::Tcpx);
                return Ok(b);
            }
            Err(BindError { cause: BindFailure::Tcpx(e @ TcpxError::NotSupported(_)), .. })
                if settled.is_none() =>
            {
                e
            }
            Err(e) => return Err(e),
        };
        tracing::info!(error = %tcpx, "GPUDirect-TCPX ioctls unavailable; trying devmem TCP");
        match self.devmem.bind(pool, gpu, ifname, nic_pci, queues) {
            Ok(b) => {
                self.settle(Settled::Devmem);
                Ok(b)
            }
            Err(BindError { cause: BindFailure::Devmem(devmem), .. }) => {
                Err(BindError::new(gpu, ifname, queues, BindFailure::NoBinderWorks { tcpx, devmem }))
            }
            Err(e) => Err(e),
        }
    }
}

/// `--bind_backend none`: pools are shared but not bound.
#[derive(Debug, Default)]
pub struct NoBinder;

#[derive(Debug)]
struct NoBinding;

impl Binding for NoBinding {
    fn describe(&self) -> String {
        "unbound".into()
    }
}

impl QueueBinder for NoBinder {
    fn backend(&self) -> &'static str {
        "none"
    }

    fn bind(
        &self,
        _pool: &dyn RxPool,
        _gpu: PciAddr,
        _ifname: &str,
        _nic_pci: Option<PciAddr>,
        _queues: &[u32],
    ) -> Result<Box<dyn Binding>, BindError> {
        Ok(Box::new(NoBinding))
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{BorrowedFd, OwnedFd};

    use nix::errno::Errno;
    use nix::sys::memfd::{memfd_create, MFdFlags};

    use super::*;
    use crate::gpu::host::HostPool;
    use crate::gpu::tcpx::{BindRxQueue, CreatePagesInfo};

    /// A kernel whose dma-bufs answer `errno` to the TCPX ioctl, or succeed.
    struct Kernel(Option<Errno>);

    impl DmaBufPages for Kernel {
        fn create_pages(&self, _: BorrowedFd<'_>, _: &CreatePagesInfo) -> Result<OwnedFd, Errno> {
            match self.0 {
                Some(e) => Err(e),
                None => Ok(memfd_create("pages", MFdFlags::MFD_CLOEXEC).unwrap()),
            }
        }
        fn bind_rx_queue(&self, _: BorrowedFd<'_>, _: &BindRxQueue) -> Result<(), Errno> {
            Ok(())
        }
    }

    fn pool() -> HostPool {
        HostPool::with_fake_dmabuf()
    }

    fn gpu() -> PciAddr {
        "0000:04:00.0".parse().unwrap()
    }

    #[test]
    fn selection_follows_the_flag_and_the_nic() {
        assert_eq!(select_binder(BinderKind::Auto, true).backend(), "none");
        assert_eq!(select_binder(BinderKind::Auto, false).backend(), "auto");
        assert_eq!(select_binder(BinderKind::Tcpx, true).backend(), "tcpx");
        assert_eq!(select_binder(BinderKind::Devmem, false).backend(), "devmem");
        assert_eq!(select_binder(BinderKind::None, false).backend(), "none");
    }

    #[test]
    fn auto_settles_on_tcpx_when_the_kernel_has_it() {
        let binder = AutoBinder::new(Kernel(None));
        let nic = Some("0000:06:00.0".parse().unwrap());
        let b = binder.bind(&pool(), gpu(), "eth1", nic, &[8, 9]).unwrap();
        assert!(b.describe().starts_with("tcpx"), "{}", b.describe());
        assert_eq!(binder.backend(), "tcpx");
    }

    #[test]
    fn auto_falls_back_to_devmem_and_names_both_failures() {
        let binder = AutoBinder::new(Kernel(Some(Errno::ENOTTY)));
        let nic = Some("0000:06:00.0".parse().unwrap());
        // No such interface: devmem fails too, so both reasons are reported.
        let err = binder.bind(&pool(), gpu(), "rxdm-nope0", nic, &[8]).unwrap_err();
        assert!(matches!(err.cause, BindFailure::NoBinderWorks { .. }), "{err}");
        let cause = err.cause.to_string();
        assert!(cause.contains("tcpx: kernel lacks"), "{err}");
        assert!(cause.contains("devmem: interface rxdm-nope0"), "{err}");
        assert_eq!(binder.backend(), "auto");
    }

    #[test]
    fn auto_reports_real_tcpx_failures_without_fallback() {
        let binder = AutoBinder::new(Kernel(Some(Errno::EINVAL)));
        let nic = Some("0000:06:00.0".parse().unwrap());
        let err = binder.bind(&pool(), gpu(), "eth1", nic, &[8]).unwrap_err();
        assert!(matches!(err.cause, BindFailure::Tcpx(TcpxError::CreatePages { .. })), "{err}");
        assert!(err.cause.to_string().starts_with("tcpx: DMA_BUF_CREATE_PAGES"), "{err}");
    }
}
