//! The `select!` and `select_biased!` macros (crossbeam-channel's syntax).

/// Wait on several channel operations and run the arm of the one that
/// completes; when several are ready, one is picked at random.
///
/// ```
/// # mod fiber { pub(crate) use fiber_chan as chan; pub use fiber_chan::select; }
/// use fiber::chan::{after, bounded, never, unbounded};
/// use fiber::select;
/// use std::time::Duration;
///
/// let (s1, r1) = unbounded();
/// let (s2, r2) = bounded(1);
/// s1.send(1).unwrap();
///
/// select! {
///     recv(r1) -> msg => assert_eq!(msg, Ok(1)),
///     send(s2, 2) -> res => assert_eq!(res, Ok(())),
///     default(Duration::from_secs(1)) => panic!("both were ready"),
/// }
///
/// // Receivers made in the arm, and an arm that replaces its receiver.
/// // (`r2` holds a value whichever arm ran above.)
/// let _ = s2.try_send(2);
/// let timeout: Option<Duration> = None;
/// let mut r = r2;
/// select! {
///     recv(r) -> _ => r = never(),
///     recv(timeout.map(after).unwrap_or_else(never)) -> _ => unreachable!(),
/// }
/// assert!(r.try_recv().is_err());
/// ```
///
/// Arms: `recv(receiver) -> result => body`, `send(sender, value) -> result
/// => body`, and at most one `default => body` (run if nothing is ready
/// now) or `default(timeout) => body` (run if nothing completes in time).
/// As in crossbeam, an argument list may end with a comma (`recv(r,)`,
/// `send(s, v,)`, `default(t,)`) and `default()` is a plain default.
/// Without a default, `select!` waits; with no operations and no default it
/// panics (it could never return). A `default` arm polls the operations one
/// after the other: against a peer that moves a value from one of them to
/// another at that moment it may find both empty and run `default`. In a
/// fiber, taking `default(timeout)` (zero included) is a yield point; a
/// plain `default` is not.
///
/// As in crossbeam: the operands (`receiver`, `sender`) are evaluated once,
/// in order, and borrowed only while selecting, so a body may reassign or
/// drop them; a send arm's `value` is evaluated only if that arm is
/// selected (a receiver or buffer slot is reserved for it first, so the
/// send then cannot block or lose the value), in the same branch as that
/// arm's body, so the default body or another arm's body may still use a
/// value that was not sent (`send(s, item) -> _ => {}, default =>
/// keep(item)`).
///
/// Cancellation: see [`Select`](crate::Select#cancellation); a cancelled
/// blocking `select!` runs its first channel arm with a failed result.
#[macro_export]
macro_rules! select {
    ($($tokens:tt)*) => {
        $crate::__select_internal!(@parse new () () $($tokens)*)
    };
}

