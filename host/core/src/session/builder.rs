//! Configures and creates a [`Session`]: the EPs in priority order, strict placement, threads,
//! outputs left on their device. Committing hands the request to the compile pipeline.

use std::path::Path;
use std::sync::Arc;

use super::compile;
use super::compiled::Session;
use super::environment::Environment;
use super::request::ExecutionProvider;
use crate::error::Result;
use crate::model::ir::Model;

/// Configures and creates a [`Session`].
pub struct SessionBuilder {
    env: Option<Arc<Environment>>,
    providers: Vec<ExecutionProvider>,
    strict: bool,
    device_outputs: Vec<String>,
    intra_op_threads: Option<usize>,
    max_tensor_bytes: Option<u64>,
    policy: Option<super::SelectionPolicy>,
    kernel_cache: bool,
    profiling: bool,
    cancel: Option<super::RunOptions>,
}

impl Session {
    pub fn builder() -> Result<SessionBuilder> {
        Ok(SessionBuilder {
            env: None,
            providers: Vec::new(),
            strict: false,
            device_outputs: Vec::new(),
            intra_op_threads: None,
            max_tensor_bytes: None,
            policy: None,
            kernel_cache: true,
            profiling: false,
            cancel: None,
        })
    }
}

impl SessionBuilder {
    /// Uses `env` instead of [`Environment::global`].
    pub fn with_environment(mut self, env: Arc<Environment>) -> Self {
        self.env = Some(env);
        self
    }

    /// Chooses the EPs by `policy` from the devices the environment's EPs list (prefer GPU,
    /// NPU or CPU, max performance, min power, or the application's own function), instead of
    /// naming them. The placement report says what the policy chose and why. Naming EPs too
    /// is an error: one or the other.
    pub fn with_selection_policy(mut self, policy: super::SelectionPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Whether this session uses the environment's compiled-kernel cache (default: yes, when
    /// the environment has one; see [`crate::EnvironmentBuilder::with_kernel_cache`]): kernels
    /// of EPs that serialize them (ABI 1.6) are rebuilt from `<cache dir>/kernels` instead of
    /// compiled, and new ones stored there. The placement report says what happened per kernel.
    pub fn with_kernel_cache(mut self, enabled: bool) -> Self {
        self.kernel_cache = enabled;
        self
    }

    /// Profiling (default: off): the session times each kernel and copy of every run, and EPs
    /// that record their kernels' parts (ABI 1.7; the CPU EP does) the time of each node and what
    /// their compile passes did. Read it with [`Session::profile`].
    pub fn with_profiling(mut self, enabled: bool) -> Self {
        self.profiling = enabled;
        self
    }

    /// EPs in priority order; the CPU EP is always added last.
    pub fn with_execution_providers(
        mut self,
        eps: impl IntoIterator<Item = ExecutionProvider>,
    ) -> Result<Self> {
        self.providers.extend(eps);
        Ok(self)
    }

    /// Strict placement: session creation fails if any node would fall back to the CPU EP
    /// (the error lists them). Requesting `cpu` explicitly allows it.
    pub fn with_strict_placement(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// Threads the CPU EP shares a kernel's work across (its `intra_op_num_threads` option): 1
    /// runs everything on the calling thread; 0, the default, one per core. It applies to the
    /// fallback CPU EP and to a requested `cpu` EP that does not set the option itself. Vendor
    /// EPs take their own threading options.
    pub fn with_intra_op_threads(mut self, threads: usize) -> Self {
        self.intra_op_threads = Some(threads);
        self
    }

    /// The largest tensor this session allocates (bytes), in place of the process's limit
    /// ([`crate::max_tensor_bytes`]): a model or input asking for more is an error naming the
    /// node and the size. It holds for the host and the CPU EP's checks made on the thread that
    /// creates or runs the session; checks on the CPU EP's pool threads use the process's limit.
    pub fn with_max_tensor_bytes(mut self, bytes: u64) -> Self {
        self.max_tensor_bytes = Some(bytes);
        self
    }

    /// Leaves these graph outputs in their EP's memory instead of copying them to the host;
    /// read them with [`SessionOutputs::device`] and copy them later with
    /// [`DeviceTensor::to_host`].
    pub fn with_device_outputs<S: Into<String>>(
        mut self,
        names: impl IntoIterator<Item = S>,
    ) -> Self {
        self.device_outputs
            .extend(names.into_iter().map(Into::into));
        self
    }

    /// Makes the creation cancellable (ONNX Runtime's load cancellation flag): once `flag` is
    /// set from another thread, creation stops at its next step (after loading, before the EPs
    /// are set up, before partitioning, between kernels being compiled) with
    /// [`crate::Error::Cancelled`].
    pub fn with_cancellation(mut self, flag: &super::RunOptions) -> Self {
        self.cancel = Some(flag.clone());
        self
    }

    pub fn commit_from_file(self, path: impl AsRef<Path>) -> Result<Session> {
        let model = crate::with_max_tensor_bytes(self.max_tensor_bytes, || {
            crate::model::onnx::load_model_file(path.as_ref())
        })?;
        self.commit_from_model(model)
    }

    pub fn commit_from_memory(self, bytes: &[u8]) -> Result<Session> {
        let model = crate::with_max_tensor_bytes(self.max_tensor_bytes, || {
            crate::model::onnx::load_model_bytes(bytes, "<memory>", None)
        })?;
        self.commit_from_model(model)
    }

    pub fn commit_from_model(self, model: Model) -> Result<Session> {
        let env = match self.env {
            Some(e) => e,
            None => Environment::global()?,
        };
        let limit = self.max_tensor_bytes;
        super::run::check_cancelled(
            self.cancel.as_ref().map(super::RunOptions::flag),
            "after the model was loaded",
        )?;
        let mut session = crate::with_max_tensor_bytes(limit, || {
            // A policy chooses the EPs first, from the devices they list.
            let (providers, selection) = match &self.policy {
                None => (self.providers, None),
                Some(_) if !self.providers.is_empty() => {
                    return Err(crate::Error::InvalidInput(
                        "a session takes named EPs or a selection policy, not both".into(),
                    ));
                }
                Some(policy) => {
                    let (eps, selection) = super::select::select(&env, policy, &model)?;
                    tracing::debug!(
                        policy = policy.name(),
                        chosen = ?selection.chosen,
                        "EPs selected"
                    );
                    (eps, Some(selection))
                }
            };
            compile::compile(
                &env,
                compile::Request {
                    providers,
                    strict: self.strict,
                    device_outputs: self.device_outputs,
                    intra_op_threads: self.intra_op_threads,
                    selection,
                    kernel_cache: self.kernel_cache,
                    profiling: self.profiling,
                    cancel: self.cancel,
                },
                model,
            )
        })?;
        session.max_tensor_bytes = limit;
        Ok(session)
    }
}
