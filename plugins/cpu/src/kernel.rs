//! The kernel interface of the CPU EP: errors, node definitions with typed attribute getters,
//! the [`OpKernel`] trait every operator implements, and the [`Registry`] that maps
//! `(domain, op_type, opset)` to a kernel builder.

use std::collections::HashMap;
use std::fmt;

use epx_plugin_api::ElementType;

pub use crate::error::{OpError, OpResult};
use crate::fast::post::PostOp;
use crate::tensor::{Tensor, TensorRef};

/// The value of one node attribute.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Float(f32),
    Int(i64),
    String(Vec<u8>),
    Tensor(Tensor),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    Strings(Vec<Vec<u8>>),
    /// An attribute kind the CPU EP does not understand (graphs, sparse tensors, ...).
    Unsupported(&'static str),
}

impl AttrValue {
    fn kind(&self) -> &'static str {
        match self {
            AttrValue::Float(_) => "float",
            AttrValue::Int(_) => "int",
            AttrValue::String(_) => "string",
            AttrValue::Tensor(_) => "tensor",
            AttrValue::Floats(_) => "floats",
            AttrValue::Ints(_) => "ints",
            AttrValue::Strings(_) => "strings",
            AttrValue::Unsupported(k) => k,
        }
    }
}

/// Everything a kernel builder knows about a node.
#[derive(Debug, Clone, Default)]
pub struct NodeDef {
    pub name: String,
    pub op_type: String,
    pub domain: String,
    /// opset version the model imports for the node's domain
    pub opset: i64,
    pub attributes: HashMap<String, AttrValue>,
    pub num_inputs: usize,
    pub num_outputs: usize,
    /// static element types of inputs where known (None = unknown / absent)
    pub input_types: Vec<Option<ElementType>>,
}

impl NodeDef {
    /// A node with the given op type and opset and no attributes (handy in tests).
    pub fn new(op_type: &str, opset: i64) -> Self {
        NodeDef {
            name: String::new(),
            op_type: op_type.to_string(),
            domain: String::new(),
            opset,
            attributes: HashMap::new(),
            num_inputs: 0,
            num_outputs: 1,
            input_types: Vec::new(),
        }
    }

    /// Builder-style attribute setter (handy in tests).
    pub fn with_attr(mut self, name: &str, value: AttrValue) -> Self {
        self.attributes.insert(name.to_string(), value);
        self
    }

    /// Builder-style setter of the input/output counts (handy in tests).
    pub fn with_io(mut self, num_inputs: usize, num_outputs: usize) -> Self {
        self.num_inputs = num_inputs;
        self.num_outputs = num_outputs;
        self
    }

    fn type_error(&self, name: &str, want: &str, got: &AttrValue) -> OpError {
        OpError(format!(
            "{} node '{}': attribute '{}' must be {}, got {}",
            self.op_type,
            self.name,
            name,
            want,
            got.kind()
        ))
    }

    /// An error naming this node.
    pub fn error(&self, msg: impl fmt::Display) -> OpError {
        OpError(format!("{} node '{}': {}", self.op_type, self.name, msg))
    }

    /// Whether the attribute is present.
    pub fn has_attr(&self, name: &str) -> bool {
        self.attributes.contains_key(name)
    }

    pub fn attr_int(&self, name: &str) -> OpResult<Option<i64>> {
        match self.attributes.get(name) {
            None => Ok(None),
            Some(AttrValue::Int(v)) => Ok(Some(*v)),
            Some(other) => Err(self.type_error(name, "an int", other)),
        }
    }

    pub fn attr_int_or(&self, name: &str, default: i64) -> OpResult<i64> {
        Ok(self.attr_int(name)?.unwrap_or(default))
    }

    /// A count attribute (heads, targets, sizes): `None` when absent, an error unless positive.
    pub fn attr_count(&self, name: &str) -> OpResult<Option<usize>> {
        match self.attr_int(name)? {
            None => Ok(None),
            Some(v) => usize::try_from(v)
                .ok()
                .filter(|&v| v > 0)
                .map(Some)
                .ok_or_else(|| self.error(format_args!("{name} must be positive, got {v}"))),
        }
    }

