//! `epx-fuzz`: fuzzing epx on stable Rust, without instrumentation. Inputs are mutated from
//! the repository's models, `.npy` files and manifests (see `mutate`), one deterministic input
//! per (seed, case number), and run through a target (see `targets`) in a child process: a
//! child killed by a signal, one that hangs, and a Rust panic are each a finding, saved with the
//! input that caused it, and the run goes on in a new child.
//!
//!     epx-fuzz run [--target onnx|npy|manifest|capi|serve-rest|serve-grpc|elf]... [--seconds N] [--seed S] [--out DIR]
//!     epx-fuzz replay --target T FILE...    (each file in this process; regressions)
//!     epx-fuzz make --target T --seed S --case N FILE    (input N of seed S, to look at)
//!
//! Exit status 1 when an input crashed the process or panicked, else 0 (hangs are listed).

mod capi;
mod mutate;
mod targets;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use targets::Target;

#[derive(Parser)]
#[command(name = "epx-fuzz", about = "Fuzz epx's loaders, sessions and C API")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Fuzz each target for a while, in child processes.
    Run {
        /// Targets (repeatable; all when none is given).
        #[arg(long = "target", value_enum)]
        targets: Vec<Target>,
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// The run's seed: the same seed makes the same inputs.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Where findings (and the input in flight) are written.
        #[arg(long, default_value = "target/fuzz")]
        out: PathBuf,
        /// Seconds one input may take before it counts as a hang.
        #[arg(long, default_value_t = 20)]
        timeout: u64,
    },
    /// Run saved inputs through a target in this process.
    Replay {
        #[arg(long, value_enum)]
        target: Target,
        files: Vec<PathBuf>,
    },
    /// Write input number CASE of a run with SEED to FILE (to look at a finding again).
    Make {
        #[arg(long, value_enum)]
        target: Target,
        #[arg(long)]
        seed: u64,
        #[arg(long)]
        case: u64,
        file: PathBuf,
    },
    /// One child: inputs `start..` of a target until `until` (seconds since the epoch).
    #[command(hide = true)]
    Child {
        #[arg(long, value_enum)]
        target: Target,
        #[arg(long)]
        seed: u64,
        #[arg(long)]
        start: u64,
        #[arg(long)]
        until: u64,
        #[arg(long)]
        out: PathBuf,
    },
}

