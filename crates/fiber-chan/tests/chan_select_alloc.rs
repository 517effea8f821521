//! A select that parks keeps its wait nodes on the selecting stack: after
//! the channels' queues have grown once, a parked select allocates nothing.
//! (Its own test binary: it installs a counting global allocator.)

use fiber_chan::{bounded, Select};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Counts allocations made by threads that opted in.
struct Counting;

std::thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the bookkeeping touches only
// const-initialized thread-locals (no allocation, no recursion).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.with(|a| a.set(a.get() + 1));
        }
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn a_parked_select_allocates_nothing() {
    const ROUNDS: u64 = 200;
    let (tx_a, rx_a) = bounded::<u64>(1);
    let (_tx_b, rx_b) = bounded::<u64>(1);
    let (tx_c, rx_c) = bounded::<u64>(0);
    let stop = Arc::new(AtomicBool::new(false));
    let peer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                // Send only once the select is parked (its receive node is
                // queued), so every round takes the parked path.
                if tx_a.waiting().0 == 0 {
                    std::thread::yield_now();
                    continue;
                }
                let tx = if i % 2 == 0 { &tx_a } else { &tx_c };
                if tx.send(i).is_err() {
                    return;
                }
                i += 1;
            }
        })
    };
    let mut allocs_after_warmup = 0;
    for round in 0..ROUNDS {
        if round == 2 {
            COUNTING.with(|c| c.set(true));
        }
        let mut sel = Select::new();
        let a = sel.recv(&rx_a);
        let b = sel.recv(&rx_b);
        let c = sel.recv(&rx_c);
        let oper = sel.select();
        let got = match oper.index() {
            i if i == a => oper.recv(&rx_a),
            i if i == c => oper.recv(&rx_c),
            i => panic!("operation {i} (b = {b}) was never sent to"),
        };
        assert_eq!(got, Ok(round), "values arrive in order, once each");
        if round >= 2 {
            allocs_after_warmup = ALLOCS.with(Cell::get);
        }
    }
    COUNTING.with(|c| c.set(false));
    stop.store(true, Ordering::Relaxed);
    drop(rx_a);
    drop(rx_c);
    peer.join().unwrap();
    assert_eq!(
        allocs_after_warmup,
        0,
        "a parked select allocated {allocs_after_warmup} times in {} rounds",
        ROUNDS - 2
    );
}
