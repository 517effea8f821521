//! `Handle::current()` names the runtime of the calling fiber, also while
//! that fiber is torn down on another runtime's worker (its runtime was
//! dropped inside the other's fiber): it named the worker's runtime, while
//! `fiber::spawn` from the same code went to the fiber's own.

use crate::common::*;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// In runtime B's fiber being torn down inside a fiber of runtime A (B
/// dropped there), `Handle::current()` names A, while `fiber::spawn`
/// spawns into B.
#[test]
fn handle_current_in_a_fiber_torn_down_on_another_runtimes_worker() {
    within(60, || {
        let a = fiber::Runtime::builder().workers(1).build().unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s2 = seen.clone();
        a.block_on(move || {
            let b = fiber::Runtime::builder()
                .workers(1)
                .shutdown_timeout(ms(0))
                .build()
                .unwrap();
            struct Probe(Arc<std::sync::Mutex<Vec<String>>>);
            impl Drop for Probe {
                fn drop(&mut self) {
                    // Which runtime does Handle::current name? Compare the
                    // stats' worker count (A has 1 worker, busy; B has stopped).
                    let handle = fiber::Handle::try_current();
                    let in_fiber = fiber::core::in_fiber();
                    let mine = fiber::core::current_scheduler().map(|s| Arc::as_ptr(&s) as *const () as usize);
                    let named = handle.map(|h| Arc::as_ptr(&h.scheduler()) as *const () as usize);
                    self.0
                        .lock()
                        .unwrap()
                        .push(format!("in_fiber={in_fiber} mine={mine:?} handle={named:?}"));
                }
            }
            let s3 = s2.clone();
            let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let st = started.clone();
            b.handle().spawn(move || {
                let _p = Probe(s3);
                st.store(true, Ordering::SeqCst);
                loop {
                    let _ = fiber::sleep(Duration::from_secs(100));
                }
            });
            while !started.load(Ordering::SeqCst) {
                let _ = fiber::sleep(ms(1));
            }
            drop(b);
        });
        let seen = seen.lock().unwrap().clone();
        eprintln!("{seen:?}");
        assert_eq!(seen.len(), 1);
        let s = &seen[0];
        let mine = s.split("mine=").nth(1).unwrap().split(' ').next().unwrap();
        let handle = s.split("handle=").nth(1).unwrap();
        assert_eq!(
            mine, handle,
            "Handle::current() in a fiber of B names another runtime: {s}"
        );
    });
}