/// The repository root (this crate is `tests/fuzz`).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Cmd::Run {
            targets,
            seconds,
            seed,
            out,
            timeout,
        } => {
            let targets = if targets.is_empty() {
                targets::ALL.to_vec()
            } else {
                targets
            };
            if let Err(e) = std::fs::create_dir_all(&out) {
                eprintln!("error: cannot make {}: {e}", out.display());
                return ExitCode::FAILURE;
            }
            let mut found = 0;
            for t in targets {
                found += fuzz(t, seconds, seed, &out, Duration::from_secs(timeout));
            }
            if found == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Cmd::Replay { target, files } => {
            epx::set_max_tensor_bytes(targets::TENSOR_LIMIT);
            for f in &files {
                let input = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                let through = targets::run(target, &input);
                println!(
                    "ok {} ({})",
                    f.display(),
                    if through { "ran" } else { "refused" }
                );
            }
            ExitCode::SUCCESS
        }
        Cmd::Make {
            target,
            seed,
            case,
            file,
        } => {
            let corpus = targets::seeds(target, &repo());
            match std::fs::write(&file, make_input(target, &corpus, seed, case)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {}: {e}", file.display());
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Child {
            target,
            seed,
            start,
            until,
            out,
        } => child(target, seed, start, until, &out),
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The file holding the input a child is running.
fn in_flight(out: &Path, target: Target) -> PathBuf {
    out.join(format!("in-flight-{}", target.name()))
}

/// Input number `case` of a run with `seed`.
fn make_input(target: Target, corpus: &[Vec<u8>], seed: u64, case: u64) -> Vec<u8> {
    let mut rng = mutate::Rng::new(seed, case);
    if target == Target::Capi {
        return (0..16 + rng.below(64)).map(|_| rng.next() as u8).collect();
    }
    let base = &corpus[rng.below(corpus.len())];
    let other = &corpus[rng.below(corpus.len())];
    if target == Target::Elf && rng.chance(60) {
        // A dozen bytes changed in the headers' page: the program and section headers, the
        // dynamic symbols and strings of a small library.
        let mut v = base.clone();
        let head = v.len().min(4096);
        for _ in 0..12 {
            if head > 0 {
                v[rng.below(head)] = rng.next() as u8;
            }
        }
        return v;
    }
    if target == Target::Onnx && rng.chance(70) {
        mutate::model(&mut rng, base, other)
    } else {
        mutate::bytes(&mut rng, base, other)
    }
}

/// Where a finding's input is kept.
fn finding(out: &Path, kind: &str, target: Target, seed: u64, case: u64) -> PathBuf {
    out.join(format!("{kind}-{}-seed{seed}-case{case}", target.name()))
}

fn child(target: Target, seed: u64, start: u64, until: u64, out: &Path) -> ExitCode {
    epx::set_max_tensor_bytes(targets::TENSOR_LIMIT);
    // A panic is reported by the line below (with where it happened), not by the default
    // hook's text.
    static WHERE: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());
    std::panic::set_hook(Box::new(|info| {
        if let (Some(l), Ok(mut w)) = (info.location(), WHERE.lock()) {
            *w = format!("{}:{}", l.file(), l.line());
        }
    }));
    let corpus = targets::seeds(target, &repo());
    let current = in_flight(out, target);
    let stdout = std::io::stdout();
    let mut case = start;
    while now_secs() < until {
        let input = make_input(target, &corpus, seed, case);
        if std::fs::write(&current, &input).is_err() {
            return ExitCode::FAILURE;
        }
        let _ = writeln!(stdout.lock(), "start {case}");
        let outcome = std::panic::catch_unwind(|| targets::run(target, &input));
        let mut lock = stdout.lock();
        match outcome {
            Ok(through) => {
                let _ = writeln!(lock, "done {case} {}", u8::from(through));
            }
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                let at = WHERE.lock().map(|w| w.clone()).unwrap_or_default();
                // Saved here: the parent copies the in-flight file only for a dead child, and
                // this one goes on to the next input.
                let _ = std::fs::write(finding(out, "panic", target, seed, case), &input);
                let _ = writeln!(lock, "panic {case} {} at {at}", msg.replace('\n', " "));
            }
        }
        let _ = lock.flush();
        case += 1;
    }
    ExitCode::SUCCESS
}

/// Fuzzes one target for `seconds`; returns the number of findings.
fn fuzz(target: Target, seconds: u64, seed: u64, out: &Path, timeout: Duration) -> usize {
    let exe = std::env::current_exe().expect("own executable");
    let until = now_secs() + seconds;
    let started = Instant::now();
    let (mut cases, mut crashes, mut panics, mut hangs) = (0u64, 0usize, 0usize, 0usize);
    let mut through = 0u64;
    let mut next = 0u64;
    let save = |kind: &str, case: u64| -> PathBuf {
        let to = finding(out, kind, target, seed, case);
        let _ = std::fs::copy(in_flight(out, target), &to);
        to
    };
    while now_secs() < until {
        let mut child = match Command::new(&exe)
            // A library that hangs its probe child is refused after this, well inside the
            // driver's own timeout for an input.
            .env("EPX_PROBE_TIMEOUT_S", "5")
            .args(["child", "--target", target.name()])
            .args(["--seed", &seed.to_string(), "--start", &next.to_string()])
            .args(["--until", &until.to_string()])
            .arg("--out")
            .arg(out)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: cannot start a child: {e}");
                return crashes + 1;
            }
        };
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut running: Option<u64> = None;
        loop {
            match rx.recv_timeout(timeout) {
                Ok(Ok(line)) => {
                    let mut words = line.splitn(3, ' ');
                    let (kind, case) = (words.next(), words.next().and_then(|c| c.parse().ok()));
                    match (kind, case) {
                        (Some("start"), Some(c)) => running = Some(c),
                        (Some("done"), Some(c)) => {
                            running = None;
                            cases += 1;
                            through += u64::from(words.next() == Some("1"));
                            next = c + 1;
                        }
                        (Some("panic"), Some(c)) => {
                            running = None;
                            cases += 1;
                            panics += 1;
                            next = c + 1;
                            let to = finding(out, "panic", target, seed, c);
                            println!(
                                "{}: case {c} panicked: {} (input: {})",
                                target.name(),
                                words.next().unwrap_or(""),
                                to.display()
                            );
                        }
                        _ => {}
                    }
                }
                ended => {
                    // The child died (its pipe closed) or went quiet for too long.
                    let hung = matches!(ended, Err(mpsc::RecvTimeoutError::Timeout));
                    if hung {
                        let _ = child.kill();
                    }
                    let status = child.wait().ok();
                    if let Some(c) = running {
                        cases += 1;
                        next = c + 1;
                        let (kind, how) = if hung {
                            hangs += 1;
                            ("hang", format!("ran longer than {} s", timeout.as_secs()))
                        } else {
                            crashes += 1;
                            let status = status.map_or("unknown status".into(), |s| s.to_string());
                            ("crash", format!("killed the process ({status})"))
                        };
                        let to = save(kind, c);
                        println!(
                            "{}: case {c} {how} (input: {})",
                            target.name(),
                            to.display()
                        );
                    }
                    break;
                }
            }
        }
    }
    let _ = std::fs::remove_file(in_flight(out, target));
    println!(
        "{}: {cases} inputs in {:.0} s (seed {seed}), {through} went all the way through: \
         {crashes} crashed the process, {panics} panicked, {hangs} hung",
        target.name(),
        started.elapsed().as_secs_f64()
    );
    // A hang is reported but not failed on: a valid model may loop for long (a Loop's trip
    // count is the model's to choose), and the timeout is a wall clock.
    crashes + panics
}
