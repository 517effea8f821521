//! Adversarial: the fiber dump names every kind of wait with the user's
//! call site (`#[track_caller]` through the public parking APIs: channel
//! receive and send, `select!`, sleep, park, join, locks, condvar, a
//! socket's accept, `fiber::blocking`), groups identical sites with
//! counts, and escapes fiber names (a name cannot forge dump lines).

use fiber::chan;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{ms, within};

fn rt_n(workers: usize, max: usize) -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(workers)
        .max_workers(max)
        .shutdown_timeout(ms(500))
        .build()
        .unwrap()
}

#[test]
#[rustfmt::skip] // the `line!()` offsets below count lines
fn the_dump_names_every_wait_with_the_users_call_site() {
    let rt = Arc::new(rt_n(2, 2));
    let rt2 = rt.clone();
    let file = file!();
    let (text, lines) = within(60, move || {
        let rt = rt2;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
        let lines: Arc<Mutex<Vec<(&'static str, u32)>>> = Arc::new(Mutex::new(Vec::new()));
        let keep: Arc<Mutex<Vec<Box<dyn std::any::Any + Send>>>> = Arc::new(Mutex::new(Vec::new()));
        {
            let (lines, keep, ready_tx) = (lines.clone(), keep.clone(), ready_tx.clone());
            rt.spawn(move || {
                let push = |k: &'static str, l: u32| lines.lock().unwrap().push((k, l));
                // recv x3 from one site
                let (tx, rx) = chan::bounded::<u8>(0);
                keep.lock().unwrap().push(Box::new(tx));
                let recv_line = line!() + 4;
                for _ in 0..3 {
                    let rx = rx.clone();
                    let r = ready_tx.clone();
                    fiber::spawn(move || { r.send(()).unwrap(); let _ = rx.recv(); });
                }
                push("chan receive", recv_line);
                // send
                let (stx, srx) = chan::bounded::<u8>(0);
                keep.lock().unwrap().push(Box::new(srx));
                let r = ready_tx.clone();
                let send_line = line!() + 1;
                fiber::spawn(move || { r.send(()).unwrap(); let _ = stx.send(1); });
                push("chan send", send_line);
                // select
                let (t1, r1) = chan::bounded::<u8>(0);
                let (t2, r2) = chan::bounded::<u8>(0);
                keep.lock().unwrap().push(Box::new((t1, t2)));
                let r = ready_tx.clone();
                let select_line = line!() + 1;
                fiber::spawn(move || { r.send(()).unwrap(); fiber::select! { recv(r1) -> _ => {}, recv(r2) -> _ => {} } });
                push("select", select_line);
                // sleep
                let r = ready_tx.clone();
                let sleep_line = line!() + 1;
                fiber::spawn(move || { r.send(()).unwrap(); let _ = fiber::sleep(Duration::from_secs(3600)); });
                push("sleep", sleep_line);
                // a for loop over a receiver (`Iterator::next`)
                let (itx, irx) = chan::bounded::<u8>(0);
                keep.lock().unwrap().push(Box::new(itx));
                let r = ready_tx.clone();
                let iter_line = line!() + 1;
                fiber::spawn(move || { r.send(()).unwrap(); for _ in irx.iter() {} });
                push("chan receive", iter_line);
                // a timer channel's receive
                let r = ready_tx.clone();
                let after_line = line!() + 1;
                fiber::spawn(move || { r.send(()).unwrap(); let _ = chan::after(Duration::from_secs(3600)).recv(); });
                push("sleep", after_line);
                // a with_timeout block: its body's wait and its watchdog
                let (wtx, wrx) = chan::bounded::<u8>(0);
                keep.lock().unwrap().push(Box::new(wtx));
                let r = ready_tx.clone();
                let timeout_line = line!() + 1;
                fiber::spawn(move || { r.send(()).unwrap(); let _ = fiber::with_timeout(Duration::from_secs(3600), || wrx.recv()); });
                push("chan receive", timeout_line);
                push("wait", timeout_line);
                // park
                let r = ready_tx.clone();
                let park_line = line!() + 1;
                fiber::spawn(move || { r.send(()).unwrap(); fiber::park(); });
                push("park", park_line);
                // join
                let (jtx, jrx) = chan::bounded::<u8>(0);
                keep.lock().unwrap().push(Box::new(jtx));
                let inner = fiber::spawn(move || { let _ = jrx.recv(); });
                let r = ready_tx.clone();
                let join_line = line!() + 1;
                fiber::spawn(move || { r.send(()).unwrap(); let _ = inner.join(); });
                push("join", join_line);
                // mutex
                let m = Arc::new(fiber::sync::Mutex::new(()));
                let held = m.lock().unwrap();
                let m2 = m.clone();
                let r = ready_tx.clone();
                let lock_line = line!() + 1;
                let locker = fiber::spawn(move || { r.send(()).unwrap(); let _g = m2.lock().unwrap(); });
                push("waiting for lock", lock_line);
                // condvar
                let pair = Arc::new((fiber::sync::Mutex::new(false), fiber::sync::Condvar::new()));
                let p2 = pair.clone();
                keep.lock().unwrap().push(Box::new(pair));
                let r = ready_tx.clone();
                let cv_line = line!() + 1;
                fiber::spawn(move || { r.send(()).unwrap(); let g = p2.0.lock().unwrap(); let _g = p2.1.wait_while(g, |b| !*b); });
                push("waiting for lock", cv_line);
                // accept
                let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let r = ready_tx.clone();
                let accept_line = line!() + 1;
                fiber::spawn(move || { r.send(()).unwrap(); let _ = l.accept(); });
                push("I/O (accept)", accept_line);
                // blocking
                let r = ready_tx.clone();
                let blocking_line = line!() + 1;
                fiber::spawn(move || { r.send(()).unwrap(); fiber::blocking(|| std::thread::sleep(Duration::from_millis(1500))); });
                push("blocking call", blocking_line);
                // hold the lock until the dump is done
                let _ = fiber::sleep(Duration::from_secs(2));
                drop(held);
                let _ = locker.join();
            });
        }
        for _ in 0..15 {
            ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        std::thread::sleep(ms(300));
        let text = rt.dump().to_string();
        let lines = lines.lock().unwrap().clone();
        (text, lines)
    });
    let mut missing = Vec::new();
    for (kind, line) in &lines {
        let site = format!("on {kind} at {file}:{line}:");
        if !text.contains(&site) {
            missing.push(site);
        }
    }
    let recv_line = lines.iter().find(|(k, _)| *k == "chan receive").unwrap().1; // the first: 3 fibers
    let grouped = format!("3 fiber(s) parked on chan receive at {file}:{recv_line}:");
    if !text.contains(&grouped) {
        missing.push(grouped);
    }
    drop(rt);
    assert!(missing.is_empty(), "missing {missing:#?} in:\n{text}");
}

/// A name with a newline is printed escaped, on the fiber's own line.
#[test]
fn a_fiber_name_cannot_forge_dump_lines() {
    let rt = rt_n(1, 1);
    let text = rt.block_on(|| {
        let (tx, rx) = chan::bounded::<u8>(0);
        let h = fiber::Builder::new()
            .name("evil\nfiber 999 parked on forged at nowhere:1:1".to_string())
            .spawn(move || {
                let _ = rx.recv();
            })
            .unwrap();
        while !fiber::dump().to_string().contains("evil") {
            fiber::yield_now().unwrap();
        }
        let text = fiber::dump().to_string();
        drop(tx);
        let _ = h.join();
        text
    });
    assert!(
        !text.lines().any(|l| l.trim_start().starts_with("fiber 999")),
        "a fiber name started a line of its own:\n{text}"
    );
    assert!(text.contains("\\n"), "the newline is escaped:\n{text}");
}

/// More waits whose dump line must be the user's: `Job::cancel_and_join`
/// (it named a line inside fiber-jobs) and a socket's `read_exact`,
/// `read_to_end`, `read_to_string` and `write_all` (std's provided loops:
/// they named a line inside std).
#[test]
#[rustfmt::skip] // the `line!()` offsets below count lines
fn cancel_and_join_and_the_std_read_write_loops_name_the_users_line() {
    use std::io::{Read, Write};
    let rt = Arc::new(rt_n(2, 2));
    let rt2 = rt.clone();
    let file = file!();
    let (text, lines) = within(60, move || {
        let rt = rt2;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<u32>();
        let (done_tx, done_rx) = chan::bounded::<()>(1);
        rt.spawn(move || {
            // A job parked in a lock this fiber holds: cancelling it does
            // not end its wait, so `cancel_and_join` waits.
            let m = Arc::new(fiber::sync::Mutex::new(()));
            let held = m.lock().unwrap();
            let (job_tx, job_rx) = chan::bounded::<fiber::Job>(1);
            let m2 = m.clone();
            fiber::spawn(move || { job_tx.send(fiber::Job::current()).unwrap(); let _g = m2.lock().unwrap(); });
            let job = job_rx.recv().unwrap();
            let r = ready_tx.clone();
            fiber::spawn(move || { r.send(line!()).unwrap(); let _ = job.cancel_and_join(); });
            // Idle connections for the reads, one that nobody reads for the write.
            let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let pair = || {
                let client = fiber::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
                (client, l.accept().unwrap().0)
            };
            let ((ka, mut a), (kb, mut b), (kc, mut c), (mut w, kw)) = (pair(), pair(), pair(), pair());
            let r = ready_tx.clone();
            fiber::spawn(move || { r.send(line!()).unwrap(); let _ = a.read_exact(&mut [0u8; 8]); });
            let r = ready_tx.clone();
            fiber::spawn(move || { r.send(line!()).unwrap(); let _ = b.read_to_end(&mut Vec::new()); });
            let r = ready_tx.clone();
            fiber::spawn(move || { r.send(line!()).unwrap(); let _ = c.read_to_string(&mut String::new()); });
            let r = ready_tx;
            fiber::spawn(move || { r.send(line!()).unwrap(); let _ = w.write_all(&vec![0u8; 64 << 20]); });
            let _ = done_rx.recv();
            drop(held);
            drop((ka, kb, kc, kw));
        });
        let lines: Vec<u32> = (0..5).map(|_| ready_rx.recv_timeout(Duration::from_secs(10)).unwrap()).collect();
        std::thread::sleep(ms(300));
        let text = rt.dump().to_string();
        let _ = done_tx.send(());
        (text, lines)
    });
    drop(rt);
    let missing: Vec<String> = lines
        .iter()
        .map(|line| format!(" at {file}:{line}:"))
        // The parked-at site, not the spawn site (which names the same
        // line here).
        .filter(|site| !text.lines().any(|l| l.split(", spawned at").next().unwrap().contains(site.as_str())))
        .collect();
    assert!(missing.is_empty(), "missing {missing:#?} in:\n{text}");
}
