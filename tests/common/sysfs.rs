//! Fabricated sysfs trees laid out like the kernel's: PCI functions nested
//! under `devices/pciDDDD:BB`, `class/net/<if>` as relative symlinks into
//! `devices/…/net/<if>`, and `device` links `../../../<pci>`. Used by the
//! discovery and doctor tests.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

pub const BRIDGE: (&str, &str) = ("0x1000", "0x060400"); // PCIe switch port
pub const ROOT_PORT: (&str, &str) = ("0x8086", "0x060400");
pub const H100: (&str, &str) = ("0x10de", "0x030200");
pub const GVNIC: (&str, &str) = ("0x1ae0", "0x020000");
pub const NVSWITCH: (&str, &str) = ("0x10de", "0x068000");
pub const AMD_GPU: (&str, &str) = ("0x1002", "0x030000");
pub const NVME: (&str, &str) = ("0x144d", "0x010802");

pub struct FakeSysfs {
    pub dir: TempDir,
}

impl FakeSysfs {
    pub fn new() -> Self {
        let dir = TempDir::new().unwrap();
        fs::create_dir_all(dir.path().join("class/net")).unwrap();
        FakeSysfs { dir }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Adds PCI function `path` (relative to `devices/`, e.g.
    /// `pci0000:00/0000:00:01.0/0000:01:00.0`) with its vendor and class files.
    pub fn pci(&self, path: &str, (vendor, class): (&str, &str)) -> &Self {
        let dir = self.root().join("devices").join(path);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("vendor"), format!("{vendor}\n")).unwrap();
        fs::write(dir.join("class"), format!("{class}\n")).unwrap();
        // Real function directories hold symlinks out of the tree; the walk must not follow them.
        symlink("../../../bus/pci/drivers/gve", dir.join("driver")).unwrap();
        self
    }

    /// Adds interface `ifname` of the PCI function at `devices/<device>`.
    pub fn nic(&self, ifname: &str, device: &str) -> &Self {
        let if_dir = self.root().join("devices").join(device).join("net").join(ifname);
        fs::create_dir_all(&if_dir).unwrap();
        let pci_name = Path::new(device).file_name().unwrap();
        symlink(Path::new("../../..").join(pci_name), if_dir.join("device")).unwrap();
        self.class_link(ifname, &format!("{device}/net/{ifname}"));
        self
    }

    /// Adds a virtual interface (no `device` link), like `lo` or a veth.
    pub fn virtual_if(&self, ifname: &str) -> &Self {
        fs::create_dir_all(self.root().join("devices/virtual/net").join(ifname)).unwrap();
        self.class_link(ifname, &format!("virtual/net/{ifname}"));
        self
    }

    pub fn class_link(&self, ifname: &str, under_devices: &str) {
        let target = PathBuf::from("../../devices").join(under_devices);
        symlink(target, self.root().join("class/net").join(ifname)).unwrap();
    }
}

/// One a3 "block": root port → switch upstream port → three downstream ports with two
/// H100s and a gVNIC; GPUs on buses `first`, `first+1`, NIC on `first+2`.
pub fn a3_block(fs: &FakeSysfs, root_port: &str, first: u8, ifname: &str) {
    let rc = format!("pci0000:{}", &root_port[5..7]);
    let rp = format!("{rc}/{root_port}");
    let up = format!("{rp}/0000:{:02x}:00.0", first - 3);
    fs.pci(&rp, ROOT_PORT).pci(&up, BRIDGE);
    for (i, kind) in [H100, H100, GVNIC].into_iter().enumerate() {
        let dsp = format!("{up}/0000:{:02x}:{:02x}.0", first - 2, i + 1);
        let ep = format!("{dsp}/0000:{:02x}:00.0", first + i as u8);
        fs.pci(&dsp, BRIDGE).pci(&ep, kind);
    }
    fs.nic(ifname, &format!("{up}/0000:{:02x}:03.0/0000:{:02x}:00.0", first - 2, first + 2));
}

/// a3-highgpu-8g: eth1..eth4, each with two H100s behind a switch two hops up; a host
/// NIC eth0 on the root complex; lo and a veth. An NVSwitch-class NVIDIA function sits
/// under eth1's switch and must not count as a GPU.
pub fn a3_highgpu_8g() -> FakeSysfs {
    let fs = FakeSysfs::new();
    // Created out of order: discovery must sort.
    a3_block(&fs, "0000:80:02.0", 0x8a, "eth4");
    a3_block(&fs, "0000:00:01.0", 0x04, "eth1");
    a3_block(&fs, "0000:80:01.0", 0x84, "eth3");
    a3_block(&fs, "0000:00:02.0", 0x0a, "eth2");
    fs.pci("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:04.0", BRIDGE)
        .pci("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:04.0/0000:03:00.0", NVSWITCH);
    fs.pci("pci0000:00/0000:00:04.0", GVNIC).nic("eth0", "pci0000:00/0000:00:04.0");
    fs.virtual_if("lo").virtual_if("veth1a2b3c");
    fs
}

impl FakeSysfs {
    /// Sets the NUMA node of `ifname`'s device (`-1`: none reported).
    pub fn numa_node(&self, ifname: &str, node: i32) -> &Self {
        fs::write(self.root().join("class/net").join(ifname).join("device/numa_node"), format!("{node}\n"))
            .unwrap();
        self
    }

