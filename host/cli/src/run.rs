//! `epx run`: load a model on the chosen EPs, feed it inputs (from `.npy` files or random),
//! print and optionally save its outputs, and time it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use epx::{
    ElementType, Environment, Error, ExecutionProvider, Result, Session, SessionBuilder, Tensor,
    Value, ValueSpec, printable,
};
use epx_io::valuefile;

#[derive(clap::Args)]
pub struct RunArgs {
    /// The ONNX model file.
    model: PathBuf,
    /// An input as NAME=FILE.npy (repeatable); inputs not given get random data.
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// An EP to use, in priority order (repeatable); the CPU EP always takes what is left.
    /// Options as NAME:KEY=VALUE,KEY=VALUE; a device the EP lists (`epx providers --devices`)
    /// as NAME:DEVICE or NAME:DEVICE:KEY=VALUE,...
    #[arg(long = "ep", value_name = "NAME")]
    eps: Vec<String>,
    /// Write each output as <DIR>/<output name>.npy.
    #[arg(long = "output-dir", value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// Time N runs after one warm-up run and print min/median/max.
    #[arg(long, value_name = "N")]
    repeat: Option<usize>,
    /// Threads the CPU EP shares each kernel's work across (0: one per core, the default).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Run each --ep in a child process: a crash or hang of its plugin fails the run with an
    /// error instead of killing epx (host-memory EPs only).
    #[arg(long)]
    isolate: bool,
    /// Choose the EPs by policy from the devices they list instead of naming them:
    /// prefer-cpu, prefer-gpu, prefer-npu, max-performance, min-power, or measure (times the
    /// candidates on the model and remembers the fastest); `--ep auto` is max-performance.
    #[arg(long, value_name = "NAME")]
    policy: Option<String>,
    /// After the runs, print where their time went (the --repeat runs when given, else the one
    /// run): by op type and EP, the slowest nodes, and what the EPs' compile passes did.
    #[arg(long)]
    profile: bool,
    /// Write the profile as JSON to FILE (implies --profile's timing; prints no table).
    #[arg(long, value_name = "FILE")]
    profile_json: Option<PathBuf>,
}

/// How many of the slowest nodes `--profile` lists.
const PROFILE_TOP_NODES: usize = 15;

#[derive(clap::Args)]
pub struct PartitionArgs {
    /// The ONNX model file.
    model: PathBuf,
    /// An EP to use, in priority order (repeatable), as for `run`.
    #[arg(long = "ep", value_name = "NAME")]
    eps: Vec<String>,
    /// Fail if any node would fall back to the CPU EP.
    #[arg(long)]
    strict: bool,
    /// Also write the placement as a Graphviz picture (nodes coloured by EP, copies in red).
    #[arg(long, value_name = "FILE")]
    dot: Option<PathBuf>,
    /// Choose the EPs by policy, as for `run`.
    #[arg(long, value_name = "NAME")]
    policy: Option<String>,
}

/// A session builder on the EPs given as `--ep` specs.
fn builder(
    env: Arc<Environment>,
    eps: &[String],
    strict: bool,
    threads: Option<usize>,
    isolate: bool,
    policy: Option<&str>,
) -> Result<SessionBuilder> {
    if isolate && (policy.is_some() || eps == ["auto"]) {
        return Err(Error::InvalidInput(
            "--isolate applies to EPs named with --ep; a selection policy chooses its own".into(),
        ));
    }
    // `--ep auto`: the EPs the max-performance policy picks.
    let policy = match (policy, eps) {
        (Some(p), _) => Some(p),
        (None, [only]) if only == "auto" => Some("max-performance"),
        _ => None,
    };
    let eps: &[String] = if policy.is_some() && eps.len() == 1 && eps[0] == "auto" {
        &[]
    } else {
        eps
    };
    let eps = eps
        .iter()
        .map(|s| parse_ep(s).map(|ep| if isolate { ep.isolated() } else { ep }))
        .collect::<Result<Vec<_>>>()?;
    let mut builder = Session::builder()?
        .with_environment(env)
        .with_execution_providers(eps)?
        .with_strict_placement(strict);
    if let Some(p) = policy {
        builder = builder.with_selection_policy(epx::SelectionPolicy::from_name(p)?);
    }
    if let Some(n) = threads {
        builder = builder.with_intra_op_threads(n);
    }
    Ok(builder)
}

