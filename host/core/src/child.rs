//! The child processes epx starts to ask or try something it will not run itself (a Python
//! package asked for its library, a plugin library opened first in a child, `python3` asked
//! for its folders): each runs in a process group of its own, its output is kept up to a limit
//! (the rest is read and dropped, so a chatty child never blocks on a full pipe), and a
//! deadline ends the whole group. Reading stops at the deadline too: a grandchild that keeps
//! the pipes open (a daemon forked by a package's import) cannot hold epx past it, and on Linux
//! every process still holding them then is killed (it can only have them from the child).
//! After the child exits, whatever is left of its group is killed as well.

use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What a child may take.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// From the start until the child, its group and its pipes are done with.
    pub deadline: Duration,
    /// The bytes kept of each of stdout and stderr.
    pub output: usize,
}

/// How a child ended, with what it printed.
#[derive(Debug)]
pub struct Finished {
    /// `None` when the deadline ended it.
    pub status: Option<ExitStatus>,
    /// The first [`Limits::output`] bytes of each stream.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes past the limit were dropped.
    pub truncated: bool,
}

impl Finished {
    /// Stdout as text (lossy).
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// The last line of stderr that is not blank.
    pub fn last_stderr_line(&self) -> String {
        String::from_utf8_lossy(&self.stderr)
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim()
            .to_owned()
    }
}

/// Makes `cmd` start its child as the leader of a new process group, so that
/// [`kill_group`] ends the child and everything it started that stayed in its group.
pub fn own_group(cmd: &mut Command) -> &mut Command {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    cmd
}

