//! The resolved geometry of a sliding window (convolution, pooling): kernel, strides,
//! dilations, padding and output extents per spatial dimension, as kernels read it; and the
//! shapes of one 2-D convolution, which its kernels share.

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

/// Shapes and geometry of one 2-D convolution.
pub struct Conv2d<'a> {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    /// Output channels.
    pub m: usize,
    pub group: usize,
    pub kh: usize,
    pub kw: usize,
    pub geo: &'a Spatial,
    /// The filters' Winograd transforms (`[group, 16, m / group, c / group]`) when the kernel
    /// made them once from constant weights; made per run otherwise.
    pub winograd: Option<&'a [f32]>,
    /// The filters packed for the direct kernel ([`super::direct::pack_weights`]) when the
    /// kernel packed them once from constant weights; packed per run otherwise.
    pub direct: Option<&'a [f32]>,
}

impl Conv2d<'_> {
    pub(crate) fn oh(&self) -> usize {
        self.geo.out[0]
    }
    pub(crate) fn ow(&self) -> usize {
        self.geo.out[1]
    }

    /// The multiply-adds of the convolution.
    pub(crate) fn macs(&self) -> usize {
        [
            self.n,
            self.m,
            self.oh(),
            self.ow(),
            self.c / self.group.max(1),
            self.kh,
            self.kw,
        ]
        .iter()
        .fold(1usize, |a, &d| a.saturating_mul(d))
    }
}