/// [`select!`] that, when several operations are ready, picks the first in
/// the order written (crossbeam-channel's `select_biased!`).
///
/// ```
/// # mod fiber { pub(crate) use fiber_chan as chan; }
/// use fiber::chan::{select_biased, unbounded};
///
/// let (s1, r1) = unbounded();
/// let (s2, r2) = unbounded();
/// s1.send(1).unwrap();
/// s2.send(2).unwrap();
/// let first = select_biased! {
///     recv(r1) -> v => v.unwrap(),
///     recv(r2) -> v => v.unwrap(),
/// };
/// assert_eq!(first, 1);
/// ```
#[macro_export]
macro_rules! select_biased {
    ($($tokens:tt)*) => {
        $crate::__select_internal!(@parse new_biased () () $($tokens)*)
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __select_internal {
    // ---- parsing: (@parse ctor (arms) (default) tokens) ----
    (@parse $new:ident ($($arms:tt)*) ($($def:tt)*)) => {
        $crate::__select_internal!(@emit $new ($($arms)*) ($($def)*))
    };
    (@parse $new:ident ($($arms:tt)*) ($($def:tt)*) , $($rest:tt)*) => {
        $crate::__select_internal!(@parse $new ($($arms)*) ($($def)*) $($rest)*)
    };
    // crossbeam's spellings: a trailing comma inside an argument list, and
    // `default()` for a plain default.
    (@parse $new:ident ($($arms:tt)*) ($($def:tt)*) recv($r:expr ,) $($rest:tt)*) => {
        $crate::__select_internal!(@parse $new ($($arms)*) ($($def)*) recv($r) $($rest)*)
    };
    (@parse $new:ident ($($arms:tt)*) ($($def:tt)*) send($s:expr, $v:expr ,) $($rest:tt)*) => {
        $crate::__select_internal!(@parse $new ($($arms)*) ($($def)*) send($s, $v) $($rest)*)
    };
    (@parse $new:ident ($($arms:tt)*) () default() $($rest:tt)*) => {
        $crate::__select_internal!(@parse $new ($($arms)*) () default $($rest)*)
    };
    (@parse $new:ident ($($arms:tt)*) () default($t:expr ,) $($rest:tt)*) => {
        $crate::__select_internal!(@parse $new ($($arms)*) () default($t) $($rest)*)
    };
    (@parse $new:ident ($($arms:tt)*) ($($def:tt)*) recv($r:expr) -> $p:pat => $body:block $($rest:tt)*) => {
        $crate::__select_internal!(@parse $new ($($arms)* [recv __h __i ($r) ($p) ($body)]) ($($def)*) $($rest)*)
    };
    (@parse $new:ident ($($arms:tt)*) ($($def:tt)*) recv($r:expr) -> $p:pat => $body:expr , $($rest:tt)*) => {
        $crate::__select_internal!(@parse $new ($($arms)* [recv __h __i ($r) ($p) ($body)]) ($($def)*) $($rest)*)
    };
    (@parse $new:ident ($($arms:tt)*) ($($def:tt)*) recv($r:expr) -> $p:pat => $body:expr) => {
        $crate::__select_internal!(@parse $new ($($arms)* [recv __h __i ($r) ($p) ($body)]) ($($def)*))
    };
    (@parse $new:ident ($($arms:tt)*) ($($def:tt)*) send($s:expr, $v:expr) -> $p:pat => $body:block $($rest:tt)*) => {
        $crate::__select_internal!(@parse $new ($($arms)* [send __h __i ($s, $v) ($p) ($body)]) ($($def)*) $($rest)*)
    };
    (@parse $new:ident ($($arms:tt)*) ($($def:tt)*) send($s:expr, $v:expr) -> $p:pat => $body:expr , $($rest:tt)*) => {
        $crate::__select_internal!(@parse $new ($($arms)* [send __h __i ($s, $v) ($p) ($body)]) ($($def)*) $($rest)*)
    };
    (@parse $new:ident ($($arms:tt)*) ($($def:tt)*) send($s:expr, $v:expr) -> $p:pat => $body:expr) => {
        $crate::__select_internal!(@parse $new ($($arms)* [send __h __i ($s, $v) ($p) ($body)]) ($($def)*))
    };
    (@parse $new:ident ($($arms:tt)*) () default => $body:block $($rest:tt)*) => {
        $crate::__select_internal!(@parse $new ($($arms)*) (now ($body)) $($rest)*)
    };
    (@parse $new:ident ($($arms:tt)*) () default => $body:expr , $($rest:tt)*) => {
        $crate::__select_internal!(@parse $new ($($arms)*) (now ($body)) $($rest)*)
    };
    (@parse $new:ident ($($arms:tt)*) () default => $body:expr) => {
        $crate::__select_internal!(@parse $new ($($arms)*) (now ($body)))
    };
    (@parse $new:ident ($($arms:tt)*) () default($t:expr) => $body:block $($rest:tt)*) => {
        $crate::__select_internal!(@parse $new ($($arms)*) (after ($t) ($body)) $($rest)*)
    };
    (@parse $new:ident ($($arms:tt)*) () default($t:expr) => $body:expr , $($rest:tt)*) => {
        $crate::__select_internal!(@parse $new ($($arms)*) (after ($t) ($body)) $($rest)*)
    };
    (@parse $new:ident ($($arms:tt)*) () default($t:expr) => $body:expr) => {
        $crate::__select_internal!(@parse $new ($($arms)*) (after ($t) ($body)))
    };
    (@parse $new:ident ($($arms:tt)*) ($($def:tt)+) default $($rest:tt)*) => {
        compile_error!("select! takes at most one `default` arm")
    };
    (@parse $new:ident ($($arms:tt)*) ($($def:tt)*) $($rest:tt)+) => {
        compile_error!("select! arms are `recv(r) -> res => body`, `send(s, v) -> res => body`, `default => body` or `default(timeout) => body`")
    };

    // ---- code generation ----
    // As crossbeam's: the operands are borrowed by nested `match`es, the
    // select runs inside them, and each arm's body runs in the branch that
    // completed that arm's operation. So a send arm's value is moved only
    // in its own branch: the default body or another arm's body may still
    // use it (`send(s, item) -> _ => {}, default => keep(item)`).
    (@emit $new:ident ($([$kind:ident $h:ident $i:ident $operands:tt $p:tt $body:tt])*) ($($def:tt)*)) => {{
        // Operands first, in order, each the scrutinee of a `match` that
        // holds the rest: temporaries made while evaluating an operand
        // (`recv(r.unwrap_or(&never()))`) live until the select is done.
        $crate::__select_internal!(@bind ($([$kind $h $operands])*) {
            let mut __select = $crate::Select::$new();
            $( let $i = $crate::__select_internal!(@add __select $kind $h); )*
            $crate::__select_internal!(@run __select ($([$kind $h $i $operands $p $body])*) ($($def)*))
        })
    }};

    (@bind () $cont:tt) => { $cont };
    (@bind ([recv $h:ident ($r:expr)] $($rest:tt)*) $cont:tt) => {
        match &$r {
            $h => $crate::__select_internal!(@bind ($($rest)*) $cont),
        }
    };
    (@bind ([send $h:ident ($s:expr, $v:expr)] $($rest:tt)*) $cont:tt) => {
        match &$s {
            $h => $crate::__select_internal!(@bind ($($rest)*) $cont),
        }
    };
    (@add $sel:ident recv $h:ident) => { $sel.recv($h) };
    (@add $sel:ident send $h:ident) => { $sel.send($h) };

    // The select is moved into the call that completes the chosen
    // operation (or dropped for the default) before a body runs, so its
    // borrows of the handles end there: a body may replace the channel it
    // used (`Err(_) => r = never()`).
    (@run $sel:ident ($($arms:tt)*) ()) => {{
        let __chosen = $sel.__select_owned();
        // A blocking select always chooses (`usize::MAX` matches no arm).
        let __index = __chosen.index().unwrap_or(usize::MAX);
        $crate::__select_internal!(@dispatch __chosen __index $($arms)*)
    }};
    (@run $sel:ident ($($arms:tt)*) (now ($default:expr))) => {{
        let __chosen = $sel.__try_select_owned();
        match __chosen.index() {
            ::std::option::Option::Some(__index) => {
                $crate::__select_internal!(@dispatch __chosen __index $($arms)*)
            }
            ::std::option::Option::None => {
                ::std::mem::drop(__chosen);
                $default
            }
        }
    }};
    (@run $sel:ident ($($arms:tt)*) (after ($t:expr) ($default:expr))) => {{
        let __chosen = $sel.__select_timeout_owned($t);
        match __chosen.index() {
            ::std::option::Option::Some(__index) => {
                $crate::__select_internal!(@dispatch __chosen __index $($arms)*)
            }
            ::std::option::Option::None => {
                ::std::mem::drop(__chosen);
                $default
            }
        }
    }};

    (@dispatch $o:ident $idx:ident) => {{
        ::std::mem::drop($o);
        unreachable!("select! returned an operation it did not register")
    }};
    (@dispatch $o:ident $idx:ident [recv $h:ident $i:ident ($r:expr) ($p:pat) ($body:expr)] $($rest:tt)*) => {
        if $idx == $i {
            let __res = $o.recv($h);
            match __res {
                $p => $body,
            }
        } else {
            $crate::__select_internal!(@dispatch $o $idx $($rest)*)
        }
    };
    (@dispatch $o:ident $idx:ident [send $h:ident $i:ident ($s:expr, $v:expr) ($p:pat) ($body:expr)] $($rest:tt)*) => {
        if $idx == $i {
            // The value is evaluated only now, for the selected arm.
            let __res = $o.send($h, $v);
            match __res {
                $p => $body,
            }
        } else {
            $crate::__select_internal!(@dispatch $o $idx $($rest)*)
        }
    };
}
