//! `config.toml` of one model: how its session is made (EPs with options and devices, or a
//! selection policy; threads; isolation; kernel cache), how many runs and waiting requests it
//! takes, batching, a timeout, and the inputs and outputs it is expected to have, checked
//! against the model when it loads. Every key is optional; an unknown key is refused with the
//! file's name.

use std::collections::BTreeMap;

use epx::{ExecutionProvider, SelectionPolicy, SessionBuilder, ValueSpec};
use serde::Deserialize;

use crate::protocol::{datatype_and_shape, element_of};

/// A request's deadline when the model's `config.toml` gives no `timeout_ms`: long enough for
/// any model that serves interactively, short enough that one stuck run does not hold an
/// instance for good.
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Threads the CPU EP shares each kernel's work across (absent: one per core).
    pub threads: Option<usize>,
    /// Runs of this model that may compute at once.
    #[serde(default = "one")]
    pub instances: usize,
    /// Requests that may wait for an instance; one more is refused (HTTP 503).
    #[serde(default = "default_queue")]
    pub max_queue: usize,
    /// EPs in priority order (the CPU EP is always there, last). Exclusive with `policy`.
    #[serde(default)]
    pub providers: Vec<ProviderConfig>,
    /// A selection policy (`prefer-gpu`, `max-performance`, ...) instead of naming EPs.
    pub policy: Option<String>,
    /// Whether the session uses the environment's compiled-kernel cache (absent: yes, when
    /// the environment has one).
    pub kernel_cache: Option<bool>,
    /// Refuse to load when a node would fall back to the CPU EP.
    #[serde(default)]
    pub strict_placement: bool,
    /// The most rows (along every input's and output's first dimension) one run takes; 0: the
    /// first dimension is not a batch dimension and requests are never stacked.
    #[serde(default)]
    pub max_batch_size: usize,
    /// Stack the rows of queued requests into one run (needs `max_batch_size` > 0).
    pub dynamic_batching: Option<BatchingConfig>,
    /// A request not answered within this many milliseconds gets a timeout error, and its run
    /// is cancelled ([`DEFAULT_TIMEOUT_MS`] when left out; 0: no deadline).
    pub timeout_ms: Option<u64>,
    /// The inputs the model must have (all of them, by name and datatype, and shape if given).
    #[serde(default)]
    pub inputs: Vec<TensorConfig>,
    /// Outputs the model must have (any of them).
    #[serde(default)]
    pub outputs: Vec<TensorConfig>,
}

/// One EP of `providers`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// The EP's name, as `epx providers` lists it.
    pub name: String,
    /// One of the devices the EP lists (`epx providers --devices`): an id or a name.
    pub device: Option<String>,
    /// Run the EP in a child process: a crash fails only the requests it was running.
    #[serde(default)]
    pub isolated: bool,
    /// Whether loading fails when the EP cannot be set up (default); `false` lets its nodes
    /// run on the next EP, which the log and the placement report say.
    #[serde(default = "yes")]
    pub required: bool,
    /// The EP's options; numbers and booleans are passed as their text.
    #[serde(default)]
    pub options: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchingConfig {
    /// Batch sizes to run as soon as they are reached (absent: only `max_batch_size`).
    #[serde(default)]
    pub preferred_sizes: Vec<usize>,
    /// How long the first request of a batch may wait for others, in microseconds.
    #[serde(default)]
    pub max_queue_delay_us: u64,
}

/// An input or output the model must have.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorConfig {
    pub name: String,
    /// The protocol's datatype name (`FP32`, `INT64`, `BYTES`, ...).
    pub datatype: String,
    /// Extents, -1 for a dynamic one.
    pub shape: Option<Vec<i64>>,
}

fn one() -> usize {
    1
}

fn yes() -> bool {
    true
}

fn default_queue() -> usize {
    64
}

impl Default for ModelConfig {
    fn default() -> Self {
        toml::from_str("").expect("every key has a default")
    }
}

