//! `FIBER_BACKTRACE=1` / `park_backtraces(true)`: the dump carries a
//! backtrace of each park, naming the functions the fiber was in. In a
//! file of its own: the switch is process-wide.

use std::time::Duration;

#[inline(never)]
fn a_distinctively_named_parking_function(rx: fiber::chan::Receiver<()>) {
    let _ = rx.recv();
}

#[test]
fn park_backtraces_show_the_parked_fiber_stack() {
    let rt = fiber::runtime::Builder::new()
        .workers(2)
        .park_backtraces(true)
        .build()
        .unwrap();
    let text = rt.block_on(|| {
        let (tx, rx) = fiber::chan::bounded::<()>(0);
        let parked = fiber::spawn(move || a_distinctively_named_parking_function(rx));
        let text = loop {
            let dump = fiber::dump();
            if dump.fibers.iter().any(|f| f.backtrace.is_some()) {
                break dump.to_string();
            }
            let _ = fiber::sleep(Duration::from_millis(10));
        };
        drop(tx);
        parked.join().unwrap();
        text
    });
    assert!(text.contains("parked here:"), "{text}");
    assert!(text.contains("a_distinctively_named_parking_function"), "{text}");
}
