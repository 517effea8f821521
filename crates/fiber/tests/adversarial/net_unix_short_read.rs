//! Adversarial: a Unix stream read that stops short at a message boundary
//! the kernel will not glue across (SCM_RIGHTS ancillary data, MSG_OOB)
//! while more bytes are queued. std returns the queued bytes on the next
//! read; "a short read drained the socket" (spec/net.md section 4a) must
//! not park it.

use fiber::net::unix::UnixStream;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::Duration;

#[repr(C)]
struct IoVec {
    base: *const u8,
    len: usize,
}
#[repr(C)]
struct MsgHdr {
    name: *mut u8,
    namelen: u32,
    iov: *const IoVec,
    iovlen: usize,
    control: *mut u8,
    controllen: usize,
    flags: i32,
}
extern "C" {
    fn sendmsg(fd: i32, msg: *const MsgHdr, flags: i32) -> isize;
    fn send(fd: i32, buf: *const u8, len: usize, flags: i32) -> isize;
}

/// Send `data` with one fd (`pass`) attached as SCM_RIGHTS.
fn send_with_fd(fd: i32, data: &[u8], pass: i32) {
    let iov = IoVec {
        base: data.as_ptr(),
        len: data.len(),
    };
    // cmsghdr { len: usize, level: i32, type: i32 } + int, padded to 24.
    let mut control = [0u8; 24];
    control[0..8].copy_from_slice(&(20usize).to_ne_bytes());
    control[8..12].copy_from_slice(&1i32.to_ne_bytes()); // SOL_SOCKET
    control[12..16].copy_from_slice(&1i32.to_ne_bytes()); // SCM_RIGHTS
    control[16..20].copy_from_slice(&pass.to_ne_bytes());
    let msg = MsgHdr {
        name: std::ptr::null_mut(),
        namelen: 0,
        iov: &iov,
        iovlen: 1,
        control: control.as_mut_ptr(),
        controllen: 24,
        flags: 0,
    };
    // SAFETY: valid msghdr for the call's duration.
    let n = unsafe {
        sendmsg(fd, &msg, 0x4000 /* MSG_NOSIGNAL */)
    };
    assert_eq!(n, data.len() as isize, "sendmsg: {}", std::io::Error::last_os_error());
}

fn with_deadline<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("hang: no result within {secs} s"))
}

/// Peer sends "abc" with an fd attached, then "def" plainly. Reader reads
/// with a 64-byte buffer twice, after both arrived.
fn scm_rights_body() -> (Vec<u8>, Vec<u8>) {
    let (reader, peer) = UnixStream::pair().unwrap();
    let devnull = std::fs::File::open("/dev/null").unwrap();
    send_with_fd(peer.as_raw_fd(), b"abc", devnull.as_raw_fd());
    (&peer).write_all_std(b"def");
    // Let the poller deliver the readiness events first.
    std::thread::sleep(Duration::from_millis(100));
    let mut buf = [0u8; 64];
    let n = (&reader).read(&mut buf).unwrap();
    let first = buf[..n].to_vec();
    // std: "def" is queued, so this read returns at once.
    reader.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let second = match (&reader).read(&mut buf) {
        Ok(n) => buf[..n].to_vec(),
        Err(e) => format!("ERR {e:?}").into_bytes(),
    };
    drop(peer);
    (first, second)
}

trait WriteAllStd {
    fn write_all_std(self, b: &[u8]);
}
impl WriteAllStd for &UnixStream {
    fn write_all_std(mut self, b: &[u8]) {
        std::io::Write::write_all(&mut self, b).unwrap();
    }
}

#[test]
fn std_reference_scm_rights_short_read() {
    // The same scenario with std's UnixStream: the second read returns "def".
    let (reader, peer) = std::os::unix::net::UnixStream::pair().unwrap();
    let devnull = std::fs::File::open("/dev/null").unwrap();
    send_with_fd(peer.as_raw_fd(), b"abc", devnull.as_raw_fd());
    std::io::Write::write_all(&mut &peer, b"def").unwrap();
    let mut buf = [0u8; 64];
    let n = (&reader).read(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"abc");
    let n = (&reader).read(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"def");
}

#[test]
fn scm_rights_short_read_then_queued_data_on_a_thread() {
    let (first, second) = with_deadline(20, scm_rights_body);
    assert_eq!(first, b"abc");
    assert_eq!(String::from_utf8_lossy(&second), "def");
}

#[test]
fn scm_rights_short_read_then_queued_data_in_a_fiber() {
    let (first, second) = with_deadline(20, || {
        fiber::Runtime::builder()
            .workers(2)
            .build()
            .unwrap()
            .block_on(scm_rights_body)
    });
    assert_eq!(first, b"abc");
    assert_eq!(String::from_utf8_lossy(&second), "def");
}

/// AF_UNIX MSG_OOB (Linux >= 5.15): "ab" then OOB "X" then "cd". A read
/// stops at the OOB mark; std's next read returns the rest.
fn unix_oob_body() -> Vec<Vec<u8>> {
    let (reader, peer) = UnixStream::pair().unwrap();
    (&peer).write_all_std(b"ab");
    // SAFETY: valid fd and buffer.
    let n = unsafe {
        send(peer.as_raw_fd(), b"X".as_ptr(), 1, 1 /* MSG_OOB */)
    };
    if n != 1 {
        return vec![b"SKIP".to_vec()];
    }
    (&peer).write_all_std(b"cd");
    std::thread::sleep(Duration::from_millis(100));
    reader.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 64];
    for _ in 0..2 {
        out.push(match (&reader).read(&mut buf) {
            Ok(n) => buf[..n].to_vec(),
            Err(e) => format!("ERR {e:?}").into_bytes(),
        });
    }
    out
}

#[test]
fn unix_oob_short_read_then_queued_data_in_a_fiber() {
    let got = with_deadline(20, || {
        fiber::Runtime::builder()
            .workers(2)
            .build()
            .unwrap()
            .block_on(unix_oob_body)
    });
    if got == [b"SKIP".to_vec()] {
        return;
    }
    let all: Vec<u8> = got.concat();
    assert!(
        all == b"abcd" || all == b"abXcd",
        "got {:?}",
        got.iter()
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect::<Vec<_>>()
    );
}

/// Same, with no read timeout: the second read must return "def" (std); a
/// read that stays parked for 5 s is reported as a hang.
#[test]
fn scm_rights_short_read_then_queued_data_without_a_timeout_on_a_thread() {
    let (tx, rx) = mpsc::channel();
    let (reader, peer) = UnixStream::pair().unwrap();
    let devnull = std::fs::File::open("/dev/null").unwrap();
    send_with_fd(peer.as_raw_fd(), b"abc", devnull.as_raw_fd());
    (&peer).write_all_std(b"def");
    std::thread::sleep(Duration::from_millis(100));
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let n = (&reader).read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"abc");
        let n = (&reader).read(&mut buf).unwrap();
        let _ = tx.send(buf[..n].to_vec());
    });
    let got = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("hang: second read still parked after 5 s with \"def\" queued");
    assert_eq!(got, b"def");
    drop(peer);
}
