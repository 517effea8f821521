// Command fiberbench runs the workloads of BENCHMARKS.md on Go's runtime,
// one measurement per process, for `cargo xtask bench`.
//
//	fiberbench <workload>
//
// prints one line `RESULT <workload> go <value> <unit> <detail>` (or
// `SKIP <workload> go <reason>`), the format of the Rust workloads binary.
// A failed check prints `CHECK FAILED: ...` to stderr and exits with
// status 1. GOMAXPROCS (set by the harness) is the worker count.
// Standard library only.
package main

import (
	"bytes"
	"compress/flate"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Sizes, the same as the Rust workloads.
const (
	w1N          = 100_000
	w3Rounds     = 1_000_000
	w4Producers  = 4
	w4Consumers  = 4
	w4PerProd    = 1_000_000
	w4Cap        = 1024
	w4Total      = w4Producers * w4PerProd
	w4Sum        = 7_999_998_000_000
	w5Tasks      = 1000
	w5Yields     = 1000
	w6N          = 100_000
	w6Sleep      = 10 * time.Millisecond
	w7N          = 100_000
	w8Len        = 67_108_864
	w8Block      = 128 * 1024
	microOps     = 200_000
	tree         = 1000
	treeRounds   = 20
	skynetLeaves = 1_000_000
	skynetSum    = 499_999_500_000
)

func check(ok bool, format string, args ...any) {
	if !ok {
		fmt.Fprintf(os.Stderr, "CHECK FAILED: "+format+"\n", args...)
		os.Exit(1)
	}
}

func warmupOn() bool { return os.Getenv("ANCHORS_WARMUP") != "0" }

// timed runs body once untimed (warm-up, unless turned off) and once timed.
func timed(body func()) time.Duration {
	if warmupOn() {
		body()
	}
	start := time.Now()
	body()
	return time.Since(start)
}

func per(d time.Duration, n int) float64 { return float64(d.Nanoseconds()) / float64(n) }

// ---- W1 spawn-join ----

// Each task marks its slot in a pre-allocated slice (Go's stand-in for a
// join handle's result) and calls wg.Done.
func w1() {
	var wg sync.WaitGroup
	ran := make([]bool, w1N)
	wg.Add(w1N)
	for i := 0; i < w1N; i++ {
		go func(i int) {
			ran[i] = true
			wg.Done()
		}(i)
	}
	wg.Wait()
	joined := 0
	for _, r := range ran {
		if r {
			joined++
		}
	}
	check(joined == w1N, "w1: %d tasks ran", joined)
}

// ---- W2 skynet ----

func skynet(num, size int64, parent chan<- int64) {
	if size == 1 {
		parent <- num
		return
	}
	ch := make(chan int64, 10)
	child := size / 10
	for i := int64(0); i < 10; i++ {
		go skynet(num+i*child, child, ch)
	}
	var sum int64
	for i := 0; i < 10; i++ {
		sum += <-ch
	}
	parent <- sum
}

func w2() {
	root := make(chan int64, 1)
	go skynet(0, skynetLeaves, root)
	sum := <-root
	check(sum == skynetSum, "skynet sum %d", sum)
}

// ---- W3 ping-pong ----

func w3() {
	a := make(chan uint64)
	b := make(chan uint64)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for x := range a {
			b <- x + 1
		}
	}()
	for i := uint64(0); i < w3Rounds; i++ {
		a <- i
		y := <-b
		check(y == i+1, "ping-pong %d != %d", y, i+1)
	}
	close(a)
	wg.Wait()
}

// ---- W4 mpmc ----

func w4() {
	ch := make(chan uint64, w4Cap)
	var prod, cons sync.WaitGroup
	prod.Add(w4Producers)
	for p := uint64(0); p < w4Producers; p++ {
		go func(p uint64) {
			defer prod.Done()
			for k := uint64(0); k < w4PerProd; k++ {
				ch <- p*1_000_000 + k
			}
		}(p)
	}
	type total struct{ count, sum uint64 }
	results := make([]total, w4Consumers)
	cons.Add(w4Consumers)
	for c := 0; c < w4Consumers; c++ {
		go func(c int) {
			defer cons.Done()
			var t total
			for v := range ch {
				t.count++
				t.sum += v
			}
			results[c] = t
		}(c)
	}
	prod.Wait()
	close(ch)
	cons.Wait()
	var t total
	for _, r := range results {
		t.count += r.count
		t.sum += r.sum
	}
	check(t.count == w4Total && t.sum == w4Sum, "mpmc count %d sum %d", t.count, t.sum)
}

