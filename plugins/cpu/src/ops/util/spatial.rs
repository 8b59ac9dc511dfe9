//! The window geometry attributes Conv and the pools share (`auto_pad`, `kernel_shape`,
//! `strides`, `pads`, `dilations`, `ceil_mode`), resolved against an input's extents into a
//! [`Spatial`].

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::fast::geometry::Spatial;
use crate::kernel::NodeDef;
use crate::limits::checked_numel;

/// The `auto_pad` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoPad {
    NotSet,
    SameUpper,
    SameLower,
    Valid,
}

/// Spatial attributes shared by Conv and the pools, as written on the node.
#[derive(Debug, Clone)]
pub struct SpatialAttrs {
    pub auto_pad: AutoPad,
    pub kernel_shape: Option<Vec<i64>>,
    pub strides: Option<Vec<i64>>,
    pub dilations: Option<Vec<i64>>,
    pub pads: Option<Vec<i64>>,
    pub ceil_mode: bool,
}

fn positive(op: &str, what: &str, v: &[i64]) -> OpResult<Vec<usize>> {
    v.iter()
        .map(|&x| {
            usize::try_from(x)
                .ok()
                .filter(|&u| u > 0)
                .ok_or_else(|| OpError(format!("{op}: {what} must be positive, got {v:?}")))
        })
        .collect()
}

impl SpatialAttrs {
    pub fn parse(node: &NodeDef) -> OpResult<Self> {
        let auto_pad = match node.attr_string_or("auto_pad", "NOTSET")?.as_str() {
            "NOTSET" | "" => AutoPad::NotSet,
            "SAME_UPPER" => AutoPad::SameUpper,
            "SAME_LOWER" => AutoPad::SameLower,
            "VALID" => AutoPad::Valid,
            other => return Err(node.error(format_args!("unknown auto_pad '{other}'"))),
        };
        Ok(SpatialAttrs {
            auto_pad,
            kernel_shape: node.attr_ints("kernel_shape")?,
            strides: node.attr_ints("strides")?,
            dilations: node.attr_ints("dilations")?,
            pads: node.attr_ints("pads")?,
            ceil_mode: node.attr_int_or("ceil_mode", 0)? != 0,
        })
    }

    /// Resolves the geometry for input spatial dims `input` and kernel dims `kernel`.
    pub fn resolve(&self, op: &str, input: &[usize], kernel: &[usize]) -> OpResult<Spatial> {
        let n = input.len();
        if kernel.len() != n {
            bail!(
                "{op}: kernel has {} spatial dims, input has {n}",
                kernel.len()
            );
        }
        let kernel = positive(
            op,
            "kernel_shape",
            &kernel.iter().map(|&k| k as i64).collect::<Vec<_>>(),
        )?;
        let per_dim = |what: &str, v: &Option<Vec<i64>>| -> OpResult<Vec<usize>> {
            match v {
                None => Ok(vec![1; n]),
                Some(v) if v.len() == n => positive(op, what, v),
                Some(v) => Err(OpError(format!("{op}: {what} {v:?} must have {n} values"))),
            }
        };
        let strides = per_dim("strides", &self.strides)?;
        let dilations = per_dim("dilations", &self.dilations)?;
        let mut pad_begin = vec![0usize; n];
        let mut pad_end = vec![0usize; n];
        let mut out = vec![0usize; n];
        let pads = match &self.pads {
            Some(p) if self.auto_pad == AutoPad::NotSet => {
                if p.len() != 2 * n {
                    bail!("{op}: pads {p:?} must have {} values", 2 * n);
                }
                if p.iter().any(|&x| !(0..=i64::from(i32::MAX)).contains(&x)) {
                    bail!("{op}: pads {p:?} must be in 0..=2^31-1");
                }
                p.iter().map(|&x| x as usize).collect()
            }
            _ => vec![0usize; 2 * n],
        };
        for d in 0..n {
            let (i, k, s, dl) = (input[d], kernel[d], strides[d], dilations[d]);
            let eff = dl
                .checked_mul(k - 1)
                .and_then(|x| x.checked_add(1))
                .ok_or_else(|| OpError(format!("{op}: kernel too large")))?;
            match self.auto_pad {
                AutoPad::SameUpper | AutoPad::SameLower => {
                    let o = i.div_ceil(s);
                    let total =
                        ((o.max(1) - 1).saturating_mul(s).saturating_add(eff)).saturating_sub(i);
                    let small = total / 2;
                    let big = total - small;
                    (pad_begin[d], pad_end[d]) = if self.auto_pad == AutoPad::SameUpper {
                        (small, big)
                    } else {
                        (big, small)
                    };
                    out[d] = o;
                }
                AutoPad::NotSet | AutoPad::Valid => {
                    pad_begin[d] = pads[d];
                    pad_end[d] = pads[d + n];
                    let padded = i.saturating_add(pad_begin[d]).saturating_add(pad_end[d]);
                    if padded < eff {
                        bail!(
                            "{op}: kernel extent {eff} is larger than the padded input {padded} in spatial dim {d}"
                        );
                    }
                    let span = padded - eff;
                    let mut o = if self.ceil_mode {
                        span.div_ceil(s)
                    } else {
                        span / s
                    } + 1;
                    if self.ceil_mode && (o - 1).saturating_mul(s) >= i.saturating_add(pad_begin[d])
                    {
                        o -= 1;
                    }
                    out[d] = o;
                }
            }
        }
        checked_numel(&out)?;
        // A stride past the padded input leaves one window in that dim: the same output as a
        // stride of the padded extent + 1, which keeps layouts sized by the stride (the
        // depthwise kernels' phase split) as small as the input.
        let mut strides = strides;
        for d in 0..n {
            if out[d] <= 1 {
                let reach = input[d]
                    .saturating_add(pad_begin[d])
                    .saturating_add(pad_end[d])
                    .saturating_add(1);
                strides[d] = strides[d].min(reach);
            }
        }
        Ok(Spatial {
            kernel,
            strides,
            dilations,
            pad_begin,
            pad_end,
            out,
        })
    }
}

