//! Sequences and optionals: SequenceEmpty, SequenceConstruct, SequenceAt, SequenceInsert,
//! SequenceErase, SequenceLength, SplitToSequence, ConcatFromSequence, Optional,
//! OptionalHasElement and OptionalGetElement. (SequenceMap, which has a body, is control flow.)

use std::sync::Arc;

use epx_plugin_api::ElementType;

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::kernel::{NodeDef, OpKernel, Registry, kernel};
use crate::kernel::{add, one};
use crate::ops::util::args::{input, normalize_axis, opt_input};
use crate::tensor::{Sequence, Tensor, TensorRef};

pub fn register(reg: &mut Registry) {
    add(reg, "SequenceEmpty", 11, build_empty);
    add(reg, "SequenceConstruct", 11, build_construct);
    add(reg, "SequenceAt", 11, build_at);
    add(reg, "SequenceInsert", 11, build_insert);
    add(reg, "SequenceErase", 11, build_erase);
    add(reg, "SequenceLength", 11, build_length);
    add(reg, "SplitToSequence", 11, build_split);
    add(reg, "ConcatFromSequence", 11, build_concat);
    add(reg, "Optional", 15, build_optional);
    add(reg, "OptionalHasElement", 15, build_has_element);
    add(reg, "OptionalGetElement", 15, build_get_element);
}

fn sequence(elem_type: ElementType, items: Vec<Tensor>) -> Tensor {
    Tensor::Seq(Arc::new(Sequence { elem_type, items }))
}

/// The element type a `dtype` attribute names (float when absent).
fn dtype(n: &NodeDef) -> OpResult<ElementType> {
    let code = n.attr_int_or("dtype", ElementType::Float as i64)?;
    i32::try_from(code)
        .ok()
        .and_then(ElementType::from_onnx)
        .filter(|t| *t != ElementType::Undefined)
        .ok_or_else(|| n.error(format_args!("dtype {code} is not an element type")))
}

fn build_empty(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let ty = dtype(n)?;
    Ok(kernel(move |_| one(Ok(sequence(ty, Vec::new())))))
}

fn check_item(op: &str, seq: &Sequence, t: &TensorRef<'_>) -> OpResult<()> {
    if !t.is_tensor() {
        bail!(
            "{op}: sequence items must be tensors, got {}",
            t.type_name()
        );
    }
    if seq.elem_type != ElementType::Undefined && t.elem_type() != seq.elem_type {
        bail!(
            "{op}: a sequence of {} tensors cannot take a {} tensor",
            seq.elem_type,
            t.elem_type()
        );
    }
    Ok(())
}

fn build_construct(_: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    Ok(kernel(|inputs| {
        let first = input("SequenceConstruct", inputs, 0)?;
        let mut seq = Sequence {
            elem_type: first.elem_type(),
            items: Vec::with_capacity(inputs.len()),
        };
        for t in inputs {
            let t = t
                .as_ref()
                .ok_or_else(|| OpError("SequenceConstruct: an input is missing".into()))?;
            check_item("SequenceConstruct", &seq, t)?;
            seq.items.push(t.try_to_owned()?);
        }
        one(Ok(Tensor::Seq(Arc::new(seq))))
    }))
}

/// A position input (int32 or int64 scalar) in `[-len, len)`, or `[-len, len]` when `end_ok`.
fn position(op: &str, t: &TensorRef<'_>, len: usize, end_ok: bool) -> OpResult<usize> {
    let v = t.to_i64_vec(&format!("{op} position"))?;
    let [p] = v.as_slice() else {
        bail!("{op}: position must be a scalar, got shape {:?}", t.shape());
    };
    let n = len as i64;
    let hi = if end_ok { n } else { n - 1 };
    if *p < -n || *p > hi {
        bail!("{op}: position {p} is out of range for a sequence of {len}");
    }
    Ok(if *p < 0 { p + n } else { *p } as usize)
}

fn build_at(_: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    Ok(kernel(|inputs| {
        let seq = input("SequenceAt", inputs, 0)?.as_sequence("SequenceAt input")?;
        let p = position(
            "SequenceAt",
            input("SequenceAt", inputs, 1)?,
            seq.items.len(),
            false,
        )?;
        one(Ok(seq.items[p].clone()))
    }))
}

fn build_insert(_: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    Ok(kernel(|inputs| {
        let seq = input("SequenceInsert", inputs, 0)?.as_sequence("SequenceInsert input")?;
        let t = input("SequenceInsert", inputs, 1)?;
        check_item("SequenceInsert", seq, t)?;
        let p = match opt_input(inputs, 2) {
            Some(p) => position("SequenceInsert", p, seq.items.len(), true)?,
            None => seq.items.len(),
        };
        let mut items = seq.items.clone();
        items.insert(p, t.try_to_owned()?);
        let ty = if seq.elem_type == ElementType::Undefined {
            t.elem_type()
        } else {
            seq.elem_type
        };
        one(Ok(sequence(ty, items)))
    }))
}

fn build_erase(_: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    Ok(kernel(|inputs| {
        let seq = input("SequenceErase", inputs, 0)?.as_sequence("SequenceErase input")?;
        if seq.items.is_empty() {
            bail!("SequenceErase: the sequence is empty");
        }
        let p = match opt_input(inputs, 1) {
            Some(p) => position("SequenceErase", p, seq.items.len(), false)?,
            None => seq.items.len() - 1,
        };
        let mut items = seq.items.clone();
        items.remove(p);
        one(Ok(sequence(seq.elem_type, items)))
    }))
}