impl ModelConfig {
    /// The deadline of the model's requests: `timeout_ms`, [`DEFAULT_TIMEOUT_MS`] when left
    /// out, none for 0.
    pub fn timeout(&self) -> Option<std::time::Duration> {
        match self.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS) {
            0 => None,
            ms => Some(std::time::Duration::from_millis(ms)),
        }
    }

    /// What can be checked before the model is read.
    pub fn check(&self) -> Result<(), String> {
        if self.instances == 0 {
            return Err("instances must be at least 1".into());
        }
        if self.policy.is_some() && !self.providers.is_empty() {
            return Err("give `providers` or `policy`, not both".into());
        }
        if let Some(p) = &self.policy {
            SelectionPolicy::from_name(p).map_err(|e| e.to_string())?;
        }
        if let Some(b) = &self.dynamic_batching {
            if self.max_batch_size == 0 {
                return Err(
                    "dynamic_batching needs max_batch_size > 0 (the rows one run may take)".into(),
                );
            }
            if let Some(&s) = b
                .preferred_sizes
                .iter()
                .find(|&&s| s == 0 || s > self.max_batch_size)
            {
                return Err(format!(
                    "preferred size {s} is not between 1 and max_batch_size ({})",
                    self.max_batch_size
                ));
            }
        }
        for t in self.inputs.iter().chain(&self.outputs) {
            if element_of(&t.datatype).is_none() {
                return Err(format!(
                    "`{}`: unknown datatype {:?} (the protocol's are BOOL, UINT8..UINT64, \
                     INT8..INT64, FP16, FP32, FP64, BF16, BYTES)",
                    t.name, t.datatype
                ));
            }
        }
        Ok(())
    }

    /// The session builder with this configuration's EPs, policy, threads and cache.
    pub fn apply(&self, mut builder: SessionBuilder) -> Result<SessionBuilder, String> {
        if let Some(n) = self.threads {
            builder = builder.with_intra_op_threads(n);
        }
        if let Some(p) = &self.policy {
            builder = builder
                .with_selection_policy(SelectionPolicy::from_name(p).map_err(|e| e.to_string())?);
        }
        if let Some(cache) = self.kernel_cache {
            builder = builder.with_kernel_cache(cache);
        }
        builder = builder.with_strict_placement(self.strict_placement);
        let mut eps = Vec::with_capacity(self.providers.len());
        for p in &self.providers {
            let mut ep = ExecutionProvider::new(&p.name);
            for (key, value) in &p.options {
                let text = match value {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Integer(i) => i.to_string(),
                    toml::Value::Float(f) => f.to_string(),
                    toml::Value::Boolean(b) => b.to_string(),
                    other => {
                        return Err(format!(
                            "provider `{}`: option `{key}` must be a string, number or boolean, \
                             not a {}",
                            p.name,
                            other.type_str()
                        ));
                    }
                };
                ep = ep.with_option(key, text);
            }
            if let Some(d) = &p.device {
                ep = ep.on_device(d);
            }
            if p.isolated {
                ep = ep.isolated();
            }
            if p.required {
                ep = ep.error_on_failure();
            }
            eps.push(ep);
        }
        if !eps.is_empty() {
            builder = builder
                .with_execution_providers(eps)
                .map_err(|e| e.to_string())?;
        }
        Ok(builder)
    }

    /// Checks the model's inputs and outputs against `inputs`, `outputs` and `max_batch_size`.
    pub fn check_model(&self, inputs: &[ValueSpec], outputs: &[ValueSpec]) -> Result<(), String> {
        if !self.inputs.is_empty() {
            let named = |list: &[TensorConfig], n: &str| list.iter().any(|t| t.name == n);
            let missing: Vec<&str> = inputs
                .iter()
                .filter(|s| !named(&self.inputs, &s.name))
                .map(|s| s.name.as_str())
                .collect();
            if !missing.is_empty() {
                return Err(format!(
                    "`inputs` lacks the model's input(s) {}",
                    missing.join(", ")
                ));
            }
        }
        for (kind, expected, actual) in [
            ("input", &self.inputs, inputs),
            ("output", &self.outputs, outputs),
        ] {
            for t in expected {
                let spec = actual.iter().find(|s| s.name == t.name).ok_or_else(|| {
                    format!(
                        "the model has no {kind} `{}` (its {kind}s: {})",
                        t.name,
                        actual
                            .iter()
                            .map(|s| s.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })?;
                let (datatype, shape) = datatype_and_shape(spec);
                if datatype != t.datatype {
                    return Err(format!(
                        "{kind} `{}` is {datatype} in the model, not {}",
                        t.name, t.datatype
                    ));
                }
                if let Some(want) = &t.shape
                    && spec.shape.is_some()
                    && *want != shape
                {
                    return Err(format!(
                        "{kind} `{}` has shape {shape:?} in the model, not {want:?}",
                        t.name
                    ));
                }
            }
        }
        if self.max_batch_size > 0 {
            for (kind, specs) in [("input", inputs), ("output", outputs)] {
                for s in specs {
                    if let Some(dims) = &s.shape {
                        match dims.first() {
                            None => {
                                return Err(format!(
                                    "max_batch_size needs a batch dimension, but {kind} `{}` is a \
                                     scalar",
                                    s.name
                                ));
                            }
                            Some(Some(n)) => {
                                return Err(format!(
                                    "max_batch_size needs a dynamic first dimension, but {kind} \
                                     `{}` has a fixed {n}",
                                    s.name
                                ));
                            }
                            Some(None) => {}
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use epx::ElementType;
    use epx::ir::ValueType;

    fn spec(name: &str, elem: ElementType, shape: &[Option<u64>]) -> ValueSpec {
        ValueSpec {
            name: name.into(),
            elem_type: Some(elem),
            shape: Some(shape.to_vec()),
            symbols: vec![None; shape.len()],
            ty: ValueType::Tensor {
                elem_type: Some(elem),
                shape: None,
            },
        }
    }

    fn config(text: &str) -> Result<ModelConfig, String> {
        let c: ModelConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        c.check()?;
        Ok(c)
    }

    #[test]
    fn a_model_without_timeout_ms_gets_the_default_deadline_and_0_means_none() {
        use std::time::Duration;
        let given = |text: &str| config(text).unwrap().timeout();
        assert_eq!(given(""), Some(Duration::from_millis(DEFAULT_TIMEOUT_MS)));
        assert_eq!(given("timeout_ms = 250"), Some(Duration::from_millis(250)));
        assert_eq!(given("timeout_ms = 0"), None);
    }

    #[test]
    fn a_full_configuration_reads_and_wrong_ones_say_why() {
        let c = config(
            r#"
            threads = 2
            instances = 2
            max_queue = 8
            kernel_cache = false
            max_batch_size = 8
            timeout_ms = 500
            [dynamic_batching]
            preferred_sizes = [4, 8]
            max_queue_delay_us = 200
            [[providers]]
            name = "openvino"
            device = "GPU.0"
            isolated = true
            options = { precision = "FP16", num_streams = 2, cache = true }
            [[inputs]]
            name = "x"
            datatype = "FP32"
            shape = [-1, 3]
            "#,
        )
        .unwrap();
        assert_eq!(c.providers[0].options.len(), 3);
        assert!(c.providers[0].required);
        assert_eq!(c.dynamic_batching.as_ref().unwrap().preferred_sizes, [4, 8]);
        for (text, says) in [
            ("instance = 2", "unknown field `instance`"),
            ("instances = 0", "instances must be at least 1"),
            ("policy = \"fastest\"", "no selection policy `fastest`"),
            (
                "policy = \"prefer-gpu\"\n[[providers]]\nname = \"cuda\"",
                "not both",
            ),
            (
                "[dynamic_batching]\nmax_queue_delay_us = 5",
                "needs max_batch_size > 0",
            ),
            (
                "max_batch_size = 4\n[dynamic_batching]\npreferred_sizes = [8]",
                "preferred size 8",
            ),
            (
                "[[inputs]]\nname = \"x\"\ndatatype = \"FLOAT\"",
                "unknown datatype \"FLOAT\"",
            ),
            (
                "[[providers]]\nname = \"x\"\nflavour = 1",
                "unknown field `flavour`",
            ),
        ] {
            let e = config(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn inputs_outputs_and_the_batch_dimension_are_checked_against_the_model() {
        let inputs = [spec("x", ElementType::Float, &[None, Some(3)])];
        let outputs = [
            spec("y", ElementType::Float, &[None, Some(2)]),
            spec("n", ElementType::Int64, &[None]),
        ];
        let check = |text: &str| config(text).unwrap().check_model(&inputs, &outputs);
        check("max_batch_size = 4\n[[inputs]]\nname = \"x\"\ndatatype = \"FP32\"\nshape = [-1, 3]\n[[outputs]]\nname = \"n\"\ndatatype = \"INT64\"").unwrap();
        for (text, says) in [
            (
                "[[inputs]]\nname = \"x\"\ndatatype = \"FP64\"",
                "input `x` is FP32 in the model, not FP64",
            ),
            (
                "[[inputs]]\nname = \"x\"\ndatatype = \"FP32\"\nshape = [-1, 4]",
                "has shape [-1, 3] in the model",
            ),
            (
                "[[inputs]]\nname = \"z\"\ndatatype = \"FP32\"",
                "lacks the model's input(s) x",
            ),
            (
                "[[outputs]]\nname = \"q\"\ndatatype = \"FP32\"",
                "the model has no output `q` (its outputs: y, n)",
            ),
        ] {
            let e = check(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
        let fixed = [spec("x", ElementType::Float, &[Some(1), Some(3)])];
        let e = config("max_batch_size = 2")
            .unwrap()
            .check_model(&fixed, &outputs)
            .unwrap_err();
        assert!(e.contains("input `x` has a fixed 1"), "{e}");
    }
}
