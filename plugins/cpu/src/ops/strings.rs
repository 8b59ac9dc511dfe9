//! String tensors: the ops that only move elements (reshapes, gathers, concatenation, `Where`)
//! and `Equal` run on strings by dictionary-encoding them ([`Encoded`]); the string ops
//! themselves (StringNormalizer, StringConcat, StringSplit, RegexFullMatch) and TfIdfVectorizer
//! live here too.

use std::collections::HashMap;

use ndarray::{ArrayD, IxDyn, Zip};

use crate::ops::util::broadcast::{broadcast_all, broadcast_to};

use crate::bail;
use crate::error::{OpError, OpResult};
use crate::kernel::{NodeDef, OpKernel, kernel};
use crate::kernel::{add, one};
use crate::ops::util::args::input;
use crate::tensor::{Tensor, TensorRef};

/// Ops that run on strings through [`Encoded`], and whether their outputs are the (encoded)
/// elements, to be decoded back into strings, or something else (`Equal`'s bools, shapes).
const ENCODED_OPS: &[(&str, bool)] = &[
    ("Identity", true),
    ("Reshape", true),
    ("Flatten", true),
    ("Squeeze", true),
    ("Unsqueeze", true),
    ("Transpose", true),
    ("Concat", true),
    ("Gather", true),
    ("GatherElements", true),
    ("GatherND", true),
    ("Slice", true),
    ("Split", true),
    ("Expand", true),
    ("Tile", true),
    ("Where", true),
    ("Compress", true),
    ("ReverseSequence", true),
    ("ScatterElements", true),
    ("ScatterND", true),
    ("Scatter", true),
    ("ArrayFeatureExtractor", true),
    ("Equal", false),
    ("Shape", false),
    ("Size", false),
];

/// Wraps the kernel of an op that can take string tensors (see [`ENCODED_OPS`]).
pub(crate) fn wrap(op_type: &str, inner: Box<dyn OpKernel>) -> Box<dyn OpKernel> {
    match ENCODED_OPS.iter().find(|(op, _)| *op == op_type) {
        Some(&(_, decode)) => Box::new(Encoded { inner, decode }),
        None => inner,
    }
}

/// Runs a kernel written for numbers on string tensors: every distinct string of every string
/// input gets one int64 code (one dictionary for all inputs, so equal strings get equal codes),
/// the kernel runs on the codes, and int64 outputs are decoded when they are elements.
struct Encoded {
    inner: Box<dyn OpKernel>,
    decode: bool,
}

