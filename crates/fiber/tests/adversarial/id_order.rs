//! Scoped children spawned from `fiber::blocking` threads (plain threads
//! that once took a block of fiber ids) must still get ids above their
//! owners: teardown unwinds in descending id order, children before the
//! owners whose stacks they borrow. With ids from the plain thread's old
//! block, owners came first, and teardown gave up on a deep chain (its
//! destructors never ran, the runtime's memory was leaked).

use crate::common::*;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

thread_local! {
    static RANK: Cell<usize> = const { Cell::new(usize::MAX) };
}

struct Guard(Arc<AtomicUsize>);
impl Drop for Guard {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn stubborn() {
    loop {
        let _ = fiber::sleep(Duration::from_secs(3600));
    }
}

/// Run `f` in a blocking call on the pool thread of rank `want` (two
/// threads in the pool): occupy the other thread first.
fn on_rank<R: Send>(want: usize, f: impl FnOnce() -> R + Send) -> R {
    loop {
        let held = Arc::new(AtomicBool::new(false));
        let release = Arc::new(AtomicBool::new(false));
        let (h2, r2) = (held.clone(), release.clone());
        let occupier = fiber::spawn(move || {
            fiber::blocking(move || {
                if RANK.with(|r| r.get()) == want {
                    return false;
                }
                h2.store(true, Ordering::SeqCst);
                while !r2.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_micros(200));
                }
                true
            })
        });
        while !held.load(Ordering::SeqCst) && !occupier.is_finished() {
            let _ = fiber::sleep(Duration::from_millis(1));
        }
        if !held.load(Ordering::SeqCst) {
            let _ = occupier.join();
            continue;
        }
        let mut f = Some(f);
        let out = fiber::blocking(|| {
            assert_eq!(RANK.with(|r| r.get()), want, "routed to the other thread");
            (f.take().unwrap())()
        });
        release.store(true, Ordering::SeqCst);
        let _ = occupier.join();
        return out;
    }
}

static VIA_BLOCKING: AtomicBool = AtomicBool::new(true);

fn level(
    k: usize,
    depth: usize,
    drops: &Arc<AtomicUsize>,
    ids: &Arc<std::sync::Mutex<Vec<u64>>>,
    ready: &Arc<AtomicBool>,
) {
    let _g = Guard(drops.clone());
    ids.lock().unwrap().push(fiber::current().id().0);
    if k == depth {
        ready.store(true, Ordering::SeqCst);
        stubborn();
    }
    fiber::scope(|s| {
        let (d, i, r) = (drops.clone(), ids.clone(), ready.clone());
        // Alternate the spawning thread: rank 1 (newer block), rank 0 (older).
        if VIA_BLOCKING.load(Ordering::SeqCst) {
            on_rank((k + 1) % 2, || {
                s.spawn(move || level(k + 1, depth, &d, &i, &r));
            });
        } else {
            s.spawn(move || level(k + 1, depth, &d, &i, &r));
        }
        stubborn();
    });
}

#[test]
fn deep_chain_of_scopes_spawned_from_blocking_threads_is_torn_down() {
    chain(true);
}

fn chain(via_blocking: bool) {
    VIA_BLOCKING.store(via_blocking, Ordering::SeqCst);
    within(120, || {
        let depth = 40;
        let drops = Arc::new(AtomicUsize::new(0));
        let ids = Arc::new(std::sync::Mutex::new(Vec::new()));
        let ready = Arc::new(AtomicBool::new(false));
        let rt = fiber::Runtime::builder()
            .workers(2)
            .max_workers(2)
            .max_blocking_threads(2)
            .shutdown_timeout(ms(0))
            .build()
            .unwrap();
        let h = rt.handle();
        // Two blocking threads take their id blocks, in rank order.
        let h2 = h.clone();
        rt.block_on(move || {
            let order = Arc::new(std::sync::Mutex::new(0usize));
            let both = Arc::new(std::sync::Barrier::new(2));
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let (h3, order, both) = (h2.clone(), order.clone(), both.clone());
                    fiber::spawn(move || {
                        fiber::blocking(move || {
                            both.wait();
                            let mut o = order.lock().unwrap();
                            RANK.with(|r| r.set(*o));
                            *o += 1;
                            drop(h3.spawn(|| ()));
                        })
                    })
                })
                .collect();
            for x in hs {
                x.join().unwrap();
            }
        });
        // The top owner, from a fresh thread (a newer block).
        {
            let (d, i, r) = (drops.clone(), ids.clone(), ready.clone());
            let h4 = h.clone();
            std::thread::spawn(move || drop(h4.spawn(move || level(0, depth, &d, &i, &r))))
                .join()
                .unwrap();
        }
        let start = std::time::Instant::now();
        while !ready.load(Ordering::SeqCst) {
            assert!(start.elapsed() < Duration::from_secs(60), "chain never built");
            std::thread::sleep(ms(5));
        }
        let ids = ids.lock().unwrap().clone();
        let inversions = ids.windows(2).filter(|w| w[1] < w[0]).count();
        assert_eq!(inversions, 0, "children with ids below their owners: {ids:?}");
        drop(rt);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            depth + 1,
            "every level's stack unwound at teardown"
        );
    });
}