    /// [`NodeDef::attr_count`] with a default for an absent attribute.
    pub fn attr_count_or(&self, name: &str, default: usize) -> OpResult<usize> {
        Ok(self.attr_count(name)?.unwrap_or(default))
    }

    /// [`NodeDef::attr_count`] of a required attribute.
    pub fn req_count(&self, name: &str) -> OpResult<usize> {
        self.attr_count(name)?
            .ok_or_else(|| self.error(format_args!("missing required attribute '{name}'")))
    }

    pub fn attr_ints(&self, name: &str) -> OpResult<Option<Vec<i64>>> {
        match self.attributes.get(name) {
            None => Ok(None),
            Some(AttrValue::Ints(v)) => Ok(Some(v.clone())),
            Some(other) => Err(self.type_error(name, "a list of ints", other)),
        }
    }

    pub fn attr_float(&self, name: &str) -> OpResult<Option<f32>> {
        match self.attributes.get(name) {
            None => Ok(None),
            Some(AttrValue::Float(v)) => Ok(Some(*v)),
            Some(other) => Err(self.type_error(name, "a float", other)),
        }
    }

    pub fn attr_float_or(&self, name: &str, default: f32) -> OpResult<f32> {
        Ok(self.attr_float(name)?.unwrap_or(default))
    }

    pub fn attr_floats(&self, name: &str) -> OpResult<Option<Vec<f32>>> {
        match self.attributes.get(name) {
            None => Ok(None),
            Some(AttrValue::Floats(v)) => Ok(Some(v.clone())),
            Some(other) => Err(self.type_error(name, "a list of floats", other)),
        }
    }

    pub fn attr_string(&self, name: &str) -> OpResult<Option<String>> {
        match self.attributes.get(name) {
            None => Ok(None),
            Some(AttrValue::String(v)) => String::from_utf8(v.clone())
                .map(Some)
                .map_err(|_| self.error(format_args!("attribute '{name}' is not valid UTF-8"))),
            Some(other) => Err(self.type_error(name, "a string", other)),
        }
    }

    /// A strings attribute, each UTF-8.
    pub fn attr_strings(&self, name: &str) -> OpResult<Option<Vec<String>>> {
        match self.attributes.get(name) {
            None => Ok(None),
            Some(AttrValue::Strings(v)) => v
                .iter()
                .map(|s| {
                    String::from_utf8(s.clone()).map_err(|_| {
                        self.error(format_args!(
                            "attribute '{name}' holds bytes that are not UTF-8"
                        ))
                    })
                })
                .collect::<OpResult<Vec<_>>>()
                .map(Some),
            Some(other) => Err(self.type_error(name, "strings", other)),
        }
    }

    pub fn attr_string_or(&self, name: &str, default: &str) -> OpResult<String> {
        Ok(self
            .attr_string(name)?
            .unwrap_or_else(|| default.to_string()))
    }

    pub fn attr_tensor(&self, name: &str) -> OpResult<Option<&Tensor>> {
        match self.attributes.get(name) {
            None => Ok(None),
            Some(AttrValue::Tensor(t)) => Ok(Some(t)),
            Some(other) => Err(self.type_error(name, "a tensor", other)),
        }
    }

    /// A required int attribute.
    pub fn req_int(&self, name: &str) -> OpResult<i64> {
        self.attr_int(name)?
            .ok_or_else(|| self.error(format_args!("missing required attribute '{name}'")))
    }

    /// A required ints attribute.
    pub fn req_ints(&self, name: &str) -> OpResult<Vec<i64>> {
        self.attr_ints(name)?
            .ok_or_else(|| self.error(format_args!("missing required attribute '{name}'")))
    }
}

/// The control-flow ops the CPU EP runs (outside the kernel registry, since their bodies are
/// compiled as programs by [`crate::exec`]) and the first opset each is supported at.
pub const CONTROL_FLOW_OPSETS: [(&str, i64); 4] =
    [("If", 1), ("Loop", 1), ("Scan", 9), ("SequenceMap", 17)];

/// Whether `op` is a control-flow op ([`CONTROL_FLOW_OPSETS`]).
pub fn is_control_flow(op: &str) -> bool {
    CONTROL_FLOW_OPSETS.iter().any(|(name, _)| *name == op)
}

