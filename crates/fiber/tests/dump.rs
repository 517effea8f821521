//! The fiber dump names every wait and the user's call that parked it.

use fiber::chan;
use std::time::Duration;

#[test]
fn the_dump_names_each_wait_and_its_call_site() {
    let (text, dump) = fiber::run(|| {
        let (ready_tx, ready_rx) = chan::bounded::<()>(8);
        let this_file = file!();
        let sleep_line = line!() + 4;
        let r = ready_tx.clone();
        let _sleeper = fiber::spawn(move || {
            r.send(()).unwrap();
            let _ = fiber::sleep(Duration::from_secs(3600));
        });
        let r = ready_tx.clone();
        let park_line = line!() + 3;
        let parker = fiber::spawn(move || {
            r.send(()).unwrap();
            fiber::park();
        });
        let r = ready_tx.clone();
        let (_gate_tx, gate_rx) = chan::bounded::<u8>(0);
        let blocked = fiber::spawn(move || {
            let _ = gate_rx.recv();
        });
        let join_line = line!() + 3;
        let _joiner = fiber::spawn(move || {
            r.send(()).unwrap();
            let _ = blocked.join();
        });
        let r = ready_tx.clone();
        let scope_line = line!() + 3;
        let _scoper = fiber::spawn(move || {
            r.send(()).unwrap();
            fiber::scope(|s| {
                s.spawn(|| fiber::park());
            });
        });
        let mutex = std::sync::Arc::new(fiber::sync::Mutex::new(0u32));
        let held = mutex.lock().unwrap();
        let m = mutex.clone();
        let r = ready_tx.clone();
        let lock_line = line!() + 3;
        let locker = fiber::spawn(move || {
            r.send(()).unwrap();
            *m.lock().unwrap() += 1;
        });
        for _ in 0..5 {
            ready_rx.recv().unwrap();
        }
        // Let every fiber reach its wait.
        let _ = fiber::sleep(Duration::from_millis(50));
        let dump = fiber::dump();
        let text = dump.to_string();
        parker.fiber().unpark();
        drop(held);
        locker.join().unwrap();
        let expect = [
            ("sleep", sleep_line),
            ("park", park_line),
            ("join", join_line),
            ("join", scope_line),
            ("waiting for lock", lock_line),
        ];
        for (kind, line) in expect {
            let site = format!("on {kind} at {this_file}:{line}:");
            assert!(text.contains(&site), "missing {site:?} in:\n{text}");
        }
        (text, dump)
    });
    assert!(dump.fibers.len() >= 6, "{text}");
    assert!(text.starts_with("fiber dump:"), "{text}");
}

/// A fiber parked on a socket is named with the operation and the
/// socket's addresses.
#[test]
fn the_dump_names_socket_waits_with_their_addresses() {
    fiber::run(|| {
        let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let listen_addr = listener.local_addr().unwrap();
        let accepter = fiber::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            // Now wait for the second connection that never comes.
            let second = listener.accept();
            (stream, second.is_err())
        });
        let client = fiber::net::TcpStream::connect(listen_addr).unwrap();
        let client_addr = client.local_addr().unwrap();
        let reader = fiber::spawn(move || {
            let mut buf = [0u8; 1];
            std::io::Read::read(&mut &client, &mut buf).map(|n| (n, client))
        });
        // Let both fibers reach their waits.
        let text = loop {
            let text = fiber::dump().to_string();
            if text.contains("(accept)") && text.contains("(read)") {
                break text;
            }
            let _ = fiber::sleep(Duration::from_millis(10));
        };
        assert!(
            text.contains(&format!("[{listen_addr}]")),
            "the listener's address is missing in:\n{text}"
        );
        assert!(
            text.contains(&format!("[{client_addr} -> {listen_addr}]")),
            "the stream's addresses are missing in:\n{text}"
        );
        accepter.cancel();
        reader.cancel();
        let _ = accepter.join();
        let _ = reader.join();
    });
}
