//! Cancelling a run in progress and a session creation: a Loop of a billion iterations on the
//! CPU EP stops within a bounded time of its terminate flag being set, from another thread;
//! the run fails with `Error::Cancelled`, the session stays usable, and a creation watching a
//! set flag stops before it compiles anything.

use std::time::{Duration, Instant};

use epx::{Error, RunOptions, Session, Tensor};
use epx_tests::models::counting_loop;

fn iterations(m: i64) -> Tensor {
    Tensor::from_bytes(epx::ElementType::Int64, &[], &m.to_le_bytes()).expect("m")
}

#[test]
fn a_long_loop_stops_soon_after_its_run_is_terminated() {
    let session = Session::builder()
        .and_then(|b| b.commit_from_memory(&counting_loop()))
        .expect("session");
    let options = RunOptions::new();
    let started = Instant::now();
    let outcome = std::thread::scope(|s| {
        let run = s
            .spawn(|| session.run_with_options([("m", iterations(1_000_000_000))], Some(&options)));
        std::thread::sleep(Duration::from_millis(200));
        options.set_terminate(true);
        let set_at = Instant::now();
        let outcome = run.join().expect("the run thread");
        (outcome, set_at.elapsed())
    });
    let (result, after_flag) = outcome;
    match result {
        Err(Error::Cancelled(message)) => assert!(message.contains("terminated"), "{message}"),
        other => panic!("expected a cancelled run, got {other:?}"),
    }
    // A billion iterations take minutes; the run ended within a second of the flag.
    assert!(
        after_flag < Duration::from_secs(1),
        "stopped {after_flag:?} after the flag"
    );
    eprintln!(
        "cancelled after {:?}, {after_flag:?} after the flag",
        started.elapsed()
    );

    // While the flag is set, runs with these options fail at once; cleared, they run.
    let at_once = Instant::now();
    assert!(matches!(
        session.run_with_options([("m", iterations(3))], Some(&options)),
        Err(Error::Cancelled(_))
    ));
    assert!(at_once.elapsed() < Duration::from_millis(500));
    options.set_terminate(false);
    let out = session
        .run_with_options([("m", iterations(3))], Some(&options))
        .expect("a run after the flag was cleared");
    let scan = out
        .into_iter()
        .next()
        .expect("scan")
        .1
        .into_host()
        .expect("host");
    assert_eq!(scan.shape(), [3]);
    // Runs without options never see the flag.
    options.set_terminate(true);
    session
        .run([("m", iterations(3))])
        .expect("a run without options");
}

#[test]
fn a_session_creation_watching_a_set_flag_is_cancelled() {
    let flag = RunOptions::new();
    flag.set_terminate(true);
    let made = Session::builder()
        .map(|b| b.with_cancellation(&flag))
        .and_then(|b| b.commit_from_memory(&counting_loop()));
    match made {
        Err(Error::Cancelled(message)) => assert!(message.contains("creation"), "{message}"),
        Err(other) => panic!("expected a cancelled creation, got {other}"),
        Ok(_) => panic!("the creation was not cancelled"),
    }
    flag.set_terminate(false);
    Session::builder()
        .map(|b| b.with_cancellation(&flag))
        .and_then(|b| b.commit_from_memory(&counting_loop()))
        .expect("a creation with the flag clear");
}