/// A built kernel: runs one node.
pub trait OpKernel: Send + Sync {
    /// inputs: one entry per node input, None for an absent optional input. Returns one tensor
    /// per node output, in order (length num_outputs; optional trailing outputs may be computed
    /// anyway).
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>>;

    /// Like [`run`](Self::run), applying `post` to output 0 as it is produced where this kernel
    /// can; the flag says whether it did (when not, the caller applies it afterwards).
    fn run_with_post(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        post: &mut dyn PostOp,
    ) -> OpResult<(Vec<Tensor>, bool)> {
        let _ = post;
        Ok((self.run(inputs)?, false))
    }

    /// Called once when the program is compiled, with the inputs that are the program's own
    /// constants (`None` for the others): each is the same memory on every run, unchanged and
    /// alive as long as this kernel. A kernel may keep work it derives from them (packed
    /// weights). The default keeps nothing.
    fn prepare(&self, constants: &[Option<TensorRef<'_>>]) {
        let _ = constants;
    }

    /// For a node whose one output is input 0's elements in C order under a new shape
    /// (Reshape, Flatten, Squeeze, Unsqueeze): that shape, checked as [`run`](Self::run) checks
    /// it. The program then moves input 0's buffer to the output instead of copying it where
    /// no later step reads the input. `None` for every other kernel (the default).
    fn reshaped_shape(&self, inputs: &[Option<TensorRef<'_>>]) -> Option<OpResult<Vec<usize>>> {
        let _ = inputs;
        None
    }

    /// The programs a control-flow kernel runs (If's branches, a Loop's or Scan's body), by
    /// attribute name, for the profiler. None for every other kernel (the default).
    fn bodies(&self) -> Vec<(&'static str, &dyn Body)> {
        Vec::new()
    }
}

/// A program nested in a kernel, as the profiler sees it.
pub trait Body {
    /// Starts recording its steps from zero (and theirs, nested deeper).
    fn profile_start(&self);
    /// Appends what its steps recorded, named `prefix` + the step's label, nested steps after
    /// the step that holds them; returns the nanoseconds its steps took, all together.
    fn profile_parts(&self, prefix: &str, out: &mut Vec<epx_plugin_api::sdk::ProfilePart>) -> u64;
}

/// A kernel made from a closure.
pub struct FnKernel<F>(pub F);

impl<F> OpKernel for FnKernel<F>
where
    F: Fn(&[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> + Send + Sync,
{
    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        (self.0)(inputs)
    }
}

/// Boxes a closure as a kernel.
pub fn kernel<F>(f: F) -> Box<dyn OpKernel>
where
    F: Fn(&[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> + Send + Sync + 'static,
{
    Box::new(FnKernel(f))
}

/// Builds a kernel for a node, reading its attributes.
pub type BuildFn = fn(&NodeDef) -> OpResult<Box<dyn OpKernel>>;

/// One operator version range and its builder.
#[derive(Clone, Copy)]
pub struct OpSchema {
    pub op_type: &'static str,
    /// "" for ai.onnx
    pub domain: &'static str,
    pub since_version: i64,
    /// inclusive; i64::MAX if current
    pub until_version: i64,
    pub build: BuildFn,
}

impl fmt::Debug for OpSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpSchema")
            .field("op_type", &self.op_type)
            .field("domain", &self.domain)
            .field("since_version", &self.since_version)
            .field("until_version", &self.until_version)
            .finish()
    }
}

fn canonical_domain(domain: &str) -> &str {
    if domain == "ai.onnx" { "" } else { domain }
}

/// What a registry does to every kernel it builds (the op families' own adapter: ops that move
/// elements also take string tensors).
pub type WrapFn = fn(&str, Box<dyn OpKernel>) -> Box<dyn OpKernel>;

/// All known operators.
#[derive(Default)]
pub struct Registry {
    by_op: HashMap<(String, String), Vec<OpSchema>>,
    wrap: Option<WrapFn>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("ops", &self.by_op.len())
            .finish_non_exhaustive()
    }
}

impl Registry {
    pub fn new() -> Self {
        Registry::default()
    }

    pub fn add(&mut self, s: OpSchema) {
        let key = (
            canonical_domain(s.domain).to_string(),
            s.op_type.to_string(),
        );
        self.by_op.entry(key).or_default().push(s);
    }

    /// Sets what every kernel this registry builds goes through ([`WrapFn`]).
    pub fn set_wrap(&mut self, wrap: WrapFn) {
        self.wrap = Some(wrap);
    }

    /// Builds the kernel of `schema` for a node.
    pub fn make(&self, schema: &OpSchema, node: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
        let k = (schema.build)(node)?;
        Ok(match self.wrap {
            Some(w) => w(&node.op_type, k),
            None => k,
        })
    }

    /// The schema for an operator at an opset; domain "" and "ai.onnx" are the same domain.
    pub fn lookup(&self, domain: &str, op_type: &str, opset: i64) -> Option<&OpSchema> {
        let key = (canonical_domain(domain).to_string(), op_type.to_string());
        self.by_op
            .get(&key)?
            .iter()
            .filter(|s| s.since_version <= opset && opset <= s.until_version)
            .max_by_key(|s| s.since_version)
    }

    pub fn schemas(&self) -> impl Iterator<Item = &OpSchema> {
        self.by_op.values().flatten()
    }

    /// Looks up and builds the kernel for a node.
    pub fn build(&self, node: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
        match self.lookup(&node.domain, &node.op_type, node.opset) {
            Some(s) => self.make(s, node),
            None => Err(OpError(format!(
                "no CPU kernel for {}:{} at opset {}",
                if node.domain.is_empty() {
                    "ai.onnx"
                } else {
                    &node.domain
                },
                node.op_type,
                node.opset
            ))),
        }
    }
}

/// The process-wide registry, made once ([`crate::ops::registry`] makes it with every operator).
static GLOBAL: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();

/// The process-wide registry, made by `init` the first time.
pub fn global_registry(init: fn() -> Registry) -> &'static Registry {
    GLOBAL.get_or_init(init)
}

/// The process-wide registry, for a kernel that builds other operators' kernels (a composite
/// op, a reference fallback). It exists once any kernel has been built through it.
pub fn installed_registry() -> OpResult<&'static Registry> {
    GLOBAL
        .get()
        .ok_or_else(|| OpError("internal: the operator registry is not made yet".into()))
}

