//! [`LazyLock`]: `std::sync::LazyLock`'s API on [`Once`]; callers that
//! arrive while another runs the initializer park.

use crate::once::Once;
use std::cell::UnsafeCell;
use std::fmt;
use std::ops::Deref;

/// What the cell holds: the initializer until it runs, then the value.
enum Data<T, F> {
    Init(F),
    Value(T),
    /// The initializer was taken out and panicked (or is running).
    Taken,
}

/// A value made on first use, with the API of [`std::sync::LazyLock`]: the
/// first access runs the initializer, and every caller that arrives while
/// it runs parks (fibers) or blocks (threads) until the value is there.
/// With std's `LazyLock`, a second fiber forcing the value while the first
/// one's initializer parks blocks its worker thread (on a one-worker
/// runtime, for ever); this one parks that fiber instead. Waiting here is
/// not a cancellation point.
///
/// As with std, an initializer that panics poisons the cell: every later
/// access panics.
///
/// # Examples
///
/// ```
/// # mod fiber { pub(crate) use fiber_sync as sync; }
/// use fiber::sync::LazyLock;
///
/// static TABLE: LazyLock<Vec<u32>> = LazyLock::new(|| (0..4).map(|i| i * i).collect());
/// assert_eq!(TABLE[3], 9);
/// assert_eq!(*LazyLock::force(&TABLE), vec![0, 1, 4, 9]);
/// ```
pub struct LazyLock<T, F = fn() -> T> {
    once: Once,
    /// `Init` until the `Once` runs; written only inside its closure (one
    /// caller at a time), read only once it completed (`Value`).
    data: UnsafeCell<Data<T, F>>,
}

// SAFETY: as `std::sync::LazyLock`: the value is made on one thread and
// read by many (`T: Sync + Send`), and the initializer may run on any
// thread that forces it (`F: Send`).
unsafe impl<T: Sync + Send, F: Send> Sync for LazyLock<T, F> {}

// As std's: a panicking initializer poisons the cell (no torn value is seen).
impl<T: std::panic::RefUnwindSafe + std::panic::UnwindSafe, F: std::panic::UnwindSafe> std::panic::RefUnwindSafe
    for LazyLock<T, F>
{
}

impl<T, F: FnOnce() -> T> LazyLock<T, F> {
    /// A lazy value that `f` makes on first use.
    pub const fn new(f: F) -> LazyLock<T, F> {
        LazyLock {
            once: Once::new(),
            data: UnsafeCell::new(Data::Init(f)),
        }
    }

    /// The value, running the initializer if it has not run yet (parking,
    /// or blocking the thread, while another caller runs it). The same as
    /// `*this`.
    ///
    /// # Panics
    ///
    /// If the initializer panics, or panicked before (the cell is
    /// poisoned), or if called from inside its own initializer by the
    /// caller running it (std deadlocks there).
    #[track_caller]
    pub fn force(this: &LazyLock<T, F>) -> &T {
        this.once.force_named("LazyLock::force", |state| {
            if state.is_poisoned() {
                poisoned();
            }
            // SAFETY: inside the `Once`'s closure: the only access to
            // `data` until the `Once` completes.
            let data = unsafe { &mut *this.data.get() };
            let Data::Init(f) = std::mem::replace(data, Data::Taken) else {
                unreachable!("a LazyLock's initializer runs once");
            };
            // A panic here leaves `Taken` and poisons the `Once`.
            *data = Data::Value(f());
        });
        // SAFETY: the `Once` completed (observed with Acquire): `data` is
        // `Value` and never written again while shared.
        match unsafe { &*this.data.get() } {
            Data::Value(value) => value,
            _ => unreachable!("a completed LazyLock holds its value"),
        }
    }

    /// The value, by unique reference, running the initializer if it has
    /// not run yet (as `std::sync::LazyLock::force_mut`; no other caller
    /// can be waiting, since this one holds `&mut`).
    ///
    /// # Panics
    ///
    /// If the initializer panics, or panicked before (the cell is
    /// poisoned).
    #[track_caller]
    pub fn force_mut(this: &mut LazyLock<T, F>) -> &mut T {
        LazyLock::force(this);
        match this.data.get_mut() {
            Data::Value(value) => value,
            _ => unreachable!("a completed LazyLock holds its value"),
        }
    }

    /// The value if it has been made, else `None` (as
    /// `std::sync::LazyLock::get`): never runs the initializer nor waits
    /// for one that is running. `None` for a poisoned cell too.
    ///
    /// ```
    /// # mod fiber { pub(crate) use fiber_sync as sync; }
    /// use fiber::sync::LazyLock;
    ///
    /// let lazy = LazyLock::new(|| 7);
    /// assert_eq!(LazyLock::get(&lazy), None);
    /// assert_eq!(*lazy, 7);
    /// assert_eq!(LazyLock::get(&lazy), Some(&7));
    /// ```
    pub fn get(this: &LazyLock<T, F>) -> Option<&T> {
        if !this.once.is_completed() {
            return None;
        }
        // SAFETY: the `Once` completed (observed with Acquire): `data` is
        // `Value` and never written again while shared.
        match unsafe { &*this.data.get() } {
            Data::Value(value) => Some(value),
            _ => None,
        }
    }

    /// The value by unique reference if it has been made, else `None` (as
    /// `std::sync::LazyLock::get_mut`); never runs the initializer.
    pub fn get_mut(this: &mut LazyLock<T, F>) -> Option<&mut T> {
        match this.data.get_mut() {
            Data::Value(value) => Some(value),
            _ => None,
        }
    }

    /// The value if made, else the initializer (as
    /// `std::sync::LazyLock::into_inner`).
    ///
    /// # Panics
    ///
    /// If the cell is poisoned.
    pub fn into_inner(this: LazyLock<T, F>) -> Result<T, F> {
        let LazyLock { data, .. } = this;
        match data.into_inner() {
            Data::Value(value) => Ok(value),
            Data::Init(f) => Err(f),
            Data::Taken => poisoned(),
        }
    }
}

#[cold]
#[track_caller]
fn poisoned() -> ! {
    panic!("LazyLock instance has previously been poisoned")
}

impl<T, F: FnOnce() -> T> Deref for LazyLock<T, F> {
    type Target = T;

    /// The value (see [`LazyLock::force`]).
    #[track_caller]
    fn deref(&self) -> &T {
        LazyLock::force(self)
    }
}

impl<T: Default> Default for LazyLock<T> {
    /// A lazy `T::default()`.
    fn default() -> LazyLock<T> {
        LazyLock::new(T::default)
    }
}

impl<T: fmt::Debug, F> fmt::Debug for LazyLock<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_tuple("LazyLock");
        if self.once.is_completed() {
            // SAFETY: completed: `Value`, never written again while shared.
            if let Data::Value(value) = unsafe { &*self.data.get() } {
                d.field(value);
            }
        } else {
            d.field(&format_args!("<uninit>"));
        }
        d.finish()
    }
}
