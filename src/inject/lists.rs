//! Lists and mappings of a manifest as inject changes them: created where
//! missing, emptied ones removed, lists the user left empty kept.

use serde_norway::{Mapping, Value};

/// The names of the container lists, init containers first.
pub const LISTS: [&str; 2] = ["initContainers", "containers"];

/// A YAML text.
pub fn s(v: &str) -> Value {
    Value::String(v.to_string())
}

/// A YAML mapping of `pairs`, in their order.
pub fn map(pairs: Vec<(&str, Value)>) -> Value {
    let mut m = Mapping::new();
    for (k, v) in pairs {
        m.insert(s(k), v);
    }
    Value::Mapping(m)
}

pub fn seq_mut<'a>(m: &'a mut Value, key: &str) -> &'a mut Vec<Value> {
    let m = m.as_mapping_mut().expect("checked to be a mapping");
    if !m.get(key).is_some_and(Value::is_sequence) {
        m.insert(s(key), Value::Sequence(vec![]));
    }
    m.get_mut(key).and_then(Value::as_sequence_mut).expect("just inserted")
}

/// Removes `key` from mapping `m` if it holds an empty sequence or mapping.
pub(super) fn drop_empty(m: &mut Value, key: &str) {
    let empty = match m.get(key) {
        Some(Value::Sequence(v)) => v.is_empty(),
        Some(Value::Mapping(v)) => v.is_empty(),
        _ => false,
    };
    if empty {
        m.as_mapping_mut().map(|m| m.remove(key));
    }
}

/// Keeps the items of list `key` of mapping `m` that `keep` accepts. A list
/// this empties goes; one the user left empty stays (injecting again keeps it).
pub(super) fn retain_list(m: &mut Value, key: &str, keep: impl FnMut(&Value) -> bool) {
    let Some(items) = m.get_mut(key).and_then(Value::as_sequence_mut) else { return };
    if items.is_empty() {
        return;
    }
    items.retain(keep);
    if items.is_empty() {
        m.as_mapping_mut().map(|m| m.remove(key));
    }
}
