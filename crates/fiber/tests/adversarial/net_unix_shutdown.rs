//! Adversarial: a write parked on a full unix socket and this socket's own
//! write shutdown. std's blocked write fails with `BrokenPipe` at once; a
//! unix socket's poll reports nothing for a send shutdown (TCP's reports
//! it writable), so fiber's parked write stayed parked until the peer read
//! or closed.

use std::io::{ErrorKind, Write};
use std::net::Shutdown;
use std::sync::Arc;

use crate::common::{ms, within, write_until_error};

#[test]
fn own_shutdown_write_fails_a_parked_stream_write() {
    within(30, || {
        for how in [Shutdown::Write, Shutdown::Both] {
            let rt = crate::common::rt_fixed_grace(2, ms(300));
            let (a, _b) = fiber::net::unix::UnixStream::pair().unwrap();
            let a = Arc::new(a);
            let a2 = a.clone();
            let h = rt.spawn(move || write_until_error(|| (&*a2).write(&[0u8; 65536])));
            crate::common::wait_parked(&rt, 1);
            a.shutdown(how).unwrap();
            assert_eq!(h.join().unwrap(), ErrorKind::BrokenPipe, "{how:?}");
        }
    });
}

#[test]
fn own_shutdown_write_fails_a_parked_datagram_send() {
    within(30, || {
        let rt = crate::common::rt_fixed_grace(2, ms(300));
        let (a, _b) = fiber::net::unix::UnixDatagram::pair().unwrap();
        let a = Arc::new(a);
        let a2 = a.clone();
        let h = rt.spawn(move || write_until_error(|| a2.send(&[0u8; 1000])));
        crate::common::wait_parked(&rt, 1);
        a.shutdown(Shutdown::Write).unwrap();
        assert_eq!(h.join().unwrap(), ErrorKind::BrokenPipe);
    });
}

/// A read shutdown leaves a parked write alone: it completes once the
/// peer reads.
#[test]
fn own_shutdown_read_leaves_a_parked_write_waiting_for_the_peer() {
    within(30, || {
        let rt = crate::common::rt_fixed_grace(2, ms(300));
        let (a, b) = fiber::net::unix::UnixStream::pair().unwrap();
        let a = Arc::new(a);
        let a2 = a.clone();
        let h = rt.spawn(move || {
            let mut total = 0usize;
            while total < 4 << 20 {
                total += (&*a2).write(&[0u8; 65536]).unwrap();
            }
            total
        });
        crate::common::wait_parked(&rt, 1);
        a.shutdown(Shutdown::Read).unwrap();
        let reader = std::thread::spawn(move || {
            let mut b = b.into_std().unwrap();
            let mut sink = Vec::new();
            std::io::Read::read_to_end(&mut b, &mut sink).unwrap();
            sink.len()
        });
        let written = h.join().unwrap();
        drop(a);
        assert_eq!(reader.join().unwrap(), written);
    });
}
