//! Adversarial: timer entries of waits that ended early (a
//! `recv_timeout(1h)` answered at once) are dead: they wake nobody. They
//! must not pile up after a burst (spec/sched.md section 7: about as many
//! dead entries as live ones), and must not hide a deadlock (Go's "all
//! goroutines are asleep" ignores stopped timers).

use std::time::{Duration, Instant};

use crate::common::{ms, rt2, within};

#[test]
fn dead_timers_of_a_burst_are_swept_without_new_timer_traffic() {
    let (peak, after) = within(120, || {
        rt2().block_on(|| {
            const N: usize = 20_000;
            let mut txs = Vec::new();
            let mut hs = Vec::new();
            for _ in 0..N {
                let (tx, rx) = fiber::chan::bounded::<u8>(1);
                txs.push(tx);
                hs.push(fiber::spawn(move || rx.recv_timeout(Duration::from_secs(3600)).is_ok()));
            }
            let start = Instant::now();
            let mut peak = 0;
            while peak < N && start.elapsed() < Duration::from_secs(20) {
                fiber::sleep(ms(5)).unwrap();
                peak = fiber::stats().runtime.timers_pending;
            }
            for tx in &txs {
                tx.send(1).unwrap();
            }
            for h in hs {
                assert!(h.join().unwrap());
            }
            // No live timer is left but the polling sleep's own; the
            // monitor sweeps once a second.
            let start = Instant::now();
            let mut after = fiber::stats().runtime.timers_pending;
            while after > 4_096 && start.elapsed() < Duration::from_secs(10) {
                fiber::sleep(ms(50)).unwrap();
                after = fiber::stats().runtime.timers_pending;
            }
            (peak, after)
        })
    });
    assert!(peak >= 15_000, "the burst did not park ({peak} pending)");
    assert!(
        after <= 4_096,
        "{after} dead one-hour timer entries left with no live timer"
    );
}

#[test]
fn a_dead_timer_does_not_hide_a_deadlock() {
    let rt = rt2();
    let h = rt.handle();
    let stuck = std::thread::spawn(move || {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            h.block_on(|| {
                let (tx, rx) = fiber::chan::bounded::<u8>(1);
                let answer = fiber::spawn(move || {
                    let _ = fiber::sleep(ms(20));
                    let _ = tx.send(1);
                });
                // Answered after 20 ms: its one-hour timer entry is dead.
                assert!(rx.recv_timeout(Duration::from_secs(3600)).is_ok());
                answer.join().unwrap();
                // A real deadlock: nobody will ever send.
                let (_never_tx, never_rx) = fiber::chan::bounded::<u8>(0);
                let _ = never_rx.recv();
            })
        }));
    });
    let start = Instant::now();
    while rt.stats().deadlock_reports == 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(ms(20));
    }
    let reports = rt.stats().deadlock_reports;
    drop(rt);
    stuck.join().unwrap();
    assert!(
        reports >= 1,
        "no deadlock report: a dead one-hour timer counted as pending"
    );
}
