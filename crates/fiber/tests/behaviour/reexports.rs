//! The facade only re-exports the layers: its items are the layers' items.

#[test]
fn facade_items_are_the_layers_items() {
    fn same<T>(_: T, _: T) {}
    same(fiber::chan::bounded::<u8> as fn(usize) -> _, fiber_chan_bounded());
    let _: fiber::Runtime = fiber::runtime::Builder::new().workers(1).build().unwrap();
    let _: Option<fiber::Job> = None::<fiber::core::FiberRef>.and(None);
}

fn fiber_chan_bounded() -> fn(usize) -> (fiber::chan::Sender<u8>, fiber::chan::Receiver<u8>) {
    fiber::chan::bounded::<u8>
}
