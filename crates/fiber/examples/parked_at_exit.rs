//! Fibers still alive when `fiber::run` returns: some parked in a scope,
//! one ignoring cancellation in a loop. With `panic = "unwind"` shutdown
//! unwinds them (children before their scope owner); with
//! `panic = "abort"` it cannot unwind, so it leaks their stacks with a
//! notice instead of aborting. `cargo xtask ci` runs this both ways and
//! requires a clean exit.

use fiber::chan;

fn main() {
    let (keep_tx, keep_rx) = chan::bounded::<u8>(0);
    let answer = fiber::run(move || {
        for _ in 0..4 {
            let rx = keep_rx.clone();
            fiber::spawn(move || {
                let local = vec![1u8, 2, 3];
                fiber::scope(|s| {
                    let (local, rx) = (&local, rx.clone());
                    s.spawn(move || {
                        // Ignores cancellation: only teardown ends it.
                        loop {
                            if rx.recv().is_ok() {
                                break;
                            }
                        }
                        local.len()
                    });
                });
            });
        }
        for _ in 0..8 {
            let _ = fiber::yield_now();
        }
        42
    });
    drop(keep_tx);
    assert_eq!(answer, 42);
    println!(
        "parked_at_exit: ok (panic strategy: {})",
        if cfg!(panic = "abort") { "abort" } else { "unwind" }
    );
}
