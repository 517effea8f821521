//! The `select!` macro (crossbeam-channel's syntax).

/// Wait on several channel operations and run the arm of the one that
/// completes; when several are ready, one is picked at random.
///
/// ```
/// use fiber_chan::{bounded, select, unbounded};
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
/// ```
///
/// Arms: `recv(receiver) -> result => body`, `send(sender, value) -> result
/// => body` (the value is evaluated on entry, as in Go, and sent only if
/// that arm is selected), and at most one `default => body` (run if nothing
/// is ready now) or `default(timeout) => body` (run if nothing completes in
/// time). Without a default, `select!` waits; with no operations and no
/// default it panics (it could never return).
#[macro_export]
macro_rules! select {
    ($($tokens:tt)*) => {
        $crate::__select_internal!(@parse () () $($tokens)*)
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __select_internal {
    // ---- parsing: (@parse (arms) (default) tokens) ----
    (@parse ($($arms:tt)*) ($($def:tt)*)) => {
        $crate::__select_internal!(@emit ($($arms)*) ($($def)*))
    };
    (@parse ($($arms:tt)*) ($($def:tt)*) , $($rest:tt)*) => {
        $crate::__select_internal!(@parse ($($arms)*) ($($def)*) $($rest)*)
    };
    (@parse ($($arms:tt)*) ($($def:tt)*) recv($r:expr) -> $p:pat => $body:block $($rest:tt)*) => {
        $crate::__select_internal!(@parse ($($arms)* [recv handle index ($r) ($p) ($body)]) ($($def)*) $($rest)*)
    };
    (@parse ($($arms:tt)*) ($($def:tt)*) recv($r:expr) -> $p:pat => $body:expr , $($rest:tt)*) => {
        $crate::__select_internal!(@parse ($($arms)* [recv handle index ($r) ($p) ($body)]) ($($def)*) $($rest)*)
    };
    (@parse ($($arms:tt)*) ($($def:tt)*) recv($r:expr) -> $p:pat => $body:expr) => {
        $crate::__select_internal!(@parse ($($arms)* [recv handle index ($r) ($p) ($body)]) ($($def)*))
    };
    (@parse ($($arms:tt)*) ($($def:tt)*) send($s:expr, $v:expr) -> $p:pat => $body:block $($rest:tt)*) => {
        $crate::__select_internal!(@parse ($($arms)* [send handle index ($s, $v) ($p) ($body)]) ($($def)*) $($rest)*)
    };
    (@parse ($($arms:tt)*) ($($def:tt)*) send($s:expr, $v:expr) -> $p:pat => $body:expr , $($rest:tt)*) => {
        $crate::__select_internal!(@parse ($($arms)* [send handle index ($s, $v) ($p) ($body)]) ($($def)*) $($rest)*)
    };
    (@parse ($($arms:tt)*) ($($def:tt)*) send($s:expr, $v:expr) -> $p:pat => $body:expr) => {
        $crate::__select_internal!(@parse ($($arms)* [send handle index ($s, $v) ($p) ($body)]) ($($def)*))
    };
    (@parse ($($arms:tt)*) () default => $body:block $($rest:tt)*) => {
        $crate::__select_internal!(@parse ($($arms)*) (now ($body)) $($rest)*)
    };
    (@parse ($($arms:tt)*) () default => $body:expr , $($rest:tt)*) => {
        $crate::__select_internal!(@parse ($($arms)*) (now ($body)) $($rest)*)
    };
    (@parse ($($arms:tt)*) () default => $body:expr) => {
        $crate::__select_internal!(@parse ($($arms)*) (now ($body)))
    };
    (@parse ($($arms:tt)*) () default($t:expr) => $body:block $($rest:tt)*) => {
        $crate::__select_internal!(@parse ($($arms)*) (after ($t) ($body)) $($rest)*)
    };
    (@parse ($($arms:tt)*) () default($t:expr) => $body:expr , $($rest:tt)*) => {
        $crate::__select_internal!(@parse ($($arms)*) (after ($t) ($body)) $($rest)*)
    };
    (@parse ($($arms:tt)*) () default($t:expr) => $body:expr) => {
        $crate::__select_internal!(@parse ($($arms)*) (after ($t) ($body)))
    };
    (@parse ($($arms:tt)*) ($($def:tt)+) default $($rest:tt)*) => {
        compile_error!("select! takes at most one `default` arm")
    };
    (@parse ($($arms:tt)*) ($($def:tt)*) $($rest:tt)+) => {
        compile_error!("select! arms are `recv(r) -> res => body`, `send(s, v) -> res => body`, `default => body` or `default(timeout) => body`")
    };

    // ---- code generation ----
    (@emit ($($arms:tt)*) ($($def:tt)*)) => {{
        let mut __select = $crate::Select::new();
        $crate::__select_internal!(@register __select $($arms)*);
        $crate::__select_internal!(@run __select ($($arms)*) ($($def)*))
    }};

    (@register $sel:ident) => {};
    (@register $sel:ident [recv $h:ident $i:ident ($r:expr) ($p:pat) ($body:expr)] $($rest:tt)*) => {
        let $h = &$r;
        let $i = $sel.recv($h);
        $crate::__select_internal!(@register $sel $($rest)*);
    };
    (@register $sel:ident [send $h:ident $i:ident ($s:expr, $v:expr) ($p:pat) ($body:expr)] $($rest:tt)*) => {
        let $h = &$s;
        let $i = $sel.send_value($h, $v);
        $crate::__select_internal!(@register $sel $($rest)*);
    };

    (@run $sel:ident ($($arms:tt)*) ()) => {{
        let __oper = $sel.select();
        let __index = __oper.index();
        $crate::__select_internal!(@dispatch __oper __index $($arms)*)
    }};
    (@run $sel:ident ($($arms:tt)*) (now ($default:expr))) => {
        match $sel.try_select() {
            ::std::result::Result::Ok(__oper) => {
                let __index = __oper.index();
                $crate::__select_internal!(@dispatch __oper __index $($arms)*)
            }
            ::std::result::Result::Err(_) => {
                drop($sel);
                $default
            }
        }
    };
    (@run $sel:ident ($($arms:tt)*) (after ($t:expr) ($default:expr))) => {
        match $sel.select_timeout($t) {
            ::std::result::Result::Ok(__oper) => {
                let __index = __oper.index();
                $crate::__select_internal!(@dispatch __oper __index $($arms)*)
            }
            ::std::result::Result::Err(_) => {
                drop($sel);
                $default
            }
        }
    };

    (@dispatch $o:ident $idx:ident) => {
        unreachable!("select! returned an operation it did not register")
    };
    (@dispatch $o:ident $idx:ident [recv $h:ident $i:ident ($r:expr) ($p:pat) ($body:expr)] $($rest:tt)*) => {
        if $idx == $i {
            let $p = $o.recv($h);
            $body
        } else {
            $crate::__select_internal!(@dispatch $o $idx $($rest)*)
        }
    };
    (@dispatch $o:ident $idx:ident [send $h:ident $i:ident ($s:expr, $v:expr) ($p:pat) ($body:expr)] $($rest:tt)*) => {
        if $idx == $i {
            let $p = $o.send_result($h);
            $body
        } else {
            $crate::__select_internal!(@dispatch $o $idx $($rest)*)
        }
    };
}
