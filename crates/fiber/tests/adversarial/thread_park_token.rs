//! Adversarial: fiber code used from a plain thread must not eat the thread's
//! std park token (std::thread::Thread::unpark: "if the thread was not
//! parked, the next call to park will return immediately"). std's own
//! Mutex/Condvar never touch the token.
use fiber::sync::{Condvar, Mutex};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{ms, within};

fn park_returns_at_once() -> Duration {
    let t = Instant::now();
    std::thread::park_timeout(Duration::from_secs(3));
    t.elapsed()
}

#[test]
fn control_std_mutex_keeps_the_token() {
    within(30, || {
        let m = Arc::new(std::sync::Mutex::new(0));
        let g = m.lock().unwrap();
        let m2 = m.clone();
        let t = std::thread::spawn(move || {
            std::thread::current().unpark();
            *m2.lock().unwrap() += 1;
            park_returns_at_once()
        });
        std::thread::sleep(ms(100));
        drop(g);
        let took = t.join().unwrap();
        assert!(took < Duration::from_secs(1), "park took {took:?}");
    })
}

#[test]
fn plain_thread_unpark_token_survives_a_contended_fiber_mutex_lock() {
    within(30, || {
        let m = Arc::new(Mutex::new(0));
        let g = m.lock().unwrap();
        let m2 = m.clone();
        let t = std::thread::spawn(move || {
            std::thread::current().unpark();
            *m2.lock().unwrap() += 1; // waits (contended) on a plain thread
            park_returns_at_once()
        });
        std::thread::sleep(ms(100));
        drop(g);
        let took = t.join().unwrap();
        assert!(
            took < Duration::from_secs(1),
            "the unpark token was consumed: park took {took:?}"
        );
    })
}

#[test]
fn plain_thread_unpark_token_survives_a_condvar_wait_timeout() {
    within(30, || {
        let m = Mutex::new(());
        let cv = Condvar::new();
        std::thread::current().unpark();
        let g = m.lock().unwrap();
        let (_g, r) = cv.wait_timeout(g, ms(50)).unwrap();
        assert!(r.timed_out());
        let took = park_returns_at_once();
        assert!(
            took < Duration::from_secs(1),
            "the unpark token was consumed: park took {took:?}"
        );
    })
}

#[test]
fn plain_thread_unpark_token_survives_fiber_sleep_and_chan_recv_timeout() {
    within(30, || {
        std::thread::current().unpark();
        let (_tx, rx) = fiber::chan::bounded::<()>(1);
        let _ = rx.recv_timeout(ms(50));
        let took = park_returns_at_once();
        assert!(
            took < Duration::from_secs(1),
            "the unpark token was consumed by recv_timeout: park took {took:?}"
        );
    })
}

#[test]
fn plain_thread_unpark_token_survives_block_on() {
    within(30, || {
        let rt = crate::common::rt();
        std::thread::current().unpark();
        rt.block_on(|| fiber::sleep(ms(50)).unwrap());
        let took = park_returns_at_once();
        assert!(
            took < Duration::from_secs(1),
            "the unpark token was consumed by block_on: park took {took:?}"
        );
    })
}

/// fiber::park on a plain thread is std::thread::park (documented); a
/// token set with std's unpark before a fiber::sync wait must still be there.
#[test]
fn plain_thread_fiber_park_after_a_sync_wait_sees_the_token() {
    within(30, || {
        let sem = Arc::new(fiber::sync::Semaphore::new(0));
        let s2 = sem.clone();
        let t = std::thread::spawn(move || {
            std::thread::current().unpark();
            let p = s2.acquire().unwrap();
            p.forget();
            let t = Instant::now();
            fiber::park_timeout(Duration::from_secs(3));
            t.elapsed()
        });
        std::thread::sleep(ms(100));
        sem.add_permits(1);
        let took = t.join().unwrap();
        assert!(
            took < Duration::from_secs(1),
            "the unpark token was consumed: park took {took:?}"
        );
    })
}
