//! The one place where fiber-sched names its synchronization primitives;
//! under `--cfg loom` they come from loom so the models in `src/tests/` see
//! every interleaving of the sleep/notify protocol.

#[cfg(not(loom))]
mod imp {
    pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
    pub(crate) use std::sync::{Mutex, MutexGuard};

    /// Block while `word == expected`, or until `timeout` (spurious returns
    /// allowed; callers loop and re-check).
    pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<std::time::Duration>) {
        match timeout {
            None => atomic_wait::wait(word, expected),
            Some(timeout) => {
                let ts = libc::timespec {
                    tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
                    tv_nsec: timeout.subsec_nanos() as libc::c_long,
                };
                // SAFETY: FUTEX_WAIT_PRIVATE reads the aligned u32 behind
                // `word` (alive for the call) and the timespec on our stack;
                // it writes nothing.
                unsafe {
                    libc::syscall(
                        libc::SYS_futex,
                        word.as_ptr(),
                        libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                        expected,
                        &ts as *const libc::timespec,
                    );
                }
            }
        }
    }

    /// Wake one thread blocked in `futex_wait` on `word`.
    pub(crate) fn futex_wake_one(word: &AtomicU32) {
        atomic_wait::wake_one(word);
    }
}

#[cfg(loom)]
mod imp {
    pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
    pub(crate) use loom::sync::{Mutex, MutexGuard};

    /// Loom has no futex: yield so the model can run the notifier.
    pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, _timeout: Option<std::time::Duration>) {
        if word.load(Ordering::Acquire) == expected {
            loom::thread::yield_now();
        }
    }

    pub(crate) fn futex_wake_one(_word: &AtomicU32) {}
}

pub(crate) use imp::*;

/// Lock a mutex; no code in this crate panics while holding one.
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}
