//! The shared vocabulary of every layer: PCI addresses, TCP flows, reply
//! status codes, the GPU ↔ NIC ↔ queue topology, and the queue that takes
//! turns between tenants ([`fair`]). Plain data and pure functions; this
//! module imports no other module of the crate.

pub mod exit;
pub mod fair;
pub mod flow;
pub mod ifname;
pub mod mode;
pub mod pci;
pub mod status;
pub mod topology;

/// Items for a message: `a, b, c`, each in its `Display` form.
pub fn list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    items.into_iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

/// `noun` and the items: `interface eth1`, `interfaces eth1, eth2`.
pub fn plural_list<T: std::fmt::Display>(noun: &str, items: &[T]) -> String {
    let s = if items.len() == 1 { "" } else { "s" };
    format!("{noun}{s} {}", list(items))
}

/// A duration for a message: seconds with at most three decimals (`1.5s`,
/// `0.25s`, `90s`), never the raw float.
pub fn secs(d: std::time::Duration) -> String {
    format!("{}s", (d.as_secs_f64() * 1e3).round() / 1e3)
}

#[cfg(test)]
pub mod planted;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn durations_and_lists_read_as_prose() {
        assert_eq!(super::secs(Duration::from_secs(90)), "90s");
        assert_eq!(super::secs(Duration::from_nanos(10_955_710_999)), "10.956s");
        assert_eq!(super::secs(Duration::from_millis(250)), "0.25s");
        assert_eq!(super::list([8, 9, 10]), "8, 9, 10");
        assert_eq!(super::list(Vec::<u32>::new()), "");
        assert_eq!(super::plural_list("interface", &["eth1"]), "interface eth1");
        assert_eq!(super::plural_list("interface", &["eth1", "eth2"]), "interfaces eth1, eth2");
    }
}
