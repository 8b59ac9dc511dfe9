//! (ABI 1.7) What a kernel tells the host's profiler: where its runs spent their time, part by
//! part, and what the EP's compiler did to the nodes it was given. The host asks for it with
//! `kernel_profile_read` and reads the JSON [`KernelProfile::to_json`] writes.

use std::fmt::Write;

/// A kernel's profile since profiling started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelProfile {
    /// What ran, in the order it runs.
    pub parts: Vec<ProfilePart>,
    /// What compiling the kernel did, one note per compile step that ran.
    pub passes: Vec<PassNote>,
}

/// One part of a kernel: a node, or nodes the EP runs as one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProfilePart {
    /// The node's name, with what the EP made of it (`conv1 (fused Relu)`).
    pub name: String,
    /// The op type, or the ops of a fused part joined by `+`: what the host sums by.
    pub op: String,
    /// Times it ran.
    pub calls: u64,
    /// Nanoseconds it took, all calls together.
    pub ns: u64,
}

/// What one compile step (a graph pass) did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassNote {
    pub name: String,
    /// How many parts it changed (removed, fused, moved, relaid); 0 when it found nothing to do.
    pub changed: u64,
    /// What it did, for a person (`12 -> 8 steps`).
    pub note: String,
}

impl KernelProfile {
    /// The JSON object `kernel_profile_read` hands over (docs/ABI.md).
    pub fn to_json(&self) -> String {
        let mut s = String::from("{\"parts\":[");
        for (i, p) in self.parts.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str("{\"name\":");
            quote(&mut s, &p.name);
            s.push_str(",\"op\":");
            quote(&mut s, &p.op);
            let _ = write!(s, ",\"calls\":{},\"ns\":{}}}", p.calls, p.ns);
        }
        s.push_str("],\"passes\":[");
        for (i, p) in self.passes.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str("{\"name\":");
            quote(&mut s, &p.name);
            let _ = write!(s, ",\"changed\":{},\"note\":", p.changed);
            quote(&mut s, &p.note);
            s.push('}');
        }
        s.push_str("]}");
        s
    }
}

/// `text` as a JSON string.
fn quote(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_quotes_and_control_characters_are_escaped() {
        let p = KernelProfile {
            parts: vec![ProfilePart {
                name: "a \"b\"\\\n\u{1}é".into(),
                op: "Conv+Relu".into(),
                calls: 3,
                ns: 1200,
            }],
            passes: vec![PassNote {
                name: "fuse".into(),
                changed: 2,
                note: "4 -> 2 steps".into(),
            }],
        };
        assert_eq!(
            p.to_json(),
            r#"{"parts":[{"name":"a \"b\"\\\n\u0001é","op":"Conv+Relu","calls":3,"ns":1200}],"passes":[{"name":"fuse","changed":2,"note":"4 -> 2 steps"}]}"#
        );
        assert_eq!(
            KernelProfile::default().to_json(),
            r#"{"parts":[],"passes":[]}"#
        );
    }
}
