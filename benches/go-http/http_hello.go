// The http_hello server written with Go's net/http, for `cargo xtask
// loadtest`: same body and headers as the Rust servers.
//
//	go build -o http_hello_go benches/go/http_hello.go && ./http_hello_go -addr 127.0.0.1:8082
package main

import (
	"flag"
	"log"
	"net/http"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8082", "listen address")
	flag.Parse()
	body := []byte("Hello, world!")
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", "13")
		w.Write(body)
	})
	log.Printf("http_hello_go: listening on http://%s", *addr)
	log.Fatal(http.ListenAndServe(*addr, nil))
}