/// Kills the process group led by `pid` (a child started with [`own_group`]); a group that is
/// gone already is no error.
pub fn kill_group(pid: u32) {
    #[cfg(unix)]
    if let Ok(pid) = libc::pid_t::try_from(pid)
        && pid > 0
    {
        // SAFETY: kill(2) with a negative pid signals the group; no memory is touched.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
    #[cfg(not(unix))]
    let _ = pid;
}

/// Runs `cmd` (stdin from nothing, stdout and stderr read here) within `limits`.
pub fn run(cmd: &mut Command, limits: Limits) -> std::io::Result<Finished> {
    own_group(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let started = Instant::now();
    let deadline = started + limits.deadline;
    let pid = child.id();
    let mut out = Streams::new(child.stdout.take(), child.stderr.take(), limits.output);
    let mut status = None;
    while Instant::now() < deadline {
        if status.is_none() {
            status = child.try_wait()?;
            if status.is_some() {
                // What the child left running in its group has no one to answer to.
                kill_group(pid);
            }
        }
        if out.all_closed() {
            if status.is_some() {
                break;
            }
            // Output done; wait for the exit alone.
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(20));
        let progressed = out.read_some(wait);
        if status.is_some() && !progressed {
            // Exited, and nothing more came within a short grace: whoever holds the pipes now
            // is not the child.
            break;
        }
    }
    if status.is_none() {
        kill_group(pid);
        let _ = child.kill();
        let _ = child.wait();
    }
    if !out.all_closed() {
        out.kill_holders();
    }
    let truncated = out.truncated();
    let (stdout, stderr) = out.into_bytes();
    Ok(Finished {
        status,
        stdout,
        stderr,
        truncated,
    })
}

/// The two pipes of a child, read without blocking.
struct Streams {
    pipes: [Pipe; 2],
}

/// One pipe: open until its end was read (`None` after).
struct Pipe {
    #[cfg(unix)]
    fd: Option<std::os::fd::OwnedFd>,
    #[cfg(not(unix))]
    reader: Option<Box<dyn std::io::Read + Send>>,
    kept: Vec<u8>,
    dropped: usize,
    limit: usize,
}

impl Streams {
    fn new(
        stdout: Option<std::process::ChildStdout>,
        stderr: Option<std::process::ChildStderr>,
        limit: usize,
    ) -> Streams {
        #[cfg(unix)]
        {
            use std::os::fd::OwnedFd;
            let pipe = |fd: Option<OwnedFd>| {
                if let Some(fd) = &fd {
                    set_nonblocking(fd);
                }
                Pipe {
                    fd,
                    kept: Vec::new(),
                    dropped: 0,
                    limit,
                }
            };
            Streams {
                pipes: [
                    pipe(stdout.map(OwnedFd::from)),
                    pipe(stderr.map(OwnedFd::from)),
                ],
            }
        }
        #[cfg(not(unix))]
        {
            let pipe = |r: Option<Box<dyn std::io::Read + Send>>| Pipe {
                reader: r,
                kept: Vec::new(),
                dropped: 0,
                limit,
            };
            Streams {
                pipes: [
                    pipe(stdout.map(|s| Box::new(s) as Box<dyn std::io::Read + Send>)),
                    pipe(stderr.map(|s| Box::new(s) as Box<dyn std::io::Read + Send>)),
                ],
            }
        }
    }

    fn all_closed(&self) -> bool {
        self.pipes.iter().all(|p| !p.open())
    }

    fn truncated(&self) -> bool {
        self.pipes.iter().any(|p| p.dropped > 0)
    }

    fn into_bytes(self) -> (Vec<u8>, Vec<u8>) {
        let [a, b] = self.pipes;
        (a.kept, b.kept)
    }

    /// Reads what is there within `wait`; whether anything came (or a pipe closed).
    #[cfg(unix)]
    fn read_some(&mut self, wait: Duration) -> bool {
        use std::os::fd::AsRawFd;
        let mut fds: Vec<libc::pollfd> = self
            .pipes
            .iter()
            .filter_map(|p| p.fd.as_ref())
            .map(|fd| libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        if fds.is_empty() {
            return false;
        }
        let ms = libc::c_int::try_from(wait.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: `fds` is a live array of `fds.len()` pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n <= 0 {
            return false;
        }
        let mut progressed = false;
        let mut buf = [0u8; 64 << 10];
        for p in &mut self.pipes {
            while let Some(fd) = &p.fd {
                // SAFETY: reads into a live buffer of its length from a descriptor we own.
                let got = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if got > 0 {
                    p.keep(&buf[..got as usize]);
                    progressed = true;
                    continue;
                }
                if got < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    if e.kind() == std::io::ErrorKind::WouldBlock {
                        break;
                    }
                }
                // The end, or an error that ends it.
                p.fd = None;
                progressed = true;
            }
        }
        progressed
    }

    /// Without non-blocking pipes: reads to the end (the deadline cannot stop it here).
    #[cfg(not(unix))]
    fn read_some(&mut self, _wait: Duration) -> bool {
        let mut buf = [0u8; 64 << 10];
        for p in &mut self.pipes {
            let Some(mut r) = p.reader.take() else {
                continue;
            };
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                p.keep(&buf[..n]);
            }
        }
        true
    }

    /// Kills every process that still holds one of the pipes' write ends (Linux: found through
    /// `/proc`): only the child's descendants can have them. Best effort; elsewhere nothing.
    fn kill_holders(&self) {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let inodes: Vec<String> = self
                .pipes
                .iter()
                .filter_map(|p| p.fd.as_ref())
                .filter_map(|fd| {
                    let meta = std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()));
                    meta.ok().map(|m| {
                        use std::os::unix::fs::MetadataExt;
                        format!("pipe:[{}]", m.ino())
                    })
                })
                .collect();
            if inodes.is_empty() {
                return;
            }
            let me = std::process::id();
            let Ok(procs) = std::fs::read_dir("/proc") else {
                return;
            };
            for entry in procs.flatten() {
                let Some(pid) = entry
                    .file_name()
                    .to_str()
                    .and_then(|s| s.parse::<u32>().ok())
                else {
                    continue;
                };
                if pid == me {
                    continue;
                }
                let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
                    continue;
                };
                let holds = fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|t| inodes.iter().any(|i| t.as_os_str() == i.as_str()))
                });
                if holds && let Ok(pid) = libc::pid_t::try_from(pid) {
                    tracing::debug!(pid, "killing a process left holding a child's output");
                    // SAFETY: kill(2) touches no memory.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
    }
}

