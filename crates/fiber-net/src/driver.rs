//! The I/O driver: one poller thread per process, started on first use,
//! that waits in `epoll_wait` (through mio) and turns readiness events into
//! [`Readiness::set_ready`] calls, which wake the parked fibers with
//! `fiber_wake` like any other waitable.
//!
//! Registration: a socket is registered once, edge-triggered, for both
//! directions, under a token that names its slot in the driver's table
//! plus the slot's generation (so an event for a deregistered socket never
//! reaches a socket that reused the slot). Deregistration removes the
//! socket from epoll and from the table, then closes its readiness (waking
//! any waiter with an error), then the fd is closed.

use crate::readiness::Readiness;
use crate::sync::{lock, Arc, Mutex};
use mio::event::Source;
use mio::{Events, Interest, Poll, Registry, Token};
use std::io;
use std::sync::OnceLock;

/// Events taken from the kernel per `epoll_wait`.
const EVENTS_PER_POLL: usize = 1024;

/// Bits of a token that hold the slot index (the rest is the generation).
const INDEX_BITS: u32 = 32;

struct Entry {
    generation: usize,
    readiness: Option<Arc<Readiness>>,
}

#[derive(Default)]
struct Table {
    entries: Vec<Entry>,
    free: Vec<usize>,
}

impl Table {
    fn insert(&mut self, readiness: Arc<Readiness>) -> Token {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.entries.push(Entry {
                    generation: 0,
                    readiness: None,
                });
                self.entries.len() - 1
            }
        };
        let entry = &mut self.entries[index];
        entry.generation = entry.generation.wrapping_add(1) & ((1 << (usize::BITS - INDEX_BITS)) - 1);
        entry.readiness = Some(readiness);
        Token(entry.generation << INDEX_BITS | index)
    }

    fn get(&self, token: Token) -> Option<&Arc<Readiness>> {
        let index = token.0 & ((1 << INDEX_BITS) - 1);
        let entry = self.entries.get(index)?;
        if entry.generation != token.0 >> INDEX_BITS {
            return None;
        }
        entry.readiness.as_ref()
    }

    fn remove(&mut self, token: Token) {
        let index = token.0 & ((1 << INDEX_BITS) - 1);
        if let Some(entry) = self.entries.get_mut(index) {
            if entry.generation == token.0 >> INDEX_BITS && entry.readiness.take().is_some() {
                self.free.push(index);
            }
        }
    }
}

struct Driver {
    registry: Registry,
    table: Mutex<Table>,
}

static DRIVER: OnceLock<io::Result<Driver>> = OnceLock::new();

fn driver() -> io::Result<&'static Driver> {
    DRIVER
        .get_or_init(start)
        .as_ref()
        .map_err(|e| io::Error::new(e.kind(), format!("fiber-net: could not start the I/O driver: {e}")))
}

fn start() -> io::Result<Driver> {
    let poll = Poll::new()?;
    let registry = poll.registry().try_clone()?;
    std::thread::Builder::new()
        .name("fiber-net-poller".to_string())
        .spawn(move || run(poll))?;
    Ok(Driver {
        registry,
        table: Mutex::new(Table::default()),
    })
}

/// The poller thread: runs for the life of the process.
fn run(mut poll: Poll) {
    let mut events = Events::with_capacity(EVENTS_PER_POLL);
    let mut batch: Vec<(Arc<Readiness>, bool, bool)> = Vec::with_capacity(EVENTS_PER_POLL);
    loop {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // epoll_wait fails only on a bad epoll fd or bad arguments: no
            // socket could ever be woken again, so fail loudly.
            eprintln!("fiber-net: the I/O poller failed: {e}; aborting");
            std::process::abort();
        }
        let Some(driver) = DRIVER.get().and_then(|d| d.as_ref().ok()) else {
            continue;
        };
        {
            let table = lock(&driver.table);
            for event in events.iter() {
                if let Some(readiness) = table.get(event.token()) {
                    let error = event.is_error();
                    let read = event.is_readable() || event.is_read_closed() || error;
                    let write = event.is_writable() || event.is_write_closed() || error;
                    batch.push((readiness.clone(), read, write));
                }
            }
        }
        // Wake outside the table lock: a wake may schedule a fiber, which
        // can take its scheduler's locks.
        for (readiness, read, write) in batch.drain(..) {
            readiness.set_ready(read, write);
        }
    }
}

/// A socket registered with the driver. Dropping it deregisters the socket
/// and wakes every waiter with an error before the fd is closed.
pub(crate) struct Registration {
    token: Token,
    pub(crate) readiness: Arc<Readiness>,
}

impl Registration {
    /// Register `source` for both directions, edge-triggered.
    pub(crate) fn new(source: &mut impl Source) -> io::Result<Registration> {
        let driver = driver()?;
        let readiness = Arc::new(Readiness::new());
        let token = lock(&driver.table).insert(readiness.clone());
        if let Err(e) = driver
            .registry
            .register(source, token, Interest::READABLE | Interest::WRITABLE)
        {
            lock(&driver.table).remove(token);
            return Err(e);
        }
        Ok(Registration { token, readiness })
    }

    /// Deregister `source` (which must be the registered one, still open).
    pub(crate) fn deregister(&self, source: &mut impl Source) {
        if let Ok(driver) = driver() {
            // An error here means the fd was already gone from epoll;
            // nothing is left to undo.
            let _ = driver.registry.deregister(source);
            lock(&driver.table).remove(self.token);
        }
        self.readiness.close();
    }
}