pub fn partition(env: Arc<Environment>, args: PartitionArgs) -> Result<()> {
    let session = builder(
        env,
        &args.eps,
        args.strict,
        None,
        false,
        args.policy.as_deref(),
    )?
    .commit_from_file(&args.model)?;
    let report = session.placement();
    print!("{}", report.table());
    if let Some(path) = &args.dot {
        std::fs::write(path, report.to_dot(&session.edges())).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// `NAME[:DEVICE][:KEY=VALUE,...]`: a part after the name without `=` names a device the EP
/// lists (`cuda:1`, `openvino:GPU.0`); options follow it, or the name, after a `:`.
pub(crate) fn parse_ep(spec: &str) -> Result<ExecutionProvider> {
    let (name, rest) = spec.split_once(':').unwrap_or((spec, ""));
    let (device, opts) = match rest.split_once(':') {
        Some((d, o)) if !d.contains('=') => (Some(d), o),
        None if !rest.is_empty() && !rest.contains('=') => (Some(rest), ""),
        _ => (None, rest),
    };
    let mut ep = ExecutionProvider::new(name).error_on_failure();
    if let Some(d) = device {
        ep = ep.on_device(d);
    }
    // `KEY=VALUE,KEY=VALUE`; a part without `=` continues the previous value, so list values
    // such as `ops=Conv,Relu` need no quoting.
    let mut options: Vec<(&str, String)> = Vec::new();
    for part in opts.split(',').filter(|s| !s.is_empty()) {
        match (part.split_once('='), options.last_mut()) {
            (Some((k, v)), _) => options.push((k, v.to_string())),
            (None, Some((_, v))) => {
                v.push(',');
                v.push_str(part);
            }
            (None, None) => {
                return Err(Error::InvalidInput(format!(
                    "--ep {spec}: option `{part}` is not KEY=VALUE"
                )));
            }
        }
    }
    for (k, v) in options {
        ep = ep.with_option(k, v);
    }
    Ok(ep)
}

pub fn run(env: Arc<Environment>, args: RunArgs) -> Result<()> {
    let session = builder(
        env,
        &args.eps,
        false,
        args.threads,
        args.isolate,
        args.policy.as_deref(),
    )?
    .with_profiling(args.profile || args.profile_json.is_some())
    .commit_from_file(&args.model)?;
    let report = session.placement();
    let placement = report.node_counts();
    let summary: Vec<String> = placement
        .iter()
        .map(|(n, c)| format!("{n}: {c} node{}", if *c == 1 { "" } else { "s" }))
        .collect();
    println!(
        "model: {} ({} nodes, {} kernels; {})",
        args.model.display(),
        session.model().graph.nodes.len(),
        session.kernel_count(),
        summary.join(", ")
    );

    let inputs = make_inputs(&session, &args.inputs)?;
    for (name, v) in &inputs {
        println!("input  {}: {}", printable(name), printable(&describe(v)));
    }
    let feed = || -> Result<Vec<(&str, Value)>> {
        inputs
            .iter()
            .map(|(n, v)| Ok((n.as_str(), v.try_clone()?)))
            .collect()
    };
    let outputs = session.run(feed()?)?;
    for (name, v) in outputs.values() {
        println!("output {}: {}", printable(name), printable(&describe(v)));
    }
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })?;
        let names: Vec<&str> = outputs.values().map(|(n, _)| n).collect();
        let files = valuefile::unique_file_names(&names);
        for ((name, v), file) in outputs.values().zip(&files) {
            if *file != valuefile::safe_file_name(name) {
                println!(
                    "output {} is written as {file}: its file name would be another output's",
                    printable(name)
                );
            }
            let written = valuefile::write_value(&dir.join(file), v)?;
            if written.is_empty() {
                println!(
                    "output {} is an empty optional: nothing written",
                    printable(name)
                );
            }
            for path in written {
                println!("wrote {}", path.display());
            }
        }
    }
    if let Some(n) = args.repeat {
        if n == 0 {
            return Err(Error::InvalidInput("--repeat must be at least 1".into()));
        }
        // The profile, if any, is of the timed runs.
        if args.profile || args.profile_json.is_some() {
            session.restart_profile()?;
        }
        // Grown as the runs go: `--repeat` may be any number.
        let mut times: Vec<Duration> = Vec::new();
        for _ in 0..n {
            let feed = feed()?;
            let start = Instant::now();
            session.run(feed)?;
            times.push(start.elapsed());
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "latency over {n} runs: min {:.3} ms, median {:.3} ms, max {:.3} ms",
            ms(times[0]),
            ms(times[n / 2]),
            ms(times[n - 1])
        );
    }
    if args.profile || args.profile_json.is_some() {
        let profile = session.profile()?;
        if let Some(path) = &args.profile_json {
            let json = serde_json::to_string_pretty(&profile)
                .map_err(|e| Error::Run(format!("profile JSON: {e}")))?;
            std::fs::write(path, json).map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
            println!("wrote {}", path.display());
        }
        if args.profile {
            print!("\n{}", profile.table(PROFILE_TOP_NODES));
        }
    }
    Ok(())
}