impl Pipe {
    fn open(&self) -> bool {
        #[cfg(unix)]
        return self.fd.is_some();
        #[cfg(not(unix))]
        return self.reader.is_some();
    }

    fn keep(&mut self, bytes: &[u8]) {
        let room = self.limit.saturating_sub(self.kept.len());
        let take = room.min(bytes.len());
        self.kept.extend_from_slice(&bytes[..take]);
        self.dropped += bytes.len() - take;
    }
}

#[cfg(unix)]
fn set_nonblocking(fd: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own; no memory is touched.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn sh(script: &str, limits: Limits) -> (Finished, Duration) {
        let started = Instant::now();
        let f = run(Command::new("sh").args(["-c", script]), limits).expect("sh runs");
        (f, started.elapsed())
    }

    const LIMITS: Limits = Limits {
        deadline: Duration::from_secs(3),
        output: 1 << 10,
    };

    #[test]
    fn output_is_kept_up_to_the_limit_and_the_rest_drained() {
        // 8 MB on stdout: more than a pipe holds, so a reader that stopped would hang it.
        let (f, took) = sh("head -c 8000000 /dev/zero; echo done >&2", LIMITS);
        assert!(f.status.is_some_and(|s| s.success()), "{f:?}");
        assert_eq!(f.stdout.len(), 1 << 10);
        assert!(f.truncated);
        assert_eq!(f.last_stderr_line(), "done");
        assert!(took < Duration::from_secs(3), "took {took:?}");
    }

    #[test]
    fn the_deadline_ends_the_whole_group() {
        let limits = Limits {
            deadline: Duration::from_millis(500),
            ..LIMITS
        };
        let (f, took) = sh("sleep 30 & sleep 30; echo never", limits);
        assert!(f.status.is_none(), "{f:?}");
        assert!(f.stdout.is_empty());
        assert!(took < Duration::from_secs(2), "took {took:?}");
    }

    /// A grandchild that leaves the group (`setsid`) and keeps stdout open cannot hold the
    /// caller: reading ends soon after the child exits, and the grandchild is killed.
    #[test]
    fn a_daemon_holding_the_pipes_cannot_hold_the_caller() {
        let marker = std::env::temp_dir().join(format!("epx-child-daemon-{}", std::process::id()));
        let script = format!(
            "setsid sh -c 'echo $$ > {}; sleep 60' & echo started; sleep 0.2",
            marker.display()
        );
        let (f, took) = sh(&script, LIMITS);
        assert!(f.status.is_some_and(|s| s.success()), "{f:?}");
        assert_eq!(f.stdout_text().trim(), "started");
        assert!(took < Duration::from_secs(2), "took {took:?}");
        let pid: i32 = std::fs::read_to_string(&marker)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .expect("the daemon wrote its pid");
        let _ = std::fs::remove_file(&marker);
        // Killed (or a zombie about to be reaped by init): no longer sleeping.
        std::thread::sleep(Duration::from_millis(200));
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let alive = state
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().next())
            .is_some_and(|s| s != "Z" && s != "X");
        #[cfg(target_os = "linux")]
        assert!(!alive, "the daemon {pid} outlived the child: {state}");
        let _ = alive;
    }

    /// After the child exits, what it left in its own group is killed.
    #[test]
    fn what_the_child_leaves_in_its_group_is_killed() {
        let marker = std::env::temp_dir().join(format!("epx-child-left-{}", std::process::id()));
        let script = format!(
            "sh -c 'sleep 1; touch {}' >/dev/null 2>&1 & exit 0",
            marker.display()
        );
        let (f, _) = sh(&script, LIMITS);
        assert!(f.status.is_some_and(|s| s.success()));
        std::thread::sleep(Duration::from_millis(1500));
        assert!(!marker.exists(), "the process left behind ran on");
    }
}