/// The domain of ONNX Runtime's contrib ops.
pub const MS: &str = "com.microsoft";

/// The domain of ONNX's traditional machine-learning ops.
pub const ML: &str = "ai.onnx.ml";

/// The domain of the CPU EP's own ops: what its compile-time rewrites turn node groups into.
pub const EPX_CPU: &str = "ai.epx.cpu";

/// Adds an `ai.onnx` operator available from opset `since` on (the builder reads the node's
/// opset for older semantics it shares a schema with).
pub fn add(reg: &mut Registry, op_type: &'static str, since: i64, build: BuildFn) {
    add_range(reg, op_type, since, i64::MAX, build);
}

/// Adds an `ai.onnx` operator for opsets `since..=until` only: a version whose semantics differ
/// from the next one's gets its own builder, and the registry picks it by the node's opset.
pub fn add_range(
    reg: &mut Registry,
    op_type: &'static str,
    since: i64,
    until: i64,
    build: BuildFn,
) {
    add_in(reg, "", op_type, since, until, build);
}

/// Adds an operator of `domain` for opsets `since..=until`.
pub fn add_in(
    reg: &mut Registry,
    domain: &'static str,
    op_type: &'static str,
    since: i64,
    until: i64,
    build: BuildFn,
) {
    reg.add(OpSchema {
        op_type,
        domain,
        since_version: since,
        until_version: until,
        build,
    });
}

/// Adds a `com.microsoft` operator (every opset of the domain).
pub fn add_ms(reg: &mut Registry, op_type: &'static str, build: BuildFn) {
    add_in(reg, MS, op_type, 1, i64::MAX, build);
}

/// Adds an `ai.onnx.ml` operator from opset `since` on.
pub fn add_ml(reg: &mut Registry, op_type: &'static str, since: i64, build: BuildFn) {
    add_in(reg, ML, op_type, since, i64::MAX, build);
}

/// Adds one of the CPU EP's own operators (domain [`EPX_CPU`]).
pub fn add_epx(reg: &mut Registry, op_type: &'static str, build: BuildFn) {
    add_in(reg, EPX_CPU, op_type, 1, i64::MAX, build);
}