// ---- W5 yield ----

func w5() {
	var wg sync.WaitGroup
	counts := make([]int, w5Tasks)
	wg.Add(w5Tasks)
	for t := 0; t < w5Tasks; t++ {
		go func(t int) {
			defer wg.Done()
			n := 0
			for i := 0; i < w5Yields; i++ {
				runtime.Gosched()
				n++
			}
			counts[t] = n
		}(t)
	}
	wg.Wait()
	total := 0
	for _, n := range counts {
		total += n
	}
	check(total == w5Tasks*w5Yields, "yields %d", total)
}

// ---- W6 timers ----

func w6() {
	var wg sync.WaitGroup
	var onTime atomic.Int64
	wg.Add(w6N)
	for i := 0; i < w6N; i++ {
		go func() {
			defer wg.Done()
			t0 := time.Now()
			time.Sleep(w6Sleep)
			if time.Since(t0) >= w6Sleep {
				onTime.Add(1)
			}
		}()
	}
	wg.Wait()
	check(onTime.Load() == w6N, "%d early wakes", w6N-onTime.Load())
}

// ---- W7 parked memory ----

func statusKiB(field string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	check(err == nil, "/proc/self/status: %v", err)
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, field) {
			f := strings.Fields(line)
			if len(f) >= 2 {
				v, _ := strconv.ParseInt(f[1], 10, 64)
				return v
			}
		}
	}
	return 0
}

func w7() float64 {
	baseline := statusKiB("VmRSS:")
	var parked atomic.Int64
	chans := make([]chan uint64, w7N)
	results := make([]uint64, w7N)
	var wg sync.WaitGroup
	wg.Add(w7N)
	for i := 0; i < w7N; i++ {
		ch := make(chan uint64, 1)
		chans[i] = ch
		go func(i int) {
			defer wg.Done()
			parked.Add(1)
			results[i] = <-ch
		}(i)
	}
	for parked.Load() < w7N {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	peak := statusKiB("VmHWM:")
	for i, ch := range chans {
		ch <- uint64(i)
	}
	wg.Wait()
	var sum uint64
	for _, v := range results {
		sum += v
	}
	check(sum == uint64(w7N)*uint64(w7N-1)/2, "w7 sum %d", sum)
	return float64(peak-baseline) / w7N
}

// ---- W8 cpu-parallel ----

func w8Input() []byte {
	words := [16]string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
		"india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa"}
	buf := make([]byte, 0, w8Len+32)
	x := uint64(0x9E3779B97F4A7C15)
	for len(buf) < w8Len {
		x = x*6364136223846793005 + 1442695040888963407
		r := x >> 33
		buf = append(buf, words[r&15]...)
		if (r>>4)&7 == 0 {
			buf = strconv.AppendUint(buf, (r>>7)%10000, 10)
		}
		if (r>>20)&15 == 0 {
			buf = append(buf, '\n')
		} else {
			buf = append(buf, ' ')
		}
	}
	buf = buf[:w8Len]
	h := uint64(0xcbf29ce484222325)
	for _, b := range buf {
		h ^= uint64(b)
		h *= 0x100000001b3
	}
	check(h == 0x821c05d5ef1e7ac8, "w8 input FNV-1a %#x", h)
	return buf
}

func deflate(block []byte) []byte {
	var out bytes.Buffer
	w, err := flate.NewWriter(&out, 6)
	check(err == nil, "flate writer: %v", err)
	_, err = w.Write(block)
	check(err == nil, "deflate: %v", err)
	check(w.Close() == nil, "deflate close")
	return out.Bytes()
}

func w8Run(input []byte) [][]byte {
	n := (len(input) + w8Block - 1) / w8Block
	out := make([][]byte, n)
	var wg sync.WaitGroup
	wg.Add(n)
	for i := 0; i < n; i++ {
		go func(i int) {
			defer wg.Done()
			end := (i + 1) * w8Block
			if end > len(input) {
				end = len(input)
			}
			out[i] = deflate(input[i*w8Block : end])
		}(i)
	}
	wg.Wait()
	return out
}

