//! Adversarial: many fibers waiting on one socket, then leaving without
//! being woken. Each leaving waiter searched the socket's waiter list for
//! its record under the socket's lock, so n waiters leaving cost O(n^2):
//! 40,000 cancelled `recv_from` calls on one UDP socket took 8-11x as long
//! as 10,000 (release build). The program below takes seconds when the
//! removal is O(1) and minutes when it searches.

use std::sync::Arc;

use crate::common::{ms, within};

const N: usize = 120_000;

/// N fibers wait in `recv_from` on one UDP socket; they are cancelled
/// newest first. Every one ends cancelled, and the socket still works.
#[test]
fn cancelling_many_receivers_of_one_socket() {
    within(60, || {
        let rt = crate::common::rt_fixed_grace(2, ms(300));
        let socket = Arc::new(fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap());
        let handles: Vec<_> = (0..N)
            .map(|_| {
                let socket = socket.clone();
                rt.spawn(move || socket.recv_from(&mut [0u8; 16]).is_ok())
            })
            .collect();
        crate::common::wait_parked(&rt, N);
        let cancelled = crate::common::cancel_from_the_back(handles);
        assert_eq!(cancelled, N, "every receiver ends cancelled");
        // The socket still delivers to a new receiver.
        let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sender.send_to(b"ping", socket.local_addr().unwrap()).unwrap();
        let socket2 = socket.clone();
        let got = rt.block_on(move || {
            let mut buf = [0u8; 16];
            let (n, _) = socket2.recv_from(&mut buf).unwrap();
            buf[..n].to_vec()
        });
        assert_eq!(got, b"ping");
    });
}