/// Dims from a `kernel_shape` attribute.
pub fn kernel_dims(op: &str, v: &[i64]) -> OpResult<Vec<usize>> {
    positive(op, "kernel_shape", v)
}

/// A per-spatial-dim attribute: `n` values (default `dflt` each).
pub fn per_dim(
    op: &str,
    what: &str,
    v: &Option<Vec<i64>>,
    n: usize,
    dflt: i64,
) -> OpResult<Vec<i64>> {
    match v {
        None => Ok(vec![dflt; n]),
        Some(v) if v.len() == n => Ok(v.clone()),
        Some(v) => Err(OpError(format!("{op}: {what} {v:?} must have {n} values"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spatial_geometry() {
        let attrs = SpatialAttrs {
            auto_pad: AutoPad::SameUpper,
            kernel_shape: None,
            strides: Some(vec![2, 2]),
            dilations: None,
            pads: None,
            ceil_mode: false,
        };
        let s = attrs.resolve("Conv", &[5, 6], &[3, 3]).unwrap();
        assert_eq!(s.out, vec![3, 3]);
        assert_eq!(s.pad_begin, vec![1, 0]);
        assert_eq!(s.pad_end, vec![1, 1]);
        let ceil = SpatialAttrs {
            auto_pad: AutoPad::NotSet,
            ceil_mode: true,
            ..attrs
        };
        let s = ceil.resolve("MaxPool", &[4, 4], &[3, 3]).unwrap();
        assert_eq!(s.out, vec![2, 2]);
        let e = ceil.resolve("MaxPool", &[1, 1], &[3, 3]).unwrap_err();
        assert!(e.0.contains("larger than the padded input"), "{e}");
    }

    /// A stride past the padded input gives one window, as the same stride clamped to the
    /// padded extent + 1 does, in floor and ceil mode alike; the clamp keeps stride-sized
    /// layouts small.
    #[test]
    fn strides_past_the_input_are_clamped_without_changing_the_output() {
        for ceil_mode in [false, true] {
            let attrs = |s: i64| SpatialAttrs {
                auto_pad: AutoPad::NotSet,
                kernel_shape: None,
                strides: Some(vec![s, 2]),
                dilations: None,
                pads: Some(vec![1, 0, 2, 0]),
                ceil_mode,
            };
            let huge = attrs(1 << 40).resolve("Conv", &[3, 5], &[2, 1]).unwrap();
            let small = attrs(7).resolve("Conv", &[3, 5], &[2, 1]).unwrap();
            assert_eq!(huge.out, vec![1, 3]);
            assert_eq!(huge, small, "ceil_mode {ceil_mode}");
            assert_eq!(huge.strides, vec![7, 2]);
        }
    }
}
