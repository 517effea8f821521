//! `fiber::sync` is fiber-sync: its items are the layer's items.

#[test]
fn facade_sync_is_fiber_sync() {
    fn same<T>(_: T, _: T) {}
    same(fiber::sync::Mutex::new(1u8), fiber_sync::Mutex::new(1u8));
    let total = fiber::run(|| {
        let m = std::sync::Arc::new(fiber::sync::Mutex::new(0u32));
        let wg = fiber::sync::WaitGroup::new();
        for _ in 0..10 {
            let (m, wg) = (m.clone(), wg.clone());
            fiber::spawn(move || {
                let mut g = m.lock().unwrap();
                fiber::sleep(std::time::Duration::from_micros(50)).unwrap();
                *g += 1;
                drop(wg);
            });
        }
        wg.wait();
        let v = *m.lock().unwrap();
        v
    });
    assert_eq!(total, 10);
}