    /// CPUs as a GCE VM numbers them: `nodes` NUMA nodes of `cores` two-thread
    /// cores each, the first threads of every core of the machine first, then
    /// their siblings (`cpu + nodes * cores`). Writes each node's `cpulist`,
    /// each CPU's `thread_siblings_list` and `cpu/online`.
    pub fn gce_cpus(&self, nodes: u32, cores: u32) -> &Self {
        let total = nodes * cores;
        let sys = self.root().join("devices/system");
        for n in 0..nodes {
            let (a, b) = (n * cores, (n + 1) * cores - 1);
            let dir = sys.join(format!("node/node{n}"));
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("cpulist"), format!("{a}-{b},{}-{}\n", a + total, b + total)).unwrap();
        }
        for c in 0..total {
            for cpu in [c, c + total] {
                let dir = sys.join(format!("cpu/cpu{cpu}/topology"));
                fs::create_dir_all(&dir).unwrap();
                fs::write(dir.join("thread_siblings_list"), format!("{c},{}\n", c + total)).unwrap();
            }
        }
        fs::write(sys.join("cpu/online"), format!("0-{}\n", 2 * total - 1)).unwrap();
        self
    }
}

impl FakeSysfs {
    /// Adds `bus/pci/devices/<pci>` for every PCI function under
    /// `devices/pci*`, each a relative link to its folder, as the kernel has them.
    pub fn bus_links(&self) -> &Self {
        fn walk(dir: &Path, rel: &Path, bus: &Path) {
            for e in fs::read_dir(dir).unwrap().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !e.file_type().unwrap().is_dir() || name.len() != 12 || name.as_bytes()[4] != b':' {
                    continue;
                }
                let rel = rel.join(&name);
                let link = bus.join(&name);
                if !link.exists() {
                    symlink(Path::new("../../..").join(&rel), &link).unwrap();
                }
                walk(&e.path(), &rel, bus);
            }
        }
        let bus = self.root().join("bus/pci/devices");
        fs::create_dir_all(&bus).unwrap();
        for e in fs::read_dir(self.root().join("devices")).unwrap().flatten() {
            if e.file_name().to_string_lossy().starts_with("pci") {
                walk(&e.path(), &Path::new("devices").join(e.file_name()), &bus);
            }
        }
        self
    }

    /// The PCI function of `ifname`'s device, relative to the root
    /// (`devices/pci…/…/<pci>`).
    pub fn device_of(&self, ifname: &str) -> PathBuf {
        let root = self.root().canonicalize().unwrap();
        let dev = self.root().join("class/net").join(ifname).join("device").canonicalize().unwrap();
        dev.strip_prefix(root).unwrap().to_path_buf()
    }

    /// Removes `class/net/<ifname>`: the NIC was moved into a Pod's network
    /// namespace, so the host's sysfs no longer lists it.
    pub fn moved_away(&self, ifname: &str) -> &Self {
        fs::remove_file(self.root().join("class/net").join(ifname)).unwrap();
        self
    }
}

/// A Pod's own sysfs: `class/net/<if>` for each of `nics`, with a `device`
/// link to the PCI function at `devices/<path>`, which this tree lacks
/// (only the host's sysfs shows the PCI tree); `lo` and a veth `eth0`.
pub fn pod_sysfs(nics: &[(&str, PathBuf)]) -> FakeSysfs {
    let fs = FakeSysfs::new();
    fs.virtual_if("lo").virtual_if("eth0");
    for (ifname, device) in nics {
        let dir = fs.root().join("class/net").join(ifname);
        fs::create_dir_all(&dir).unwrap();
        symlink(Path::new("../../..").join(device), dir.join("device")).unwrap();
    }
    fs
}
