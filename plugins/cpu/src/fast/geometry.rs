//! The resolved geometry of a sliding window (convolution, pooling): kernel, strides,
//! dilations, padding and output extents per spatial dimension, as kernels read it.

use crate::error::OpResult;
use crate::limits::checked_numel;

/// Resolved geometry for `n` spatial dimensions.
#[derive(Debug, Clone, PartialEq)]
pub struct Spatial {
    pub kernel: Vec<usize>,
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    pub pad_begin: Vec<usize>,
    pub pad_end: Vec<usize>,
    pub out: Vec<usize>,
}

impl Spatial {
    /// The output shape `[lead..., out...]` (batch and channels first), checked against the
    /// tensor size limit.
    pub fn checked_output(&self, lead: &[usize]) -> OpResult<Vec<usize>> {
        let mut shape = lead.to_vec();
        shape.extend_from_slice(&self.out);
        checked_numel(&shape)?;
        Ok(shape)
    }
}
