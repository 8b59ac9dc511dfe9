//! The compiled-kernel cache (ABI 1.6): an EP that serializes its kernels has them rebuilt from
//! `<cache dir>/kernels` by later sessions instead of compiled; anything wrong with an entry (damage,
//! an EP that refuses it, a folder that cannot be written, a kernel that cannot be serialized)
//! costs a compile and a line in the placement report, never a failed session or a wrong answer.
//!
//! The `adversarial` fixture's `cache` option says how its kernels serialize; its `journal`
//! option makes it write `compile` or `deserialize` for each kernel it makes, so each test sees
//! which one happened, not only what the host reports.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use epx::{Environment, ExecutionProvider, Session, Tensor};
use epx_tests::models::relu_neg_model;
use epx_tests::{TempDir, fixture_library, manifest};

struct Setup {
    _plugins: TempDir,
    cache: TempDir,
    env: Arc<Environment>,
}

fn setup(tag: &str) -> Setup {
    let plugins = TempDir::new(tag).expect("temp dir");
    let lib = fixture_library("adversarial");
    let file = lib.file_name().and_then(|f| f.to_str()).expect("file name");
    let text = manifest("adversarial", "1.8", &["adversarial"], file);
    plugins
        .add_plugin("adversarial", &lib, Some(&text))
        .expect("copy fixture");
    let cache = TempDir::new(&format!("{tag}-cache")).expect("temp dir");
    let env = Environment::builder()
        .with_plugin_dirs([plugins.path()])
        .with_cache_dir(cache.path())
        .commit()
        .expect("environment");
    Setup {
        _plugins: plugins,
        cache,
        env,
    }
}

fn ep(cache: &str, journal: &Path) -> ExecutionProvider {
    ExecutionProvider::new("adversarial")
        .with_option("cache", cache)
        .with_option("journal", journal.to_str().expect("utf-8 path"))
}

fn session(env: &Arc<Environment>, ep: ExecutionProvider) -> Session {
    Session::builder()
        .expect("builder")
        .with_environment(env.clone())
        .with_execution_providers([ep])
        .expect("eps")
        .commit_from_memory(&relu_neg_model())
        .expect("session")
}

/// Runs the session on fixed numbers and checks Relu and Neg.
fn check_outputs(s: &Session) {
    let x = [-1.5f32, 0.0, 2.0, -0.25, 3.5, -7.0];
    let input = Tensor::from_array(
        ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[2, 3]), x.to_vec()).expect("shape"),
    );
    let out = s.run([("x", input)]).expect("run");
    let r: Vec<f32> = out["r"].as_slice::<f32>().expect("f32").to_vec();
    let y: Vec<f32> = out["y"].as_slice::<f32>().expect("f32").to_vec();
    assert_eq!(r, x.map(|v| v.max(0.0)));
    assert_eq!(y, x.map(|v| -v.max(0.0)));
}

/// The journal's lines since the last call, emptying it.
fn journal(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let _ = std::fs::remove_file(path);
    text.lines().map(str::to_string).collect()
}

/// The stored kernels (not the recorded capability answers beside them).
fn entries(cache: &Path) -> Vec<PathBuf> {
    let dir = cache.join("kernels");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|f| {
        std::fs::read(f).is_ok_and(|b| String::from_utf8_lossy(&b).contains("\nkind kernel\n"))
    });
    files.sort();
    files
}

/// The one kernel-cache line of a session's placement report.
fn cache_note(s: &Session) -> (bool, String) {
    let uses = &s.placement().kernel_cache;
    assert_eq!(uses.len(), 1, "{uses:?}");
    assert_eq!(uses[0].kernel, "adversarial#0");
    (uses[0].loaded, uses[0].note.clone())
}

#[test]
fn a_second_session_rebuilds_the_kernel_instead_of_compiling_it() {
    let st = setup("kcache-warm");
    let log = st.cache.path().join("journal.txt");
    let cold = session(&st.env, ep("on", &log));
    assert_eq!(journal(&log), ["capability", "compile"]);
    let (loaded, note) = cache_note(&cold);
    assert!(!loaded && note.starts_with("compiled and stored"), "{note}");
    assert!(cold.placement().table().contains("kernel cache:"));
    check_outputs(&cold);
    let files = entries(st.cache.path());
    assert_eq!(files.len(), 1, "{files:?}");

    let warm = session(&st.env, ep("on", &log));
    assert_eq!(
        journal(&log),
        ["deserialize"],
        "no compile on the warm start"
    );
    let (loaded, note) = cache_note(&warm);
    assert!(loaded && note.starts_with("loaded"), "{note}");
    // Nor a capability query: the answer the cold session got is replayed.
    assert!(cold.placement().replayed_capabilities.is_empty());
    assert_eq!(warm.placement().replayed_capabilities, ["adversarial"]);
    check_outputs(&warm);
    assert_eq!(entries(st.cache.path()), files, "nothing new stored");

    // Another option is another key: a new entry, compiled.
    let other = session(&st.env, ep("on", &log).with_option("mode", "explains"));
    assert_eq!(journal(&log), ["capability", "compile"]);
    assert!(!cache_note(&other).0);
    assert_eq!(entries(st.cache.path()).len(), 2);
    // So is another device of the EP.
    let on_npu_0 = session(&st.env, ep("on", &log).on_device("0"));
    assert_eq!(journal(&log), ["capability", "compile"]);
    assert!(!cache_note(&on_npu_0).0);
    assert_eq!(entries(st.cache.path()).len(), 3);
}

