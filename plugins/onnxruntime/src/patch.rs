//! A minimal protobuf rewrite of the ONNX bytes the host serializes: graph inputs whose element
//! type is unknown get a guessed one (ONNX Runtime needs typed inputs), graph outputs whose
//! element type is unknown lose their type (ONNX Runtime infers it). Everything else is copied
//! byte for byte, so the adapter needs no ONNX protobuf definitions (and no dependency on the
//! host crate).
//!
//! Field numbers (onnx.proto): `ModelProto.graph` = 7; `GraphProto.input` = 11, `.output` = 12;
//! `ValueInfoProto.type` = 2; `TypeProto.tensor_type` = 1; `TypeProto.Tensor.elem_type` = 1.

const WIRE_VARINT: u8 = 0;
const WIRE_I64: u8 = 1;
const WIRE_LEN: u8 = 2;
const WIRE_I32: u8 = 5;

struct Field<'a> {
    number: u64,
    wire: u8,
    /// The whole field, tag included.
    raw: &'a [u8],
    /// The payload of a length-delimited field, or the varint's value bytes.
    payload: &'a [u8],
    varint: u64,
}

fn read_varint(buf: &[u8], pos: &mut usize) -> Result<u64, String> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos).ok_or("truncated varint")?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("varint too long".into())
}

fn write_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn fields(buf: &[u8]) -> Result<Vec<Field<'_>>, String> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let start = pos;
        let tag = read_varint(buf, &mut pos)?;
        let wire = (tag & 7) as u8;
        let number = tag >> 3;
        let (payload, varint) = match wire {
            WIRE_VARINT => {
                let s = pos;
                let v = read_varint(buf, &mut pos)?;
                (&buf[s..pos], v)
            }
            WIRE_I64 | WIRE_I32 => {
                let n = if wire == WIRE_I64 { 8 } else { 4 };
                let s = pos;
                pos = pos
                    .checked_add(n)
                    .filter(|&e| e <= buf.len())
                    .ok_or("truncated")?;
                (&buf[s..pos], 0)
            }
            WIRE_LEN => {
                let len = usize::try_from(read_varint(buf, &mut pos)?).map_err(|_| "length")?;
                let s = pos;
                pos = pos
                    .checked_add(len)
                    .filter(|&e| e <= buf.len())
                    .ok_or("truncated length-delimited field")?;
                (&buf[s..pos], 0)
            }
            w => return Err(format!("unsupported protobuf wire type {w}")),
        };
        out.push(Field {
            number,
            wire,
            raw: &buf[start..pos],
            payload,
            varint,
        });
    }
    Ok(out)
}

pub(crate) fn write_len_field(out: &mut Vec<u8>, number: u64, payload: &[u8]) {
    write_varint(out, (number << 3) | u64::from(WIRE_LEN));
    write_varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

pub(crate) fn write_varint_field(out: &mut Vec<u8>, number: u64, value: u64) {
    write_varint(out, (number << 3) | u64::from(WIRE_VARINT));
    write_varint(out, value);
}

/// Whether a serialized model's main graph has a node of type `op_type` (`NodeProto.op_type`,
/// field 4, of `GraphProto.node`, field 1). An unreadable model has none.
pub(crate) fn has_node_type(model: &[u8], op_type: &str) -> bool {
    let Ok(model_fields) = fields(model) else {
        return false;
    };
    model_fields
        .iter()
        .filter(|f| f.number == 7 && f.wire == WIRE_LEN)
        .filter_map(|g| fields(g.payload).ok())
        .flatten()
        .filter(|n| n.number == 1 && n.wire == WIRE_LEN)
        .filter_map(|n| fields(n.payload).ok())
        .any(|node| {
            node.iter()
                .any(|f| f.number == 4 && f.wire == WIRE_LEN && f.payload == op_type.as_bytes())
        })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Input,
    Output,
}

/// Rewrites the model; `guess` is the ONNX element type code given to untyped inputs.
pub fn fill_unknown_types(model: &[u8], guess: i32) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(model.len() + 16);
    for f in fields(model)? {
        if f.number == 7 && f.wire == WIRE_LEN {
            let g = patch_graph(f.payload, guess)?;
            write_len_field(&mut out, 7, &g);
        } else {
            out.extend_from_slice(f.raw);
        }
    }
    Ok(out)
}

fn patch_graph(graph: &[u8], guess: i32) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(graph.len() + 16);
    for f in fields(graph)? {
        let side = match (f.number, f.wire) {
            (11, WIRE_LEN) => Some(Side::Input),
            (12, WIRE_LEN) => Some(Side::Output),
            _ => None,
        };
        match side {
            Some(side) => {
                let v = patch_value_info(f.payload, side, guess)?;
                write_len_field(&mut out, f.number, &v);
            }
            None => out.extend_from_slice(f.raw),
        }
    }
    Ok(out)
}