/// The CPU EP's kernel for the ONNX op `op_type` at `opset`, as a part of node `n`.
pub fn build_part(
    n: &NodeDef,
    op_type: &str,
    opset: i64,
    attrs: Vec<(&str, AttrValue)>,
    num_inputs: usize,
    num_outputs: usize,
) -> OpResult<Box<dyn OpKernel>> {
    let def = NodeDef {
        name: n.name.clone(),
        op_type: op_type.to_string(),
        domain: String::new(),
        opset,
        attributes: attrs
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect::<HashMap<_, _>>(),
        num_inputs,
        num_outputs,
        // A part's inputs are partly the other parts' outputs, of no declared type.
        input_types: Vec::new(),
    };
    installed_registry()?
        .build(&def)
        .map_err(|e| n.error(format_args!("building its {op_type} part: {e}")))
}

/// Wraps a single output.
pub fn one(t: OpResult<Tensor>) -> OpResult<Vec<Tensor>> {
    t.map(|t| vec![t])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn dummy(_: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
        Ok(kernel(|_| Ok(vec![])))
    }

    #[test]
    fn lookup_picks_version_range_and_domain_alias() {
        let mut r = Registry::new();
        r.add(OpSchema {
            op_type: "X",
            domain: "",
            since_version: 1,
            until_version: 12,
            build: dummy,
        });
        r.add(OpSchema {
            op_type: "X",
            domain: "ai.onnx",
            since_version: 13,
            until_version: i64::MAX,
            build: dummy,
        });
        assert_eq!(
            r.lookup("ai.onnx", "X", 5).map(|s| s.since_version),
            Some(1)
        );
        assert_eq!(r.lookup("", "X", 20).map(|s| s.since_version), Some(13));
        assert!(r.lookup("", "X", 0).is_none());
        assert!(r.lookup("com.microsoft", "X", 5).is_none());
        assert_eq!(r.schemas().count(), 2);
    }

    #[test]
    fn attr_getters_check_types() {
        let n = NodeDef::new("Foo", 13)
            .with_attr("a", AttrValue::Int(3))
            .with_attr("s", AttrValue::String(b"abc".to_vec()))
            .with_attr("bad", AttrValue::String(vec![0xff]));
        assert_eq!(n.attr_int("a"), Ok(Some(3)));
        assert_eq!(n.attr_int_or("b", 7), Ok(7));
        assert_eq!(n.attr_string("s"), Ok(Some("abc".into())));
        let e = n.attr_float("a").unwrap_err();
        assert!(
            e.0.contains("attribute 'a' must be a float, got int"),
            "{e}"
        );
        assert!(n.attr_string("bad").unwrap_err().0.contains("UTF-8"));
        assert!(
            n.req_ints("axes")
                .unwrap_err()
                .0
                .contains("missing required attribute 'axes'")
        );
    }

    #[test]
    fn the_registry_ranges_of_one_op_never_overlap() {
        let r = crate::ops::all();
        let mut by_op: HashMap<(String, &str), Vec<(i64, i64)>> = HashMap::new();
        for s in r.schemas() {
            assert!(
                s.since_version <= s.until_version,
                "{}: opset range {}..={} is empty",
                s.op_type,
                s.since_version,
                s.until_version
            );
            by_op
                .entry((canonical_domain(s.domain).to_string(), s.op_type))
                .or_default()
                .push((s.since_version, s.until_version));
        }
        for ((domain, op), mut ranges) in by_op {
            ranges.sort_unstable();
            for w in ranges.windows(2) {
                assert!(
                    w[0].1 < w[1].0,
                    "{domain}:{op}: opset ranges {:?} and {:?} overlap",
                    w[0],
                    w[1]
                );
            }
        }
    }

    #[test]
    fn an_op_whose_semantics_changed_has_one_schema_per_version() {
        let r = crate::ops::all();
        for op in ["Softmax", "LogSoftmax", "Hardmax"] {
            let old = r.lookup("", op, 12).expect("opset 12");
            let new = r.lookup("", op, 13).expect("opset 13");
            assert_eq!((old.since_version, old.until_version), (1, 12), "{op}");
            assert_eq!(
                (new.since_version, new.until_version),
                (13, i64::MAX),
                "{op}"
            );
        }
    }
}
