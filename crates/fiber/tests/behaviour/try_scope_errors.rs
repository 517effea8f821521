//! `try_scope` compiles with the error types users reach for, with
//! children that borrow the caller's stack.

use std::fmt;

fn sum_or<E>(items: &[u32], bad: E) -> Result<u32, E>
where
    E: Send + Clone,
{
    let total = std::sync::atomic::AtomicU32::new(0);
    fiber::try_scope(|s| {
        for &x in items {
            let (total, bad) = (&total, bad.clone());
            s.spawn(move || {
                if x == 0 {
                    return Err(bad);
                }
                total.fetch_add(x, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            });
        }
        Ok(())
    })?;
    Ok(total.load(std::sync::atomic::Ordering::Relaxed))
}

#[derive(Clone, Debug, PartialEq)]
enum MyError {
    Zero,
}

impl fmt::Display for MyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("zero")
    }
}

impl std::error::Error for MyError {}

#[test]
fn try_scope_takes_str_string_enum_and_boxed_errors_with_borrowing_children() {
    fiber::run(|| {
        let data = vec![1u32, 2, 3];
        assert_eq!(sum_or(&data, "bad"), Ok(6));
        assert_eq!(sum_or(&[1, 0], "bad"), Err("bad"));
        assert_eq!(sum_or(&[1, 0], String::from("bad")), Err(String::from("bad")));
        assert_eq!(sum_or(&[0], MyError::Zero), Err(MyError::Zero));
        let local = [5u32, 0];
        // `E` inferred from the children: `&str`.
        let r = fiber::try_scope(|s| {
            s.spawn(|| if local[1] == 0 { Err("zero") } else { Ok(()) });
            Ok(())
        });
        assert_eq!(r, Err("zero"));
        let r: Result<(), Box<dyn std::error::Error + Send + Sync>> = fiber::try_scope(|s| {
            s.spawn(|| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
                if local[0] == 5 {
                    Err(Box::new(MyError::Zero))
                } else {
                    Ok(())
                }
            });
            Ok(())
        });
        assert_eq!(r.unwrap_err().to_string(), "zero");
    });
}

/// The shape a user writes first: the error type spelled out as a string
/// literal's type, children borrowing locals of the enclosing fiber.
#[test]
fn try_scope_with_an_explicit_static_str_error_and_borrowing_children() {
    fiber::run(|| {
        let mut local = vec![5u32, 0];
        local.push(7);
        let mut seen = 0u32;
        let r: Result<u32, &'static str> = fiber::try_scope(|s| {
            let a = s.spawn(|| if local[0] == 5 { Ok(local[0]) } else { Err("first") });
            let b = s.spawn(|| if local[2] == 7 { Ok(local[2]) } else { Err("third") });
            seen += 1;
            Ok(a.join().unwrap() + b.join().unwrap())
        });
        assert_eq!(r, Ok(12));
        let r: Result<(), &'static str> = fiber::try_scope(|s| {
            s.spawn(|| if local[1] == 0 { Err("zero") } else { Ok(()) });
            seen += 1;
            Ok(())
        });
        assert_eq!(r, Err("zero"));
        assert_eq!(seen, 2);
    });
}

/// The by-value `TryScope` is `Copy + Send`: a child can spawn siblings
/// through it (as with `std::thread::scope`'s `&Scope`), and their errors
/// fail the scope like any other child's.
#[test]
fn try_scope_children_spawn_through_a_copied_scope() {
    fiber::run(|| {
        let local = [1u32, 2, 3];
        let r: Result<(), &'static str> = fiber::try_scope(|s| {
            s.spawn(move || {
                for &x in &local {
                    s.spawn(move || if x == 3 { Err("three") } else { Ok(()) });
                }
                Ok(())
            });
            Ok(())
        });
        assert_eq!(r, Err("three"));
    });
}
