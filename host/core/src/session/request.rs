//! What a session is asked for: an execution provider by name, with string options.

/// An EP requested for a session, by name (`cuda`, or `plugin/ep` to pick one plugin), with
/// string options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutionProvider {
    pub(crate) name: String,
    pub(crate) options: Vec<(String, String)>,
    pub(crate) error_on_failure: bool,
    pub(crate) isolated: bool,
    pub(crate) device: Option<String>,
}

impl ExecutionProvider {
    pub fn new(name: impl Into<String>) -> Self {
        ExecutionProvider {
            name: name.into(),
            options: Vec::new(),
            error_on_failure: false,
            isolated: false,
            device: None,
        }
    }

    /// Adds a provider option; the EP rejects keys it does not know when the session is made.
    pub fn with_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.push((key.into(), value.into()));
        self
    }

    /// Fail session creation when this EP cannot be set up, instead of continuing without it.
    pub fn error_on_failure(mut self) -> Self {
        self.error_on_failure = true;
        self
    }

    /// Run this EP in a child process (`epx serve-plugin`): a crash or hang of the plugin fails
    /// the call it happened in, and the next call starts a new process. Tensors pass through
    /// shared memory; only EPs of plugin libraries whose tensors live in host memory can be
    /// isolated. A plugin whose manifest says `isolate = true` always is.
    pub fn isolated(mut self) -> Self {
        self.isolated = true;
        self
    }

    /// Run this EP on one of the devices it lists (ABI 1.5), named by its id (`1` for
    /// `cuda:1`) or its name (`GPU.0` for `openvino:GPU.0`), as `epx providers --devices`
    /// shows them. Setting up the EP fails, saying why, when it lists no such device or the
    /// device is unusable. The placement report names the device.
    pub fn on_device(mut self, device: impl Into<String>) -> Self {
        self.device = Some(device.into());
        self
    }

    pub fn device(&self) -> Option<&str> {
        self.device.as_deref()
    }

    pub fn is_isolated(&self) -> bool {
        self.isolated
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn options(&self) -> &[(String, String)] {
        &self.options
    }
}