func w8Check(input []byte, blocks [][]byte) {
	var out bytes.Buffer
	out.Grow(len(input))
	for _, b := range blocks {
		r := flate.NewReader(bytes.NewReader(b))
		_, err := io.Copy(&out, r)
		check(err == nil, "inflate: %v", err)
	}
	check(bytes.Equal(out.Bytes(), input), "w8 round trip")
}

// ---- micro rows ----

// selectK receives MICRO_OPS values through a select over k channels of
// capacity 1, one of which is ready each time (a literal select: Go needs
// a fixed case count, and reflect.Select is not what Go code writes).
func selectK(k int) time.Duration {
	chans := make([]chan uint64, 8)
	for i := range chans {
		chans[i] = make(chan uint64, 1)
	}
	c := chans
	start := time.Now()
	var got uint64
	for i := 0; i < microOps; i++ {
		c[i%k] <- uint64(i)
		var v uint64
		if k == 2 {
			select {
			case v = <-c[0]:
			case v = <-c[1]:
			}
		} else {
			select {
			case v = <-c[0]:
			case v = <-c[1]:
			case v = <-c[2]:
			case v = <-c[3]:
			case v = <-c[4]:
			case v = <-c[5]:
			case v = <-c[6]:
			case v = <-c[7]:
			}
		}
		got += v
	}
	elapsed := time.Since(start)
	check(got == uint64(microOps)*uint64(microOps-1)/2, "select sum %d", got)
	return elapsed
}

// jobCreate: per operation a child context of the scope's context, one
// goroutine, and a wait for it (WaitGroup); the closest stdlib shape of
// spawn + join in a scope.
func jobCreate() time.Duration {
	parent, cancelAll := context.WithCancel(context.Background())
	defer cancelAll()
	start := time.Now()
	n := 0
	for i := 0; i < microOps; i++ {
		ctx, cancel := context.WithCancel(parent)
		var wg sync.WaitGroup
		var result int
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ctx.Err() == nil {
				result = 1
			}
		}()
		wg.Wait()
		cancel()
		n += result
	}
	elapsed := time.Since(start)
	check(n == microOps, "job create %d", n)
	return elapsed
}

// scope1k: a WaitGroup over 1,000 goroutines, per round.
func scope1k() time.Duration {
	start := time.Now()
	var ran atomic.Int64
	for r := 0; r < treeRounds; r++ {
		var wg sync.WaitGroup
		wg.Add(tree)
		for i := 0; i < tree; i++ {
			go func() {
				ran.Add(1)
				wg.Done()
			}()
		}
		wg.Wait()
	}
	elapsed := time.Since(start)
	check(ran.Load() == tree*treeRounds, "scope1k ran %d", ran.Load())
	return elapsed
}

// cancel1k: 1,000 goroutines parked on a channel or their context; cancel
// the context and wait for all of them.
func cancel1k() time.Duration {
	start := time.Now()
	var cancelled atomic.Int64
	for r := 0; r < treeRounds; r++ {
		ctx, cancel := context.WithCancel(context.Background())
		never := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(tree)
		for i := 0; i < tree; i++ {
			go func() {
				defer wg.Done()
				select {
				case <-never:
				case <-ctx.Done():
					cancelled.Add(1)
				}
			}()
		}
		runtime.Gosched()
		cancel()
		wg.Wait()
	}
	elapsed := time.Since(start)
	check(cancelled.Load() == tree*treeRounds, "cancel1k cancelled %d", cancelled.Load())
	return elapsed
}

// ---- sync rows (fiber-sync's table rows) ----

const (
	syncUncontendedOps = 10_000_000
	syncParties        = 8
	syncContendedOps   = 100_000
	syncSemaphoreOps   = 2_000_000
	syncGroup          = 1_000
	syncGroupRounds    = 20
)

func syncUncontended() {
	var m sync.Mutex
	n := 0
	for i := 0; i < syncUncontendedOps; i++ {
		m.Lock()
		n++
		m.Unlock()
	}
	check(n == syncUncontendedOps, "sync_uncontended: %d increments", n)
}