impl OpKernel for Encoded {
    /// The inner kernel's shape: a reshape moves elements of any type, strings included.
    fn reshaped_shape(&self, inputs: &[Option<TensorRef<'_>>]) -> Option<OpResult<Vec<usize>>> {
        self.inner.reshaped_shape(inputs)
    }

    fn prepare(&self, constants: &[Option<TensorRef<'_>>]) {
        self.inner.prepare(constants);
    }

    fn run(&self, inputs: &[Option<TensorRef<'_>>]) -> OpResult<Vec<Tensor>> {
        if !inputs
            .iter()
            .flatten()
            .any(|t| matches!(t, TensorRef::Str(_)))
        {
            return self.inner.run(inputs);
        }
        let mut codes: HashMap<&str, i64> = HashMap::new();
        let mut words: Vec<&str> = Vec::new();
        let mut encoded: Vec<Option<Tensor>> = Vec::with_capacity(inputs.len());
        for t in inputs {
            encoded.push(match t {
                Some(TensorRef::Str(a)) => Some(Tensor::I64(a.map(|s| {
                    *codes.entry(s.as_str()).or_insert_with(|| {
                        words.push(s.as_str());
                        words.len() as i64 - 1
                    })
                }))),
                _ => None,
            });
        }
        let args: Vec<Option<TensorRef<'_>>> = inputs
            .iter()
            .zip(&encoded)
            .map(|(t, e)| match e {
                Some(e) => Some(e.view()),
                None => t.as_ref().map(TensorRef::reborrow),
            })
            .collect();
        let outs = self.inner.run(&args)?;
        if !self.decode {
            return Ok(outs);
        }
        outs.into_iter()
            .map(|o| match o {
                Tensor::I64(a) => {
                    let mut bad = None;
                    let s = a.mapv(
                        |c| match usize::try_from(c).ok().and_then(|c| words.get(c)) {
                            Some(w) => (*w).to_string(),
                            None => {
                                bad = Some(c);
                                String::new()
                            }
                        },
                    );
                    match bad {
                        Some(c) => Err(OpError(format!("internal: string code {c} out of range"))),
                        None => Ok(Tensor::Str(s)),
                    }
                }
                other => Ok(other),
            })
            .collect()
    }
}

pub fn register(reg: &mut crate::kernel::Registry) {
    add(reg, "StringNormalizer", 10, build_normalizer);
    add(reg, "StringConcat", 20, build_concat);
    add(reg, "StringSplit", 20, build_split);
    add(reg, "RegexFullMatch", 20, build_regex);
    add(reg, "TfIdfVectorizer", 9, build_tfidf);
    crate::kernel::add_ms(reg, "Tokenizer", build_tokenizer);
}

/// How ONNX Runtime's Tokenizer finds tokens.
enum TokenRule {
    /// Every match of the expression is a token.
    Matches(regex::Regex),
    /// Text between matches of any separator expression is a token.
    Separators(regex::Regex),
    /// One token per character (a single empty separator).
    Chars,
}

/// `com.microsoft` Tokenizer (what skl2onnx's text vectorizers emit): splits each string into
/// tokens along a new last axis, padded with `pad_value`; tokens shorter than `mincharnum`
/// characters are dropped; `mark` brackets each list with U+0002 and U+0003.
fn build_tokenizer(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    const OP: &str = "Tokenizer";
    let mark = n.req_int("mark")? != 0;
    let pad = n
        .attr_string("pad_value")?
        .ok_or_else(|| OpError(format!("{OP}: missing required attribute 'pad_value'")))?;
    let min_chars = n.req_count("mincharnum")?;
    let compile = |p: &str| {
        regex::Regex::new(p).map_err(|e| OpError(format!("{OP}: bad expression {p:?}: {e}")))
    };
    let rule = match (n.attr_string("tokenexp")?, n.attr_strings("separators")?) {
        (Some(exp), _) if !exp.is_empty() => TokenRule::Matches(compile(&exp)?),
        (_, Some(seps)) if seps.len() == 1 && seps[0].is_empty() => TokenRule::Chars,
        (_, Some(seps)) if !seps.is_empty() => {
            if seps.iter().any(String::is_empty) {
                bail!("{OP}: an empty separator is only allowed alone (one token per character)");
            }
            let alt: Vec<String> = seps.iter().map(|s| format!("(?:{s})")).collect();
            TokenRule::Separators(compile(&alt.join("|"))?)
        }
        _ => bail!("{OP}: needs tokenexp or separators"),
    };
    Ok(kernel(move |inputs| {
        let x = input(OP, inputs, 0)?.as_strings("Tokenizer input")?;
        if !matches!(x.ndim(), 1 | 2) {
            bail!(
                "{OP}: the input must have shape [C] or [N, C], got {:?}",
                x.shape()
            );
        }
        let long_enough = |t: &&str| t.chars().count() >= min_chars;
        let lists: Vec<Vec<&str>> = x
            .iter()
            .map(|s| {
                let mut tokens: Vec<&str> = match &rule {
                    TokenRule::Matches(re) => re.find_iter(s).map(|m| m.as_str()).collect(),
                    TokenRule::Separators(re) => re.split(s).filter(|t| !t.is_empty()).collect(),
                    TokenRule::Chars => s
                        .char_indices()
                        .map(|(i, c)| &s[i..i + c.len_utf8()])
                        .collect(),
                };
                tokens.retain(long_enough);
                if mark {
                    tokens.insert(0, "\u{2}");
                    tokens.push("\u{3}");
                }
                tokens
            })
            .collect();
        let width = lists.iter().map(Vec::len).max().unwrap_or(0);
        let mut shape = x.shape().to_vec();
        shape.push(width);
        let mut flat = Vec::with_capacity(lists.len() * width);
        for l in &lists {
            flat.extend(l.iter().map(|t| (*t).to_string()));
            flat.extend(std::iter::repeat_n(pad.clone(), width - l.len()));
        }
        one(Tensor::strings(&shape, flat))
    }))
}

#[derive(Clone, Copy, PartialEq)]
enum CaseChange {
    None,
    Lower,
    Upper,
}

fn build_normalizer(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let case = match n.attr_string_or("case_change_action", "NONE")?.as_str() {
        "NONE" => CaseChange::None,
        "LOWER" => CaseChange::Lower,
        "UPPER" => CaseChange::Upper,
        other => bail!(
            "StringNormalizer: case_change_action must be NONE, LOWER or UPPER, not {other:?}"
        ),
    };
    let sensitive = n.attr_int_or("is_case_sensitive", 0)? != 0;
    let locale = n.attr_string_or("locale", "en_US")?;
    // Case mapping here is Unicode's, which agrees with every locale but Turkish and
    // Azeri (dotted and dotless i); refuse those rather than answer differently.
    if ["tr", "az"].iter().any(|l| locale.starts_with(l)) {
        bail!(
            "StringNormalizer: locale {locale:?} has its own case rules, which are not implemented"
        );
    }
    let stop = n.attr_strings("stopwords")?.unwrap_or_default();
    let stop: std::collections::HashSet<String> = if sensitive {
        stop.into_iter().collect()
    } else {
        stop.iter().map(|s| s.to_lowercase()).collect()
    };
    Ok(kernel(move |inputs| {
        let x = input("StringNormalizer", inputs, 0)?.as_strings("StringNormalizer input")?;
        let shape = x.shape().to_vec();
        let two_d = match shape.as_slice() {
            [_] => false,
            [1, _] => true,
            _ => bail!("StringNormalizer: input must have shape [C] or [1, C], got {shape:?}"),
        };
        let kept: Vec<String> = x
            .iter()
            .filter(|s| {
                if sensitive {
                    !stop.contains(s.as_str())
                } else {
                    !stop.contains(&s.to_lowercase())
                }
            })
            .map(|s| match case {
                CaseChange::None => s.clone(),
                CaseChange::Lower => s.to_lowercase(),
                CaseChange::Upper => s.to_uppercase(),
            })
            .collect();
        // Everything filtered out: one empty string, as ONNX Runtime returns.
        let kept = if kept.is_empty() {
            vec![String::new()]
        } else {
            kept
        };
        let out_shape = if two_d {
            vec![1, kept.len()]
        } else {
            vec![kept.len()]
        };
        one(Tensor::strings(&out_shape, kept))
    }))
}

fn build_concat(_: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    Ok(kernel(|inputs| {
        let a = input("StringConcat", inputs, 0)?.as_strings("StringConcat input X")?;
        let b = input("StringConcat", inputs, 1)?.as_strings("StringConcat input Y")?;
        let shape = broadcast_all("StringConcat", &[a.shape(), b.shape()])?;
        let av = broadcast_to("StringConcat", &a, &shape)?;
        let bv = broadcast_to("StringConcat", &b, &shape)?;
        one(Ok(Tensor::Str(
            Zip::from(&av)
                .and(&bv)
                .map_collect(|x, y| format!("{x}{y}")),
        )))
    }))
}

fn build_split(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let delimiter = n.attr_string("delimiter")?.filter(|d| !d.is_empty());
    let maxsplit = n.attr_int("maxsplit")?;
    let maxsplit = match maxsplit {
        Some(m) if m < 0 => bail!("StringSplit: maxsplit must not be negative, got {m}"),
        Some(m) => Some(m as usize),
        None => None,
    };
    Ok(kernel(move |inputs| {
        let x = input("StringSplit", inputs, 0)?.as_strings("StringSplit input")?;
        let parts: Vec<Vec<String>> = x
            .iter()
            .map(|s| split(s, delimiter.as_deref(), maxsplit))
            .collect();
        let width = parts.iter().map(Vec::len).max().unwrap_or(0);
        let mut shape = x.shape().to_vec();
        let counts = ArrayD::from_shape_vec(
            IxDyn(&shape),
            parts.iter().map(|p| p.len() as i64).collect(),
        )
        .map_err(|e| OpError(format!("StringSplit: {e}")))?;
        shape.push(width);
        let mut flat = Vec::with_capacity(parts.len() * width);
        for p in parts {
            let k = p.len();
            flat.extend(p);
            flat.extend(std::iter::repeat_n(String::new(), width - k));
        }
        Ok(vec![Tensor::strings(&shape, flat)?, Tensor::I64(counts)])
    }))
}

/// Python's `str.split(sep, maxsplit)`: without a separator, runs of whitespace separate and
/// leading/trailing whitespace yields nothing.
fn split(s: &str, sep: Option<&str>, maxsplit: Option<usize>) -> Vec<String> {
    match sep {
        Some(sep) => match maxsplit {
            Some(m) => s.splitn(m + 1, sep).map(str::to_string).collect(),
            None => s.split(sep).map(str::to_string).collect(),
        },
        None => {
            let mut out = Vec::new();
            let mut rest = s.trim_start();
            while !rest.is_empty() {
                if maxsplit.is_some_and(|m| out.len() == m) {
                    out.push(rest.trim_end().to_string());
                    break;
                }
                let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
                out.push(rest[..end].to_string());
                rest = rest[end..].trim_start();
            }
            out
        }
    }
}

fn build_regex(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    let pattern = n
        .attr_string("pattern")?
        .ok_or_else(|| OpError("RegexFullMatch: missing required attribute 'pattern'".into()))?;
    let re = regex::Regex::new(&format!("^(?:{pattern})$"))
        .map_err(|e| OpError(format!("RegexFullMatch: bad pattern {pattern:?}: {e}")))?;
    Ok(kernel(move |inputs| {
        let x = input("RegexFullMatch", inputs, 0)?.as_strings("RegexFullMatch input")?;
        one(Ok(Tensor::Bool(x.map(|s| re.is_match(s)))))
    }))
}

#[derive(Clone, Copy, PartialEq)]
enum TfIdfMode {
    Tf,
    Idf,
    TfIdf,
}

/// The n-grams of the pool, as token codes, with the output column of each.
struct NGrams {
    /// Pool token → code.
    ints: HashMap<i64, u32>,
    strings: HashMap<String, u32>,
    /// By n - 1: n-gram (codes) → output column.
    by_len: Vec<HashMap<Vec<u32>, usize>>,
}

fn build_tfidf(n: &NodeDef) -> OpResult<Box<dyn OpKernel>> {
    const OP: &str = "TfIdfVectorizer";
    let min_n = n.req_count("min_gram_length")?;
    let max_n = n.req_count("max_gram_length")?;
    let max_skip = usize::try_from(n.req_int("max_skip_count")?)
        .map_err(|_| OpError(format!("{OP}: max_skip_count must not be negative")))?;
    if min_n == 0 || min_n > max_n {
        bail!(
            "{OP}: gram lengths must satisfy 1 <= min_gram_length ({min_n}) <= max_gram_length ({max_n})"
        );
    }
    let mode = match n.attr_string("mode")?.as_deref() {
        Some("TF") => TfIdfMode::Tf,
        Some("IDF") => TfIdfMode::Idf,
        Some("TFIDF") => TfIdfMode::TfIdf,
        other => bail!("{OP}: mode must be TF, IDF or TFIDF, got {other:?}"),
    };
    let counts = n.req_ints("ngram_counts")?;
    let indexes = n.req_ints("ngram_indexes")?;
    let weights = n.attr_floats("weights")?;
    let pool_ints = n.attr_ints("pool_int64s")?;
    let pool_strings = n.attr_strings("pool_strings")?;
    let pool_len = match (&pool_ints, &pool_strings) {
        (Some(p), None) => p.len(),
        (None, Some(p)) => p.len(),
        _ => bail!("{OP}: exactly one of pool_int64s and pool_strings must be given"),
    };
    // ngram_counts[k]: where the (k+1)-grams start in the pool.
    let mut bounds: Vec<usize> = Vec::with_capacity(counts.len() + 1);
    for &c in &counts {
        let c = usize::try_from(c).map_err(|_| OpError(format!("{OP}: negative ngram_counts")))?;
        if c > pool_len || bounds.last().is_some_and(|&b| c < b) {
            bail!("{OP}: ngram_counts {counts:?} do not fit a pool of {pool_len}");
        }
        bounds.push(c);
    }
    bounds.push(pool_len);
    let mut grams = NGrams {
        ints: HashMap::new(),
        strings: HashMap::new(),
        by_len: vec![HashMap::new(); counts.len()],
    };
    let mut code_of = |k: usize| -> u32 {
        match (&pool_ints, &pool_strings) {
            (Some(p), _) => {
                let next = grams.ints.len() as u32;
                *grams.ints.entry(p[k]).or_insert(next)
            }
            (_, Some(p)) => {
                let next = grams.strings.len() as u32;
                *grams.strings.entry(p[k].clone()).or_insert(next)
            }
            _ => 0,
        }
    };
    let mut width = 0usize;
    let mut gram_index = 0usize;
    let mut by_len = vec![HashMap::new(); counts.len()];
    for len_minus_1 in 0..counts.len() {
        let (start, end) = (bounds[len_minus_1], bounds[len_minus_1 + 1]);
        let gram = len_minus_1 + 1;
        if (end - start) % gram != 0 {
            bail!(
                "{OP}: the {gram}-gram part of the pool has {} items, not a multiple of {gram}",
                end - start
            );
        }
        for g in (start..end).step_by(gram) {
            let key: Vec<u32> = (g..g + gram).map(&mut code_of).collect();
            let col = indexes.get(gram_index).copied().ok_or_else(|| {
                OpError(format!(
                    "{OP}: ngram_indexes has fewer entries than the pool has n-grams"
                ))
            })?;
            let col = usize::try_from(col)
                .map_err(|_| OpError(format!("{OP}: negative ngram_indexes entry {col}")))?;
            width = width.max(col + 1);
            by_len[len_minus_1].insert(key, col);
            gram_index += 1;
        }
    }
    grams.by_len = by_len;
    if let Some(w) = &weights
        && w.len() < width
    {
        bail!("{OP}: weights has {} entries for {width} outputs", w.len());
    }
    Ok(kernel(move |inputs| {
        let x = input(OP, inputs, 0)?;
        let shape = x.shape().to_vec();
        let (rows, cols) = match shape.as_slice() {
            [c] => (1, *c),
            [n, c] => (*n, *c),
            _ => bail!("{OP}: input must be 1-D or 2-D, got shape {shape:?}"),
        };
        // Tokens as pool codes; `None` for a token the pool does not hold.
        let tokens: Vec<Option<u32>> = match x {
            TensorRef::Str(a) => a.iter().map(|s| grams.strings.get(s).copied()).collect(),
            t => t
                .to_i64_vec(&format!("{OP} input"))?
                .iter()
                .map(|v| grams.ints.get(v).copied())
                .collect(),
        };
        let mut out = vec![0f32; crate::limits::checked_len(&[rows, width], 4)?];
        // An n-gram is never longer than the longest one in the pool (max_gram_length may be
        // far larger).
        let mut key = Vec::with_capacity(max_n.min(grams.by_len.len()));
        for r in 0..rows {
            let row = &tokens[r * cols..(r + 1) * cols];
            let counts = &mut out[r * width..(r + 1) * width];
            for gram in min_n..=max_n.min(grams.by_len.len()) {
                let table = &grams.by_len[gram - 1];
                // Unigrams have no gaps: count them once, not once per skip. A skip of a row's
                // length or more leaves no room for a second token.
                let skips = if gram == 1 { 0 } else { max_skip.min(cols) };
                for skip in 0..=skips {
                    let step = skip + 1;
                    let span = (gram - 1) * step;
                    for start in 0..cols.saturating_sub(span) {
                        key.clear();
                        let mut complete = true;
                        for k in 0..gram {
                            match row[start + k * step] {
                                Some(c) => key.push(c),
                                None => {
                                    complete = false;
                                    break;
                                }
                            }
                        }
                        if complete && let Some(&col) = table.get(&key) {
                            counts[col] += 1.0;
                        }
                    }
                }
            }
            for (col, c) in counts.iter_mut().enumerate() {
                let w = weights.as_ref().map_or(1.0, |w| w[col]);
                *c = match mode {
                    TfIdfMode::Tf => *c,
                    TfIdfMode::Idf => {
                        if *c > 0.0 {
                            w
                        } else {
                            0.0
                        }
                    }
                    TfIdfMode::TfIdf => *c * w,
                };
            }
        }
        let out_shape = if shape.len() == 1 {
            vec![width]
        } else {
            vec![rows, width]
        };
        one(Tensor::from_vec(&out_shape, out))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_follows_python() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(split("  a  b c ", None, None), s(&["a", "b", "c"]));
        assert_eq!(split("a  b c", None, Some(1)), s(&["a", "b c"]));
        assert_eq!(split("a,,b", Some(","), None), s(&["a", "", "b"]));
        assert_eq!(split("a,b,c", Some(","), Some(1)), s(&["a", "b,c"]));
        assert_eq!(split("", None, None), Vec::<String>::new());
        assert_eq!(split("", Some(","), None), s(&[""]));
    }

    #[test]
    fn equal_strings_compare_by_content() {
        let eq = wrap(
            "Equal",
            crate::ops::registry()
                .lookup("", "Equal", 19)
                .map(|s| (s.build)(&NodeDef::new("Equal", 19).with_io(2, 1)))
                .expect("Equal is registered")
                .expect("builds"),
        );
        let a = Tensor::strings(&[3], vec!["x".into(), "y".into(), "z".into()]).unwrap();
        let b = Tensor::strings(&[1], vec!["y".into()]).unwrap();
        let out = eq.run(&[Some(a.view()), Some(b.view())]).unwrap();
        assert_eq!(
            out[0],
            Tensor::Bool(ndarray::arr1(&[false, true, false]).into_dyn())
        );
    }
}
