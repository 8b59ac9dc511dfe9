//! Every node is held against its operator's schema when a model is loaded, as ONNX Runtime
//! does: an attribute the operator does not define (a misspelled `transb` on Gemm), one of the
//! wrong kind, a missing required one, more or fewer inputs or outputs than the operator takes,
//! or an opset older than the operator's first version are errors naming node and attribute —
//! never a run with another meaning. The schemas are ONNX's (ai.onnx, ai.onnx.ml, previews) and
//! ONNX Runtime's `com.microsoft`, generated into `schemas/schemas.tsv` by
//! `schemas/make_schemas.py`. Operators the table does not know (custom domains, ops newer than
//! it) are left to the EPs, which say themselves whether they run them.

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

use crate::model::ir::{AttributeValue, Graph, Node};

const TABLE: &str = include_str!("schemas/schemas.tsv");

/// One version of one operator.
#[derive(Debug)]
struct Schema {
    since: i64,
    inputs: (usize, usize),
    outputs: (usize, usize),
    /// name, AttributeProto type number, required
    attributes: Vec<(&'static str, u8, bool)>,
    /// The element type of each output as the schema fixes it (the last for any further one).
    output_types: Vec<OutputType>,
}

/// The element type of an operator's output, as its schema fixes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutputType {
    /// The type of input `i`.
    Input(usize),
    /// One type (its TensorProto data type number).
    Fixed(i32),
    /// An attribute or the inputs' types decide it beyond what the schema says.
    Open,
}

type Table = HashMap<(&'static str, &'static str), Vec<Schema>>;

fn table() -> &'static Table {
    static PARSED: OnceLock<Table> = OnceLock::new();
    PARSED.get_or_init(|| {
        let mut t: Table = HashMap::new();
        for line in TABLE
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            // The table is generated and checked by the tests below; a malformed line is skipped
            // rather than trusted.
            if let Some((key, schema)) = parse_line(line) {
                t.entry(key).or_default().push(schema);
            }
        }
        for versions in t.values_mut() {
            versions.sort_by_key(|s| s.since);
        }
        t
    })
}

fn parse_line(line: &'static str) -> Option<((&'static str, &'static str), Schema)> {
    let cols: Vec<&'static str> = line.split('\t').collect();
    let [
        domain,
        op,
        since,
        min_in,
        max_in,
        min_out,
        max_out,
        attrs,
        outputs,
    ] = cols[..]
    else {
        return None;
    };
    let output_types = outputs
        .split(',')
        .map(|r| {
            if let Some(i) = r.strip_prefix('=') {
                i.parse().ok().map(OutputType::Input)
            } else if let Some(c) = r.strip_prefix(':') {
                c.parse().ok().map(OutputType::Fixed)
            } else {
                Some(OutputType::Open)
            }
        })
        .collect::<Option<Vec<_>>>()?;
    let count = |s: &str| -> Option<usize> {
        if s == "*" {
            Some(usize::MAX)
        } else {
            s.parse().ok()
        }
    };
    let mut attributes = Vec::new();
    for a in attrs.split(',').filter(|a| !a.is_empty()) {
        let (name, kind) = a.split_once(':')?;
        let required = kind.ends_with('!');
        attributes.push((name, kind.trim_end_matches('!').parse().ok()?, required));
    }
    Some((
        (domain, op),
        Schema {
            since: since.parse().ok()?,
            inputs: (count(min_in)?, count(max_in)?),
            outputs: (count(min_out)?, count(max_out)?),
            attributes,
            output_types,
        },
    ))
}