/// The element type a `TypeProto` declares: `Some(0)` for a tensor type without one, `None`
/// when it is not a tensor type.
fn tensor_elem_type(type_proto: &[u8]) -> Result<Option<u64>, String> {
    for f in fields(type_proto)? {
        if f.number == 1 && f.wire == WIRE_LEN {
            let mut elem = 0;
            for g in fields(f.payload)? {
                if g.number == 1 && g.wire == WIRE_VARINT {
                    elem = g.varint;
                }
            }
            return Ok(Some(elem));
        }
    }
    Ok(None)
}

fn patch_value_info(vi: &[u8], side: Side, guess: i32) -> Result<Vec<u8>, String> {
    let fs = fields(vi)?;
    let type_field = fs.iter().find(|f| f.number == 2 && f.wire == WIRE_LEN);
    let elem = match type_field {
        Some(t) => tensor_elem_type(t.payload)?,
        None => Some(0),
    };
    if elem != Some(0) {
        return Ok(vi.to_vec());
    }
    let mut out = Vec::with_capacity(vi.len() + 8);
    for f in &fs {
        if f.number == 2 && f.wire == WIRE_LEN {
            continue;
        }
        out.extend_from_slice(f.raw);
    }
    if side == Side::Input {
        // TypeProto { tensor_type: Tensor { elem_type: guess, shape: <kept> } }
        let mut tensor = Vec::new();
        write_varint(&mut tensor, 1 << 3);
        write_varint(&mut tensor, guess as u64);
        if let Some(t) = type_field {
            for f in fields(t.payload)? {
                if f.number == 1 && f.wire == WIRE_LEN {
                    for g in fields(f.payload)? {
                        if g.number != 1 {
                            tensor.extend_from_slice(g.raw);
                        }
                    }
                }
            }
        }
        let mut ty = Vec::new();
        write_len_field(&mut ty, 1, &tensor);
        write_len_field(&mut out, 2, &ty);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value_info(name: &str, elem: Option<u64>, with_type: bool) -> Vec<u8> {
        let mut vi = Vec::new();
        write_len_field(&mut vi, 1, name.as_bytes());
        if with_type {
            let mut tensor = Vec::new();
            if let Some(e) = elem {
                write_varint(&mut tensor, 1 << 3);
                write_varint(&mut tensor, e);
            }
            // shape { dim { dim_value: 3 } }
            let mut dim = Vec::new();
            write_varint(&mut dim, 1 << 3);
            write_varint(&mut dim, 3);
            let mut shape = Vec::new();
            write_len_field(&mut shape, 1, &dim);
            write_len_field(&mut tensor, 2, &shape);
            let mut ty = Vec::new();
            write_len_field(&mut ty, 1, &tensor);
            write_len_field(&mut vi, 2, &ty);
        }
        vi
    }

    fn model(inputs: &[Vec<u8>], outputs: &[Vec<u8>]) -> Vec<u8> {
        let mut g = Vec::new();
        write_len_field(&mut g, 2, b"graph-name");
        for i in inputs {
            write_len_field(&mut g, 11, i);
        }
        for o in outputs {
            write_len_field(&mut g, 12, o);
        }
        let mut m = Vec::new();
        write_varint(&mut m, 1 << 3); // ir_version
        write_varint(&mut m, 8);
        write_len_field(&mut m, 7, &g);
        m
    }

    #[test]
    fn node_types_are_found_in_the_main_graph() {
        let node = |op: &str| {
            let mut n = Vec::new();
            write_len_field(&mut n, 1, b"x");
            write_len_field(&mut n, 4, op.as_bytes());
            n
        };
        let mut g = Vec::new();
        write_len_field(&mut g, 1, &node("Relu"));
        write_len_field(&mut g, 1, &node("EPContext"));
        let mut m = Vec::new();
        write_varint_field(&mut m, 1, 8);
        write_len_field(&mut m, 7, &g);
        assert!(has_node_type(&m, "EPContext"));
        assert!(has_node_type(&m, "Relu"));
        assert!(!has_node_type(&m, "EPCon"));
        assert!(!has_node_type(b"\xff\xff", "EPContext"));
    }

    #[test]
    fn typed_models_are_unchanged() {
        let m = model(
            &[value_info("x", Some(1), true)],
            &[value_info("y", Some(7), true)],
        );
        assert_eq!(fill_unknown_types(&m, 1).unwrap(), m);
    }

    #[test]
    fn untyped_inputs_get_the_guess_and_outputs_lose_their_type() {
        let m = model(
            &[value_info("x", None, true), value_info("z", None, false)],
            &[value_info("y", None, true)],
        );
        let patched = fill_unknown_types(&m, 1).unwrap();
        let want = {
            let x = value_info("x", Some(1), true);
            let mut z = Vec::new();
            write_len_field(&mut z, 1, b"z");
            let mut tensor = Vec::new();
            write_varint(&mut tensor, 1 << 3);
            write_varint(&mut tensor, 1);
            let mut ty = Vec::new();
            write_len_field(&mut ty, 1, &tensor);
            write_len_field(&mut z, 2, &ty);
            let mut y = Vec::new();
            write_len_field(&mut y, 1, b"y");
            model(&[x, z], &[y])
        };
        assert_eq!(patched, want);
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(fill_unknown_types(&[0x3a, 0x10, 0x01], 1).is_err());
    }
}