pub(crate) fn make_inputs(session: &Session, given: &[String]) -> Result<Vec<(String, Value)>> {
    let specs = session.inputs();
    let mut out = Vec::new();
    for g in given {
        let (name, file) = g
            .split_once('=')
            .ok_or_else(|| Error::InvalidInput(format!("--input `{g}` is not NAME=FILE.npy")))?;
        let Some(spec) = specs.iter().find(|s| s.name == name) else {
            let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
            return Err(Error::InvalidInput(format!(
                "the model has no input `{name}`; its inputs: {}",
                names.join(", ")
            )));
        };
        let v = valuefile::read_value(Path::new(file), &spec.ty)
            .map_err(|e| Error::InvalidInput(format!("--input {name}={file}: {e}")))?;
        out.push((name.to_string(), v));
    }
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    for spec in &specs {
        if !out.iter().any(|(n, _)| n == &spec.name) {
            if spec.ty.is_non_tensor() {
                return Err(Error::InvalidInput(format!(
                    "input `{}` is a {}; random data is only made for tensors, give it with \
                     --input (a folder of .npy items for a sequence, a .json object for a map)",
                    spec.name, spec.ty
                )));
            }
            out.push((
                spec.name.clone(),
                Value::Host(random_input(spec, &mut rng)?),
            ));
        }
    }
    Ok(out)
}