/// The AttributeProto type number of a parsed attribute, and its name for messages.
fn kind_of(v: &AttributeValue) -> (u8, &'static str) {
    match v {
        AttributeValue::Float(_) => (1, "a float"),
        AttributeValue::Int(_) => (2, "an int"),
        AttributeValue::String(_) => (3, "a string"),
        AttributeValue::Tensor(_) => (4, "a tensor"),
        AttributeValue::Graph(_) => (5, "a graph"),
        AttributeValue::Floats(_) => (6, "floats"),
        AttributeValue::Ints(_) => (7, "ints"),
        AttributeValue::Strings(_) => (8, "strings"),
        AttributeValue::Tensors(_) => (9, "tensors"),
        AttributeValue::Graphs(_) => (10, "graphs"),
        AttributeValue::Other("sparse tensor") => (11, "a sparse tensor"),
        AttributeValue::Other("type proto") => (13, "a type proto"),
        AttributeValue::Other(other) => (0, other),
    }
}

fn kind_name(code: u8) -> &'static str {
    match code {
        1 => "a float",
        2 => "an int",
        3 => "a string",
        4 => "a tensor",
        5 => "a graph",
        6 => "floats",
        7 => "ints",
        8 => "strings",
        9 => "tensors",
        10 => "graphs",
        11 => "a sparse tensor",
        12 => "sparse tensors",
        13 => "a type proto",
        14 => "type protos",
        _ => "of an unknown kind",
    }
}

/// The element type output `k` of `op` (domain normalized, `""` for ai.onnx) has at `opset`, as
/// the operator's schema fixes it; `None` for an operator the table does not know.
pub(crate) fn output_type(domain: &str, op: &str, opset: i64, k: usize) -> Option<OutputType> {
    let versions = table().get(&(domain, op))?;
    let schema = versions.iter().rev().find(|s| s.since <= opset)?;
    schema
        .output_types
        .get(k)
        .or(schema.output_types.last())
        .copied()
}

/// The ONNX domains whose opsets this build knows whole (from the table's ONNX release): a model
/// importing a newer opset of one of them is refused, as ONNX Runtime refuses opsets newer than
/// its ONNX release (`model_load_utils.h`, `ValidateOpsetForDomain`). Other domains (ONNX
/// Runtime's `com.microsoft`, custom ones) are left to the EPs.
const ONNX_DOMAINS: [&str; 3] = ["", "ai.onnx.ml", "ai.onnx.preview.training"];

/// The newest opset of ONNX domain `domain` (normalized: `""` for `ai.onnx`) that this build
/// knows, or `None` for a domain it does not hold whole.
pub(crate) fn newest_opset(domain: &str) -> Option<i64> {
    static NEWEST: OnceLock<HashMap<&'static str, i64>> = OnceLock::new();
    let newest = NEWEST.get_or_init(|| {
        let mut m: HashMap<&'static str, i64> = HashMap::new();
        for ((d, _), versions) in table() {
            if let Some(last) = versions.last() {
                let e = m.entry(*d).or_insert(last.since);
                *e = (*e).max(last.since);
            }
        }
        m
    });
    ONNX_DOMAINS
        .contains(&domain)
        .then(|| newest.get(domain).copied())
        .flatten()
}

/// Checks every node of `graph` and of the graphs nested in its attributes against the schema
/// its domain's imported opset selects. The error names the node and what is wrong.
pub(crate) fn check_graph(graph: &Graph, opsets: &BTreeMap<String, i64>) -> Result<(), String> {
    for (i, node) in graph.nodes.iter().enumerate() {
        if let Some(&opset) = opsets.get(&node.domain) {
            check_node(node, i, opset)?;
        }
        for a in &node.attributes {
            match &a.value {
                AttributeValue::Graph(g) => check_graph(g, opsets)?,
                AttributeValue::Graphs(gs) => gs.iter().try_for_each(|g| check_graph(g, opsets))?,
                _ => {}
            }
        }
    }
    Ok(())
}