func syncContended() {
	var m sync.Mutex
	n := 0
	var wg sync.WaitGroup
	wg.Add(syncParties)
	for p := 0; p < syncParties; p++ {
		go func() {
			defer wg.Done()
			for i := 0; i < syncContendedOps; i++ {
				m.Lock()
				n++
				m.Unlock()
			}
		}()
	}
	wg.Wait()
	check(n == syncParties*syncContendedOps, "sync_contended: lost increments (%d)", n)
}

// A buffered channel is Go's semaphore idiom.
func syncSemaphore() {
	sem := make(chan struct{}, 4)
	for i := 0; i < syncSemaphoreOps; i++ {
		sem <- struct{}{}
		<-sem
	}
	check(len(sem) == 0, "sync_semaphore: %d permits held", len(sem))
}

func syncWaitGroup() {
	var done atomic.Int64
	for r := 0; r < syncGroupRounds; r++ {
		var wg sync.WaitGroup
		wg.Add(syncGroup)
		for i := 0; i < syncGroup; i++ {
			go func() {
				done.Add(1)
				wg.Done()
			}()
		}
		wg.Wait()
	}
	check(done.Load() == syncGroup*syncGroupRounds, "sync_waitgroup: %d members done", done.Load())
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: fiberbench <w1|w2|w3|w4|w5|w6|w7|w8|select2|select8|job_create|scope1k|cancel1k>")
		os.Exit(2)
	}
	workload := os.Args[1]
	result := func(value float64, unit, detail string) {
		fmt.Printf("RESULT %s go %.3f %s %s\n", workload, value, unit, detail)
	}
	switch workload {
	case "w1":
		result(per(timed(w1), w1N), "ns/task", fmt.Sprintf("n=%d", w1N))
	case "w2":
		result(float64(timed(w2).Nanoseconds())/1e6, "ms", "1,111,111 goroutines")
	case "w3":
		result(per(timed(w3), w3Rounds), "ns/rt", "unbuffered chan")
	case "w4":
		result(float64(w4Total)/timed(w4).Seconds()/1e6, "Mmsg/s", "chan cap 1024")
	case "w5":
		result(per(timed(w5), w5Tasks*w5Yields), "ns/yield", "Gosched")
	case "w6":
		result(float64(timed(w6).Nanoseconds())/1e6, "ms", fmt.Sprintf("n=%d", w6N))
	case "w7":
		result(w7(), "KiB/task", fmt.Sprintf("n=%d", w7N))
	case "w8":
		input := w8Input()
		var blocks [][]byte
		d := timed(func() { blocks = w8Run(input) })
		w8Check(input, blocks)
		result(float64(w8Len)/d.Seconds()/1e6, "MB/s", "512 blocks")
	case "select2":
		result(per(selectK(2), microOps), "ns/op", "select stmt")
	case "select8":
		result(per(selectK(8), microOps), "ns/op", "select stmt")
	case "job_create":
		result(per(jobCreate(), microOps), "ns/job", "WaitGroup+ctx")
	case "scope1k":
		result(float64(scope1k().Nanoseconds())/1e3/treeRounds, "us", "WaitGroup")
	case "cancel1k":
		result(float64(cancel1k().Nanoseconds())/1e3/treeRounds, "us", "ctx cancel")
	case "sync_uncontended":
		result(per(timed(syncUncontended), syncUncontendedOps), "ns/op", "sync.Mutex")
	case "sync_contended":
		result(per(timed(syncContended), syncParties*syncContendedOps), "ns/op", "8 goroutines, sync.Mutex")
	case "sync_semaphore":
		result(per(timed(syncSemaphore), syncSemaphoreOps), "ns/rt", "buffered chan")
	case "sync_waitgroup":
		result(float64(timed(syncWaitGroup).Nanoseconds())/1e3/syncGroupRounds, "us", "WaitGroup")
	case "join_finished":
		fmt.Printf("SKIP %s go no join handles (WaitGroup)\n", workload)
	case "switch":
		fmt.Printf("SKIP %s go the floor is measured once\n", workload)
	default:
		fmt.Fprintf(os.Stderr, "unknown workload %s\n", workload)
		os.Exit(2)
	}
}