/// One line about a value: type, shape and a summary of a tensor; the items of others.
fn describe(v: &Value) -> String {
    match v {
        Value::Host(t) => format!("{} {:?} {}", t.elem_type(), t.shape(), summarize(t)),
        Value::Device(t) => format!("{} {:?} (on its device)", t.elem_type(), t.shape()),
        Value::Sequence(s) => {
            let items: Vec<String> = s.items().iter().take(3).map(describe).collect();
            format!(
                "{} of {} item{}{}{}",
                v.type_name(),
                s.len(),
                if s.len() == 1 { "" } else { "s" },
                if items.is_empty() {
                    String::new()
                } else {
                    format!(": [{}", items.join("; "))
                },
                match s.len() {
                    0 => "",
                    1..=3 => "]",
                    _ => "; …]",
                }
            )
        }
        Value::Map(m) => {
            let json = valuefile::map_json(m).unwrap_or_default();
            let short: String = json.chars().take(120).collect();
            format!(
                "{} of {} entr{} {short}{}",
                v.type_name(),
                m.len(),
                if m.len() == 1 { "y" } else { "ies" },
                if json.chars().count() > 120 {
                    "…"
                } else {
                    ""
                }
            )
        }
        Value::Optional(Some(inner)) => format!("optional: {}", describe(inner)),
        Value::Optional(None) => "optional: empty".into(),
    }
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Random data for an input: floats in [0, 1), integers in [0, 10), bools; dynamic extents 1.
fn random_input(spec: &ValueSpec, rng: &mut XorShift) -> Result<Tensor> {
    let ty = spec.elem_type.ok_or_else(|| {
        Error::InvalidInput(format!(
            "input `{}` has no declared element type; give it with --input",
            spec.name
        ))
    })?;
    let shape: Vec<usize> = spec
        .shape
        .as_ref()
        .map(|s| s.iter().map(|d| d.unwrap_or(1) as usize).collect())
        .unwrap_or_default();
    let mut t = Tensor::zeros(ty, &shape)?;
    macro_rules! fill {
        ($t:ty, $f:expr) => {{
            if let Some(s) = t.as_mut_slice::<$t>() {
                for x in s.iter_mut() {
                    *x = $f(rng);
                }
            }
        }};
    }
    let small = |r: &mut XorShift| r.next() % 10;
    match ty {
        ElementType::Float => fill!(f32, |r: &mut XorShift| r.unit() as f32),
        ElementType::Double => fill!(f64, |r: &mut XorShift| r.unit()),
        ElementType::Float16 => fill!(half::f16, |r: &mut XorShift| half::f16::from_f64(r.unit())),
        ElementType::Bfloat16 => fill!(half::bf16, |r: &mut XorShift| half::bf16::from_f64(
            r.unit()
        )),
        ElementType::Int8 => fill!(i8, |r: &mut XorShift| small(r) as i8),
        ElementType::Int16 => fill!(i16, |r: &mut XorShift| small(r) as i16),
        ElementType::Int32 => fill!(i32, |r: &mut XorShift| small(r) as i32),
        ElementType::Int64 => fill!(i64, |r: &mut XorShift| small(r) as i64),
        ElementType::Uint8 => fill!(u8, |r: &mut XorShift| small(r) as u8),
        ElementType::Uint16 => fill!(u16, |r: &mut XorShift| small(r) as u16),
        ElementType::Uint32 => fill!(u32, |r: &mut XorShift| small(r) as u32),
        ElementType::Uint64 => fill!(u64, small),
        ElementType::Bool => fill!(bool, |r: &mut XorShift| r.next() & 1 == 1),
        other => {
            return Err(Error::InvalidInput(format!(
                "input `{}` is {other}; random data is not made for that type, give it with --input",
                spec.name
            )));
        }
    }
    Ok(t)
}

/// A one-line summary: min/max/mean for numbers, the first values otherwise.
fn summarize(t: &Tensor) -> String {
    fn stats<T: Copy + Into<f64>>(s: &[T]) -> String {
        if s.is_empty() {
            return "(empty)".into();
        }
        let (mut lo, mut hi, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0.0);
        for &x in s {
            let x: f64 = x.into();
            lo = lo.min(x);
            hi = hi.max(x);
            sum += x;
        }
        let head: Vec<String> = s
            .iter()
            .take(6)
            .map(|&x| format!("{}", Into::<f64>::into(x)))
            .collect();
        format!(
            "min {lo:.6} max {hi:.6} mean {:.6} [{}{}]",
            sum / s.len() as f64,
            head.join(", "),
            if s.len() > 6 { ", …" } else { "" }
        )
    }
    match t.elem_type() {
        ElementType::Float => t.as_slice::<f32>().map_or_else(String::new, stats),
        ElementType::Double => t.as_slice::<f64>().map_or_else(String::new, stats),
        ElementType::Int32 => t.as_slice::<i32>().map_or_else(String::new, stats),
        ElementType::Int16 => t.as_slice::<i16>().map_or_else(String::new, stats),
        ElementType::Int8 => t.as_slice::<i8>().map_or_else(String::new, stats),
        ElementType::Uint8 => t.as_slice::<u8>().map_or_else(String::new, stats),
        ElementType::Uint16 => t.as_slice::<u16>().map_or_else(String::new, stats),
        ElementType::Uint32 => t.as_slice::<u32>().map_or_else(String::new, stats),
        ElementType::Int64 => t.as_slice::<i64>().map_or_else(String::new, |s| {
            let v: Vec<f64> = s.iter().map(|&x| x as f64).collect();
            stats(&v)
        }),
        ElementType::Uint64 => t.as_slice::<u64>().map_or_else(String::new, |s| {
            let v: Vec<f64> = s.iter().map(|&x| x as f64).collect();
            stats(&v)
        }),
        ElementType::Bool => t.as_slice::<bool>().map_or_else(String::new, |s| {
            let v: Vec<f64> = s.iter().map(|&x| f64::from(u8::from(x))).collect();
            stats(&v)
        }),
        ElementType::Float16 => t.as_slice::<half::f16>().map_or_else(String::new, |s| {
            let v: Vec<f64> = s.iter().map(|x| x.to_f64()).collect();
            stats(&v)
        }),
        ElementType::Bfloat16 => t.as_slice::<half::bf16>().map_or_else(String::new, |s| {
            let v: Vec<f64> = s.iter().map(|x| x.to_f64()).collect();
            stats(&v)
        }),
        ElementType::String => {
            let items: Vec<String> = t
                .strings()
                .unwrap_or_default()
                .iter()
                .take(6)
                .map(|b| format!("{:?}", String::from_utf8_lossy(b)))
                .collect();
            format!(
                "[{}{}]",
                items.join(", "),
                if t.len() > 6 { ", …" } else { "" }
            )
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ep_specs_parse_options() {
        let ep = parse_ep("cuda:device_id=1,gpu_mem_limit=2").unwrap();
        assert_eq!(ep.name(), "cuda");
        assert_eq!(
            ep.options(),
            &[
                ("device_id".into(), "1".into()),
                ("gpu_mem_limit".into(), "2".into())
            ]
        );
        assert_eq!(ep.device(), None);
        // A part without `=` names a device; options may follow it.
        let ep = parse_ep("cuda:1").unwrap();
        assert_eq!((ep.name(), ep.device()), ("cuda", Some("1")));
        assert!(ep.options().is_empty());
        let ep = parse_ep("openvino:GPU.0:precision=f16").unwrap();
        assert_eq!((ep.name(), ep.device()), ("openvino", Some("GPU.0")));
        assert_eq!(ep.options(), &[("precision".into(), "f16".into())]);
        assert!(parse_ep("cuda:1:device_id").is_err());
        // List values continue over commas.
        let ep = parse_ep("ort_cpu:ops=Conv,Relu,intra_op_num_threads=2").unwrap();
        assert_eq!(
            ep.options(),
            &[
                ("ops".into(), "Conv,Relu".into()),
                ("intra_op_num_threads".into(), "2".into())
            ]
        );
    }
}