fn check_node(node: &Node, index: usize, opset: i64) -> Result<(), String> {
    let Some(versions) = table().get(&(node.domain.as_str(), node.op_type.as_str())) else {
        return Ok(());
    };
    let domain = if node.domain.is_empty() {
        "ai.onnx"
    } else {
        &node.domain
    };
    let label = if node.name.is_empty() {
        format!("#{index} ({})", node.op_type)
    } else {
        format!("`{}` ({})", node.name, node.op_type)
    };
    let Some(schema) = versions.iter().rev().find(|s| s.since <= opset) else {
        let first = versions.first().map_or(0, |s| s.since);
        return Err(format!(
            "node {label}: {domain} has no {} before opset {first}, and the model imports \
             {domain} opset {opset}",
            node.op_type
        ));
    };
    let range = |(lo, hi): (usize, usize)| {
        if hi == usize::MAX {
            format!("at least {lo}")
        } else if lo == hi {
            format!("{lo}")
        } else {
            format!("{lo} to {hi}")
        }
    };
    for (what, verb, n, (lo, hi)) in [
        ("inputs", "takes", node.inputs.len(), schema.inputs),
        ("outputs", "gives", node.outputs.len(), schema.outputs),
    ] {
        if n < lo || n > hi {
            return Err(format!(
                "node {label} has {n} {what}; {} (opset {}) {verb} {}",
                node.op_type,
                schema.since,
                range((lo, hi))
            ));
        }
    }
    for a in &node.attributes {
        let Some(&(_, want, _)) = schema.attributes.iter().find(|(n, ..)| *n == a.name) else {
            let known: Vec<&str> = schema.attributes.iter().map(|(n, ..)| *n).collect();
            let close = known
                .iter()
                .find(|k| k.eq_ignore_ascii_case(&a.name))
                .map(|k| format!(" (did you mean `{k}`?)"))
                .unwrap_or_default();
            return Err(format!(
                "node {label}: {} (opset {}) has no attribute `{}`{close}; its attributes are: {}",
                node.op_type,
                schema.since,
                a.name,
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ));
        };
        let (got, got_name) = kind_of(&a.value);
        if got != want {
            return Err(format!(
                "node {label}: attribute `{}` of {} must be {}, but the model gives {got_name}",
                a.name,
                node.op_type,
                kind_name(want)
            ));
        }
    }
    for &(name, kind, required) in &schema.attributes {
        if required && !node.attributes.iter().any(|a| a.name == name) {
            return Err(format!(
                "node {label}: {} (opset {}) needs the attribute `{name}` ({})",
                node.op_type,
                schema.since,
                kind_name(kind)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Output types: fixed ones, ones that follow an input, and open ones (a heterogeneous
    /// variadic like Loop's carried values, an attribute's choice) left to other rules.
    #[test]
    fn output_types_follow_the_schemas() {
        assert_eq!(output_type("", "Shape", 15, 0), Some(OutputType::Fixed(7)));
        assert_eq!(output_type("", "Relu", 14, 0), Some(OutputType::Input(0)));
        assert_eq!(
            output_type("", "MatMulInteger", 10, 0),
            Some(OutputType::Fixed(6))
        );
        assert_eq!(output_type("", "Loop", 16, 1), Some(OutputType::Open));
        assert_eq!(output_type("", "Scan", 16, 0), Some(OutputType::Open));
        assert_eq!(
            output_type("ai.onnx.ml", "LabelEncoder", 2, 0),
            Some(OutputType::Open)
        );
        assert_eq!(output_type("", "NoSuchOp", 16, 0), None);
    }

    #[test]
    fn the_table_parses_whole() {
        let lines = TABLE
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .count();
        let parsed: usize = table().values().map(Vec::len).sum();
        assert_eq!(parsed, lines, "every line of schemas.tsv parses");
        let gemm = &table()[&("", "Gemm")];
        let last = gemm.last().expect("Gemm versions");
        assert_eq!(last.inputs, (2, 3));
        assert!(
            last.attributes
                .iter()
                .any(|(n, k, _)| *n == "transB" && *k == 2)
        );
        assert!(table().contains_key(&("com.microsoft", "FusedConv")));
        assert!(table().contains_key(&("ai.onnx.ml", "TreeEnsembleClassifier")));
    }
}