#[test]
fn a_damaged_entry_is_ignored_compiled_again_and_rewritten() {
    let st = setup("kcache-damaged");
    let log = st.cache.path().join("journal.txt");
    drop(session(&st.env, ep("on", &log)));
    let file = entries(st.cache.path()).pop().expect("an entry");
    let good = std::fs::read(&file).expect("read");
    // The payload changed by one byte (its digest no longer matches), cut short, replaced by
    // something else: each is ignored, compiled, and a good entry written again.
    let mut flipped = good.clone();
    *flipped.last_mut().expect("bytes") ^= 0x20;
    for (what, bytes) in [
        ("one byte changed", flipped),
        ("cut short", good[..good.len() / 2].to_vec()),
        ("not an entry", b"\x7fELF garbage".to_vec()),
    ] {
        journal(&log);
        std::fs::write(&file, &bytes).expect("damage");
        let s = session(&st.env, ep("on", &log));
        assert_eq!(journal(&log), ["capability", "compile"], "{what}");
        let (loaded, note) = cache_note(&s);
        assert!(!loaded, "{what}");
        assert!(
            note.contains("damaged entry was ignored") && note.contains("compiled and stored"),
            "{what}: {note}"
        );
        check_outputs(&s);
        assert_eq!(std::fs::read(&file).expect("rewritten"), good, "{what}");
    }
    // And the rewritten entry is used.
    let s = session(&st.env, ep("on", &log));
    assert_eq!(journal(&log), ["deserialize"]);
    assert!(cache_note(&s).0);
}

#[test]
fn an_entry_the_ep_refuses_costs_a_compile() {
    let st = setup("kcache-reject");
    let log = st.cache.path().join("journal.txt");
    drop(session(&st.env, ep("reject", &log)));
    assert_eq!(journal(&log), ["capability", "compile"]);
    let s = session(&st.env, ep("reject", &log));
    assert_eq!(journal(&log), ["capability", "compile"]);
    let (loaded, note) = cache_note(&s);
    assert!(!loaded);
    assert!(
        note.contains("the EP refused its stored kernel")
            && note.contains("fixture: the stored kernel is stale"),
        "{note}"
    );
    // Offered once: the refused entry is deleted, not tried again by the pass that compiles.
    assert_eq!(note.matches("refused").count(), 1, "{note}");
    check_outputs(&s);
}

#[test]
fn kernels_that_cannot_be_stored_still_run() {
    let st = setup("kcache-nostore");
    let log = st.cache.path().join("journal.txt");
    // Serializing panics: caught in the plugin, reported, nothing stored.
    let s = session(&st.env, ep("panic", &log));
    let (_, note) = cache_note(&s);
    assert!(
        note.contains("not stored") && note.contains("panic"),
        "{note}"
    );
    check_outputs(&s);
    // Success with no bytes is nonsense, refused.
    let s = session(&st.env, ep("empty", &log));
    let (_, note) = cache_note(&s);
    assert!(note.contains("no bytes"), "{note}");
    assert!(entries(st.cache.path()).is_empty());
    // An EP that does not cache kernels is not in the report at all.
    let s = session(&st.env, ep("off", &log));
    assert!(s.placement().kernel_cache.is_empty());
    assert_eq!(journal(&log), ["capability", "compile"].repeat(3));
}

#[test]
fn a_cache_folder_that_cannot_be_written_costs_only_the_store() {
    let st = setup("kcache-unwritable");
    let log = st.cache.path().join("journal.txt");
    // `kernels` is a file: no entry can be written under it.
    std::fs::write(st.cache.path().join("kernels"), b"in the way").expect("write");
    let s = session(&st.env, ep("on", &log));
    let (loaded, note) = cache_note(&s);
    assert!(
        !loaded && note.starts_with("compiled; not stored:"),
        "{note}"
    );
    check_outputs(&s);
}

#[test]
fn the_cache_can_be_switched_off_per_session_and_per_environment() {
    let st = setup("kcache-off");
    let log = st.cache.path().join("journal.txt");
    let s = Session::builder()
        .expect("builder")
        .with_environment(st.env.clone())
        .with_kernel_cache(false)
        .with_execution_providers([ep("on", &log)])
        .expect("eps")
        .commit_from_memory(&relu_neg_model())
        .expect("session");
    assert!(s.placement().kernel_cache.is_empty());
    assert!(entries(st.cache.path()).is_empty());
    let env = Environment::builder()
        .with_plugin_dirs([st._plugins.path()])
        .with_cache_dir(st.cache.path())
        .with_kernel_cache(false)
        .commit()
        .expect("environment");
    assert!(env.kernel_cache().is_none());
    let s = session(&env, ep("on", &log));
    assert!(s.placement().kernel_cache.is_empty());
    assert!(entries(st.cache.path()).is_empty());
    assert_eq!(journal(&log), ["capability", "compile"].repeat(2));
}