fn build_length(_: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    Ok(kernel(|inputs| {
        let seq = input("SequenceLength", inputs, 0)?.as_sequence("SequenceLength input")?;
        one(Ok(Tensor::scalar(seq.items.len() as i64)))
    }))
}

/// Runs an op of the registry on `inputs` (Split, Concat and Squeeze do the element work of the
/// sequence ops, strings included).
fn run_op(node: &NodeDef, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
    crate::kernel::installed_registry()?
        .build(node)?
        .run(inputs)
}

fn build_split(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let axis = n.attr_int_or("axis", 0)?;
    let keepdims = n.attr_int_or("keepdims", 1)? != 0;
    Ok(kernel(move |inputs| {
        const OP: &str = "SplitToSequence";
        let x = input(OP, inputs, 0)?;
        let rank = x.shape().len();
        let ax = normalize_axis(OP, axis, rank)?;
        let dim = x.shape()[ax];
        let sizes: Vec<i64> = match opt_input(inputs, 1) {
            None => vec![1; dim],
            Some(s) => {
                let v = s.to_i64_vec(&format!("{OP} split"))?;
                if s.shape().is_empty() {
                    let [k] = v.as_slice() else {
                        bail!("{OP}: split must hold one element");
                    };
                    if *k <= 0 {
                        bail!("{OP}: split {k} must be positive");
                    }
                    let k = *k as usize;
                    let mut parts = vec![k as i64; dim / k];
                    if dim % k != 0 {
                        parts.push((dim % k) as i64);
                    }
                    parts
                } else {
                    if v.iter().any(|&p| p < 0) || v.iter().sum::<i64>() != dim as i64 {
                        bail!("{OP}: split {v:?} does not add up to the axis's {dim}");
                    }
                    v
                }
            }
        };
        let ty = x.elem_type();
        if sizes.is_empty() {
            return one(Ok(sequence(ty, Vec::new())));
        }
        let split_node = NodeDef::new("Split", 13)
            .with_attr("axis", crate::kernel::AttrValue::Int(ax as i64))
            .with_io(2, sizes.len());
        let split = Tensor::from_vec(&[sizes.len()], sizes.clone())?;
        let mut parts = run_op(&split_node, &[Some(x.reborrow()), Some(split.view())])?;
        // Without `split`, keepdims=0 drops the split axis (each part has extent 1 there).
        if !keepdims && opt_input(inputs, 1).is_none() {
            let axes = Tensor::from_vec(&[1], vec![ax as i64])?;
            let squeeze = NodeDef::new("Squeeze", 13).with_io(2, 1);
            parts = parts
                .iter()
                .map(|p| {
                    run_op(&squeeze, &[Some(p.view()), Some(axes.view())]).and_then(|mut o| {
                        o.pop()
                            .ok_or_else(|| OpError("Squeeze gave nothing".into()))
                    })
                })
                .collect::<OpResult<_>>()?;
        }
        one(Ok(sequence(ty, parts)))
    }))
}

fn build_concat(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let axis = n.req_int("axis")?;
    let new_axis = n.attr_int_or("new_axis", 0)? != 0;
    Ok(kernel(move |inputs| {
        const OP: &str = "ConcatFromSequence";
        let seq = input(OP, inputs, 0)?.as_sequence(&format!("{OP} input"))?;
        let Some(first) = seq.items.first() else {
            bail!("{OP}: the sequence is empty");
        };
        let rank = first.shape().len() + usize::from(new_axis);
        let ax = normalize_axis(OP, axis, rank)?;
        let concat = NodeDef::new("Concat", 13)
            .with_attr("axis", crate::kernel::AttrValue::Int(ax as i64))
            .with_io(seq.items.len(), 1);
        if !new_axis {
            let args: Vec<Option<TensorRef<'_>>> =
                seq.items.iter().map(|t| Some(t.view())).collect();
            return run_op(&concat, &args);
        }
        // A new axis: unsqueeze each item there, then concatenate.
        let axes = Tensor::from_vec(&[1], vec![ax as i64])?;
        let unsqueeze = NodeDef::new("Unsqueeze", 13).with_io(2, 1);
        let expanded: Vec<Tensor> = seq
            .items
            .iter()
            .map(|t| {
                run_op(&unsqueeze, &[Some(t.view()), Some(axes.view())]).and_then(|mut o| {
                    o.pop()
                        .ok_or_else(|| OpError("Unsqueeze gave nothing".into()))
                })
            })
            .collect::<OpResult<_>>()?;
        let args: Vec<Option<TensorRef<'_>>> = expanded.iter().map(|t| Some(t.view())).collect();
        run_op(&concat, &args)
    }))
}

fn build_optional(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let typed = n.has_attr("type");
    Ok(kernel(move |inputs| match opt_input(inputs, 0) {
        Some(t) => one(Ok(Tensor::Opt(Some(Arc::new(t.try_to_owned()?))))),
        None if typed => one(Ok(Tensor::Opt(None))),
        None => bail!("Optional: without an input, the `type` attribute is required"),
    }))
}

fn build_has_element(_: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    Ok(kernel(|inputs| {
        let has = match opt_input(inputs, 0) {
            None => false,
            Some(TensorRef::Opt(v)) => v.is_some(),
            // From opset 18 a plain tensor or sequence may stand for a present optional.
            Some(_) => true,
        };
        one(Ok(Tensor::scalar(has)))
    }))
}

fn build_get_element(_: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    Ok(kernel(|inputs| {
        match input("OptionalGetElement", inputs, 0)? {
            TensorRef::Opt(Some(v)) => one(Ok(Tensor::clone(v))),
            TensorRef::Opt(None) => bail!("OptionalGetElement: the optional is empty"),
            t => one(Ok(t.try_to_owned()?)),
        }
    }))
}
