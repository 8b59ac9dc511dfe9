//! Inputs for the targets: seeds from the repository, mutated byte-wise or, for ONNX models,
//! field-wise (dims, attributes, types, ops, names, opsets) so that most mutants still decode
//! and reach the loader's checks, the shape inference and the kernels.

use epx::onnx::proto;
use prost::Message;

/// A small deterministic generator (xorshift64*): the same seed and case number give the same
/// input, so a case found in a long run can be made again.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64, case: u64) -> Rng {
        let mut r = Rng(seed ^ case.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d);
        for _ in 0..4 {
            r.next();
        }
        r
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0.max(1);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    /// A value from the edges integers break at, or a small one.
    pub fn interesting(&mut self) -> i64 {
        const EDGES: [i64; 16] = [
            0,
            1,
            -1,
            2,
            3,
            7,
            255,
            -128,
            1 << 16,
            (1 << 31) - 1,
            1 << 31,
            -(1 << 31),
            1 << 32,
            1 << 40,
            i64::MAX,
            i64::MIN,
        ];
        if self.chance(70) {
            EDGES[self.below(EDGES.len())]
        } else {
            self.below(64) as i64 - 8
        }
    }
}

/// One to four byte-level mutations of `input` (`other` is spliced from).
pub fn bytes(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = v.len();
        match rng.below(7) {
            0 if len > 0 => {
                let i = rng.below(len);
                v[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                v[i] = [0, 0xff, 0x7f, 0x80, 1][rng.below(5)];
            }
            2 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                v.splice(at..at, bytes);
            }
            3 if len > 1 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(64));
                v.drain(at..at + n);
            }
            4 if len > 1 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(64));
                let copy = v[at..at + n].to_vec();
                let to = rng.below(len + 1);
                v.splice(to..to, copy);
            }
            5 if !other.is_empty() => {
                let from = rng.below(other.len());
                let n = 1 + rng.below((other.len() - from).min(256));
                let to = rng.below(len + 1);
                let end = (to + n).min(len);
                v.splice(to..end, other[from..from + n].iter().copied());
            }
            6 if len > 0 => v.truncate(rng.below(len)),
            _ => {}
        }
    }
    v
}

/// Ops a node may be turned into (each has a kernel in the CPU EP).
const OPS: [&str; 24] = [
    "Add",
    "Relu",
    "Conv",
    "MatMul",
    "Reshape",
    "Transpose",
    "Concat",
    "Gather",
    "Slice",
    "Expand",
    "Tile",
    "Pad",
    "Resize",
    "Softmax",
    "ReduceSum",
    "Cast",
    "Where",
    "Split",
    "Loop",
    "If",
    "ConstantOfShape",
    "MaxPool",
    "Gemm",
    "TopK",
];

/// One to three field mutations of an ONNX model; byte mutations when it does not decode.
pub fn model(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let Ok(mut m) = proto::ModelProto::decode(input) else {
        return bytes(rng, input, other);
    };
    for _ in 0..1 + rng.below(3) {
        mutate_model(rng, &mut m);
    }
    m.encode_to_vec()
}

fn mutate_model(rng: &mut Rng, m: &mut proto::ModelProto) {
    let Some(g) = m.graph.as_mut() else {
        return;
    };
    match rng.below(10) {
        // A dim of an input, output or value_info.
        0 => {
            let mut values: Vec<&mut proto::ValueInfoProto> = g
                .input
                .iter_mut()
                .chain(g.output.iter_mut())
                .chain(g.value_info.iter_mut())
                .collect();
            let n = values.len();
            if let Some(v) = values.get_mut(rng.below(n))
                && let Some(proto::type_proto::Value::TensorType(t)) =
                    v.r#type.as_mut().and_then(|t| t.value.as_mut())
                && let Some(shape) = t.shape.as_mut()
            {
                let k = rng.below(shape.dim.len() + 1);
                let value =
                    proto::tensor_shape_proto::dimension::Value::DimValue(rng.interesting());
                match shape.dim.get_mut(k) {
                    Some(d) => d.value = Some(value),
                    None => shape.dim.push(proto::tensor_shape_proto::Dimension {
                        value: Some(value),
                        ..Default::default()
                    }),
                }
            }
        }
        // An integer attribute, or one element of an integer-list attribute.
        1 | 2 => {
            let n = g.node.len();
            if let Some(node) = g.node.get_mut(rng.below(n)) {
                let k = node.attribute.len();
                if let Some(a) = node.attribute.get_mut(rng.below(k)) {
                    let v = rng.interesting();
                    if a.ints.is_empty() || rng.chance(30) {
                        a.i = Some(v);
                    } else {
                        let j = rng.below(a.ints.len());
                        a.ints[j] = v;
                    }
                }
            }
        }
        // An initializer's dims, type or data.
        3 | 4 => {
            let n = g.initializer.len();
            if let Some(t) = g.initializer.get_mut(rng.below(n)) {
                match rng.below(4) {
                    0 if !t.dims.is_empty() => {
                        let j = rng.below(t.dims.len());
                        t.dims[j] = rng.interesting();
                    }
                    1 => t.data_type = Some(rng.below(24) as i32),
                    2 if !t.int64_data.is_empty() => {
                        let j = rng.below(t.int64_data.len());
                        t.int64_data[j] = rng.interesting();
                    }
                    _ => {
                        if let Some(raw) = t.raw_data.as_ref() {
                            let cut = rng.below(raw.len() + 1);
                            t.raw_data = Some(raw.slice(..cut));
                        } else {
                            t.dims.push(rng.interesting());
                        }
                    }
                }
            }
        }
        // Another op.
        5 => {
            let n = g.node.len();
            if let Some(node) = g.node.get_mut(rng.below(n)) {
                node.op_type = Some(OPS[rng.below(OPS.len())].to_string());
            }
        }
        // An input of a node renamed to another value of the graph (or to nothing).
        6 => {
            let names: Vec<String> = g
                .node
                .iter()
                .flat_map(|n| n.output.iter().cloned())
                .chain(g.input.iter().filter_map(|v| v.name.clone()))
                .collect();
            let n = g.node.len();
            if let Some(node) = g.node.get_mut(rng.below(n)) {
                let k = node.input.len();
                if let Some(i) = node.input.get_mut(rng.below(k)) {
                    *i = if rng.chance(10) || names.is_empty() {
                        String::new()
                    } else {
                        names[rng.below(names.len())].clone()
                    };
                }
            }
        }
        // A node dropped or duplicated.
        7 => {
            let n = g.node.len();
            if n > 0 {
                let i = rng.below(n);
                if rng.chance(50) {
                    g.node.remove(i);
                } else {
                    let copy = g.node[i].clone();
                    g.node.insert(rng.below(n + 1), copy);
                }
            }
        }
        // An element type of an input.
        8 => {
            let n = g.input.len();
            if let Some(v) = g.input.get_mut(rng.below(n))
                && let Some(proto::type_proto::Value::TensorType(t)) =
                    v.r#type.as_mut().and_then(|t| t.value.as_mut())
            {
                t.elem_type = Some(rng.below(24) as i32);
            }
        }
        // The opset or the IR version.
        _ => {
            if rng.chance(50) {
                m.ir_version = Some(rng.below(14) as i64);
            } else if let Some(o) = m.opset_import.first_mut() {
                o.version = Some(rng.below(26) as i64);
            }
        }
    }
}
