//! A JSON Patch (RFC 6902) that turns one document into another, naming
//! only what differs: the webhook's answer carries what inject added (a
//! container, some variables and mounts), never a copy of the rest of the
//! Pod, so its size follows the change rather than the Pod.

use serde_json::json;
use serde_norway::Value;

/// The operations that turn `before` into `after`.
pub fn diff(before: &Value, after: &Value) -> Result<Vec<serde_json::Value>, serde_json::Error> {
    let mut ops = Vec::new();
    walk(&mut String::new(), before, after, &mut ops)?;
    Ok(ops)
}

/// A mapping key as a JSON Pointer segment.
fn segment(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn op(kind: &str, path: &str, value: Option<&Value>) -> Result<serde_json::Value, serde_json::Error> {
    Ok(match value {
        Some(v) => json!({ "op": kind, "path": path, "value": serde_json::to_value(v)? }),
        None => json!({ "op": kind, "path": path }),
    })
}

fn walk(
    path: &mut String,
    before: &Value,
    after: &Value,
    ops: &mut Vec<serde_json::Value>,
) -> Result<(), serde_json::Error> {
    if before == after {
        return Ok(());
    }
    let at = path.len();
    match (before, after) {
        (Value::Mapping(b), Value::Mapping(a)) if b.keys().chain(a.keys()).all(Value::is_string) => {
            for (k, old) in b {
                let key = k.as_str().unwrap_or_default();
                if !a.contains_key(k) {
                    path.push('/');
                    path.push_str(&segment(key));
                    ops.push(op("remove", path, None)?);
                    path.truncate(at);
                } else if let Some(new) = a.get(k) {
                    path.push('/');
                    path.push_str(&segment(key));
                    walk(path, old, new, ops)?;
                    path.truncate(at);
                }
            }
            for (k, new) in a.iter().filter(|(k, _)| !b.contains_key(*k)) {
                path.push('/');
                path.push_str(&segment(k.as_str().unwrap_or_default()));
                ops.push(op("add", path, Some(new))?);
                path.truncate(at);
            }
        }
        (Value::Sequence(b), Value::Sequence(a)) if b.len() == a.len() => {
            for (i, (old, new)) in b.iter().zip(a).enumerate() {
                path.push_str(&format!("/{i}"));
                walk(path, old, new, ops)?;
                path.truncate(at);
            }
        }
        (Value::Sequence(b), Value::Sequence(a)) => {
            // What inject does to a list: items put in front or at the end,
            // or taken out. The common head and tail stay; the middle is
            // removed (last first, so indices hold) and the new one added.
            let head = b.iter().zip(a).take_while(|(x, y)| x == y).count();
            let room = b.len().min(a.len()) - head;
            let tail = b.iter().rev().zip(a.iter().rev()).take(room).take_while(|(x, y)| x == y).count();
            if head + tail == 0 {
                ops.push(op("replace", path, Some(after))?);
                return Ok(());
            }
            for i in (head..b.len() - tail).rev() {
                ops.push(op("remove", &format!("{path}/{i}"), None)?);
            }
            for (i, new) in a.iter().enumerate().take(a.len() - tail).skip(head) {
                ops.push(op("add", &format!("{path}/{i}"), Some(new))?);
            }
        }
        _ => ops.push(op("replace", path, Some(after))?),
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// RFC 6902 add/replace/remove, for checking what `diff` produces.
    pub(crate) fn apply(doc: &mut serde_json::Value, ops: &[serde_json::Value]) {
        for o in ops {
            let path = o["path"].as_str().unwrap();
            let parts: Vec<String> =
                path.split('/').skip(1).map(|p| p.replace("~1", "/").replace("~0", "~")).collect();
            let Some((last, parents)) = parts.split_last() else {
                *doc = o["value"].clone();
                continue;
            };
            let mut at = &mut *doc;
            for p in parents {
                at = match at {
                    serde_json::Value::Array(v) => &mut v[p.parse::<usize>().unwrap()],
                    other => other.get_mut(p.as_str()).unwrap(),
                };
            }
            let value = o.get("value").cloned();
            match (at, o["op"].as_str().unwrap()) {
                (serde_json::Value::Array(v), "add") => {
                    let i = if last == "-" { v.len() } else { last.parse().unwrap() };
                    v.insert(i, value.unwrap());
                }
                (serde_json::Value::Array(v), "remove") => drop(v.remove(last.parse().unwrap())),
                (serde_json::Value::Array(v), "replace") => {
                    v[last.parse::<usize>().unwrap()] = value.unwrap()
                }
                (serde_json::Value::Object(m), "add") => drop(m.insert(last.clone(), value.unwrap())),
                (serde_json::Value::Object(m), "remove") => drop(m.remove(last).unwrap()),
                (serde_json::Value::Object(m), "replace") => {
                    assert!(m.contains_key(last), "replace of a missing member {path}");
                    m.insert(last.clone(), value.unwrap());
                }
                (_, kind) => panic!("{kind} at {path}"),
            }
        }
    }

    fn check(before: &str, after: &str) -> Vec<serde_json::Value> {
        let (b, a): (Value, Value) =
            (serde_norway::from_str(before).unwrap(), serde_norway::from_str(after).unwrap());
        let ops = diff(&b, &a).unwrap();
        let mut doc = serde_json::to_value(&b).unwrap();
        apply(&mut doc, &ops);
        assert_eq!(doc, serde_json::to_value(&a).unwrap(), "{ops:#?}");
        ops
    }

    #[test]
    fn the_patch_names_only_what_changed_and_applies_to_the_result() {
        assert!(check("{a: 1}", "{a: 1}").is_empty());
        let ops = check(
            "{spec: {big: [1, 2, 3], containers: [{name: c, env: [{name: A}]}]}}",
            "{spec: {big: [1, 2, 3], containers: [{name: c, env: [{name: A}, {name: B}]}], hostNetwork: true}}",
        );
        assert_eq!(
            ops,
            [
                json!({"op": "add", "path": "/spec/containers/0/env/1", "value": {"name": "B"}}),
                json!({"op": "add", "path": "/spec/hostNetwork", "value": true}),
            ]
        );
        // An item in front, one taken out, keys that need escaping, a change of type.
        let ops = check("{l: [b, c, d], a/b~c: 1, t: [1]}", "{l: [x, b, d], a/b~c: 2, t: {}}");
        assert!(ops.contains(&json!({"op": "replace", "path": "/a~1b~0c", "value": 2})), "{ops:?}");
        check("{l: [1, 2, 3]}", "{l: [0, 1, 2, 3]}");
        check("{l: [1, 2, 3]}", "{l: [1, 3]}");
        check("{l: [1, 2]}", "{l: [3, 4, 5]}");
        check("{l: []}", "{l: [1]}");
        check("{m: {x: 1}}", "{}");
    }
}
