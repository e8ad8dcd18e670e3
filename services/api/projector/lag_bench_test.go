package projector_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/services/api/projector"
)

// BenchmarkLagAtSteadyRate measures how far the read models lag behind
// their events (the projector's OnWrite: the oldest new event's age when
// its model is written) while writers append 10-step histories at a
// steady rate, in events a millisecond, to a number of executions at
// once (one: an execution at a time, its steps back to back; 64: each
// an event every 8 to 128 ms; 1,024: each an event every 128 to 512 ms,
// slow operations). A burst of 2,400 events is there
// first, as a fan-out or a moment's pause on a busy machine brings, so
// that the projector starts in its Coalesce; the lag is taken over the
// steady part, from a second after it begins. Each case runs with the
// default Coalesce and with none (every batch projected at once), so
// that what the gathering saves shows beside what it costs:
// cpu-µs/event is the whole process's CPU (the embedded server, the
// writers and the projector) for each event appended, and events/write
// how many events a model write took.
//
//	go test -run '^$' -bench LagAtSteadyRate ./services/api/projector
func BenchmarkLagAtSteadyRate(b *testing.B) {
	cases := []struct {
		rate       float64
		executions int
	}{{1.5, 1}, {0.5, 64}, {2, 64}, {8, 64}, {2, 1024}, {8, 1024}}
	for _, c := range cases {
		for _, coalesce := range []time.Duration{0, -1} {
			name := map[bool]string{true: "default", false: "never"}[coalesce == 0]
			b.Run(fmt.Sprintf("events-per-ms=%g/executions=%d/coalesce=%s", c.rate, c.executions, name), func(b *testing.B) {
				var lags []time.Duration
				var cpu time.Duration
				var appended, written int64
				for range b.N {
					r := lagRun(b, c.rate, c.executions, coalesce)
					lags = append(lags, r.lags...)
					cpu += r.cpu
					appended += r.appended
					written += r.written
				}
				if len(lags) == 0 || appended == 0 || written == 0 {
					b.Fatalf("nothing measured: %d lags, %d events appended, %d models written", len(lags), appended, written)
				}
				slices.Sort(lags)
				at := func(q float64) float64 {
					return float64(lags[int(q*float64(len(lags)-1))]) / float64(time.Millisecond)
				}
				b.ReportMetric(at(0.5), "lag-p50-ms")
				b.ReportMetric(at(0.9), "lag-p90-ms")
				b.ReportMetric(at(0.99), "lag-p99-ms")
				b.ReportMetric(float64(cpu.Microseconds())/float64(appended), "cpu-µs/event")
				b.ReportMetric(float64(appended)/float64(written), "events/write")
				b.ReportMetric(float64(appended)/float64(b.N)/float64((lagSteady-lagFrom).Milliseconds()), "events/ms")
			})
		}
	}
}

// lagSteady is how long the writers write at the rate, and lagFrom when
// the measuring begins.
const (
	lagSteady = 4 * time.Second
	lagFrom   = time.Second
)

type lagResult struct {
	lags              []time.Duration
	cpu               time.Duration
	appended, written int64
}

func lagRun(b *testing.B, rate float64, executions int, coalesce time.Duration) lagResult {
	b.Helper()
	_, js := natstest.Connect(b, natstest.RunJetStream(b))
	p, err := projector.New(b.Context(), js, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	p.Coalesce = coalesce
	var (
		mu       sync.Mutex
		measured bool
		lags     []time.Duration
		written  atomic.Int64
	)
	p.OnWrite = func(lag time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if measured {
			lags = append(lags, lag)
			written.Add(1)
		}
	}
	// The burst: 2,400 events of 200 executions, there when the projector
	// starts: its first batches are big ones.
	for i := range 200 {
		id := "burst-" + strconv.Itoa(i)
		appendPipelined(b, js, "wf", id, 0, stepsPayloads(id, 2)...)
	}
	natstest.Serve(b, p.Run)
	ctx, cancel := context.WithTimeout(b.Context(), lagSteady)
	defer cancel()
	began := time.Now()
	var cpuFrom time.Duration
	var appended atomic.Int64
	var wg sync.WaitGroup
	every := time.Duration(float64(executions) / rate * float64(time.Millisecond))
	for w := range executions {
		wg.Go(func() {
			// Spread over the period, so that the rate is steady.
			select {
			case <-time.After(every * time.Duration(w) / time.Duration(executions)):
			case <-ctx.Done():
				return
			}
			tick := time.NewTicker(every)
			defer tick.Stop()
			for n := 0; ; n++ {
				id := "w" + strconv.Itoa(w) + "-" + strconv.Itoa(n)
				ps, last := stepsPayloads(id, 10), uint64(0)
				for _, pl := range ps {
					select {
					case <-tick.C:
					case <-ctx.Done():
						return
					}
					ev := events.New("bench", id, "wf", time.Now(), pl)
					ev.PrevSeq = last
					seq, err := history.Append(ctx, js, bus.ExecutionSubject("wf", id), last, ev)
					if err != nil {
						if ctx.Err() == nil {
							b.Error(err)
						}
						return
					}
					last = seq
					if time.Since(began) >= lagFrom {
						appended.Add(1)
					}
				}
			}
		})
	}
	select {
	case <-time.After(lagFrom):
	case <-ctx.Done():
	}
	mu.Lock()
	measured = true
	mu.Unlock()
	cpuFrom = processCPU(b)
	wg.Wait()
	cpu := processCPU(b) - cpuFrom
	mu.Lock()
	measured = false
	out := lagResult{lags: slices.Clone(lags), cpu: cpu, appended: appended.Load(), written: written.Load()}
	mu.Unlock()
	return out
}

// processCPU is the CPU, user and system, this process has used.
func processCPU(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