#[test]
fn a_recorded_partition_that_names_nodes_not_offered_is_not_used() {
    let st = setup("kcache-partition");
    let log = st.cache.path().join("journal.txt");
    drop(session(&st.env, ep("on", &log)));
    journal(&log);
    let cache = st.env.kernel_cache().expect("a kernel cache");
    let recorded = cache
        .entries()
        .expect("entries")
        .into_iter()
        .find(|e| e.meta.as_ref().is_ok_and(|m| m.kind == "partition"))
        .expect("a recorded capability answer");
    let meta = recorded.meta.clone().expect("meta");
    // A node id past u32 (which `as u32` would wrap onto node 0), one past the graph, one twice.
    for text in [
        "group 4294967296\n",
        "group 99\n",
        "group 0 0\n",
        "groop 0\n",
    ] {
        cache
            .put(&recorded.key, &meta, text.as_bytes())
            .expect("put");
        let s = session(&st.env, ep("on", &log));
        // Asked again; the stored kernel is still good.
        assert_eq!(journal(&log), ["capability", "deserialize"], "{text:?}");
        assert!(s.placement().replayed_capabilities.is_empty(), "{text:?}");
        check_outputs(&s);
    }
}

#[test]
fn a_plugin_library_changed_on_disk_after_it_was_loaded_keeps_the_digest_of_what_runs() {
    use std::io::Write;
    let st = setup("kcache-changed");
    let log = st.cache.path().join("journal.txt");
    let (lib, _) = st.env.find_provider("adversarial").expect("loaded");
    let path = lib.path.clone().expect("a plugin library");
    let loaded = epx::plugin::manifest::sha256_file(&path).expect("hash");
    // The file on disk is no longer the code in memory (an upgrade under a running process).
    // What runs is the sealed copy admission checked, so its digest still names that code.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(b"\0"))
        .expect("append");
    assert_ne!(epx::plugin::manifest::sha256_file(&path).unwrap(), loaded);
    assert_eq!(lib.file_sha256(), Some(loaded.as_str()));
    let s = session(&st.env, ep("on", &log));
    check_outputs(&s);
    assert_eq!(journal(&log), ["capability", "compile"]);
    let (stored, note) = cache_note(&s);
    assert!(!stored && note.starts_with("compiled and stored"), "{note}");
    assert_eq!(entries(st.cache.path()).len(), 1);
}

/// A cache folder someone else could write is not used at all (nothing read, nothing stored):
/// its entries would be code's input. Nor is one whose `kernels` folder is a symbolic link; and
/// an entry open to other users is ignored and written again, private.
#[cfg(unix)]
#[test]
fn a_cache_folder_others_could_write_is_not_used() {
    use std::os::unix::fs::PermissionsExt;
    let st = setup("kcache-trust");
    let log = st.cache.path().join("journal.txt");
    let cache = st.cache.path();
    let chmod = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod")
    };
    drop(session(&st.env, ep("on", &log)));
    journal(&log);
    let file = entries(cache).pop().expect("an entry");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // An entry others may read and write: ignored, compiled, written back private.
    chmod(&file, 0o666);
    let s = session(&st.env, ep("on", &log));
    assert_eq!(journal(&log), ["capability", "compile"]);
    let (loaded, note) = cache_note(&s);
    assert!(!loaded && note.contains("open to other users"), "{note}");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // The folder writable by everyone: as if the cache were off.
    chmod(cache, 0o777);
    let s = session(&st.env, ep("on", &log));
    assert_eq!(journal(&log), ["capability", "compile"]);
    assert!(s.placement().kernel_cache.is_empty());
    let why = epx::cache::check_folder(cache).unwrap_err();
    assert!(
        why.contains("is not used") && why.contains("chmod o-w"),
        "{why}"
    );
    chmod(cache, 0o700);

    // `kernels` a link to a folder elsewhere: not followed, nothing written there.
    let elsewhere = TempDir::new("kcache-elsewhere").expect("temp dir");
    std::fs::remove_dir_all(cache.join("kernels")).expect("remove");
    std::os::unix::fs::symlink(elsewhere.path(), cache.join("kernels")).expect("symlink");
    let s = session(&st.env, ep("on", &log));
    assert_eq!(journal(&log), ["capability", "compile"]);
    assert!(s.placement().kernel_cache.is_empty());
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    let why = epx::cache::check_folder(cache).unwrap_err();
    assert!(why.contains("symbolic link"), "{why}");
}
