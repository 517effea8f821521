//! The network examples, started in-process on ephemeral ports and checked
//! by their own self-check clients.

#[path = "../examples/echo.rs"]
mod echo;
#[path = "../examples/http_hello.rs"]
mod http_hello;

use fiber::net::TcpListener;

#[test]
fn echo_example_serves_its_self_check() {
    let rt = fiber::Runtime::builder().workers(2).build().unwrap();
    rt.block_on(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        fiber::spawn(move || echo::serve(listener));
        echo::self_check(addr, 50, 5).unwrap();
    });
}

#[test]
fn http_hello_example_serves_its_self_check() {
    let rt = fiber::Runtime::builder().workers(2).build().unwrap();
    rt.block_on(|| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        fiber::spawn(move || http_hello::serve(listener));
        http_hello::self_check(addr).unwrap();
    });
}
