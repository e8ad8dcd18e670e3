package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/tools/internal/devstack"
)

// With -nats-process the benchmark runs nats-server in a process of its
// own, as production does (the services in this one): the Go runtime's
// garbage collector of each process then marks and paces only that
// process's heap, where in one process the server's streams (its block
// buffers, subject trees and schedules) and the services' objects share
// one heap, one pace and one collection. The figures that count "all
// processes" (RSS and CPU) add the server's process to this one's.
//
// The child is this same binary, started with natsChildEnv set to its
// settings (JSON). It writes one line, its URL and auth directory, then
// answers each line it reads on its standard input ("cpu", or
// "footprint": after two collections, what it holds) with one line of
// JSON, and stops when that input ends: also when the parent dies.

// natsChildEnv names the environment variable that makes this binary the
// benchmark's NATS server process.
const natsChildEnv = "JETFLOW_BENCH_NATS_CHILD"

// natsChildConfig is the child's settings.
type natsChildConfig struct {
	DataDir      string        `json:"data_dir"`
	SyncAlways   bool          `json:"sync_always"`
	SyncInterval time.Duration `json:"sync_interval"`
	Insecure     bool          `json:"insecure"`
}

// natsChildHello is the child's first line.
type natsChildHello struct {
	URL     string `json:"url"`
	AuthDir string `json:"auth_dir"` // "" when insecure
}

// processStats is what a process says of itself: its CPU time, and (for
// "footprint") its memory as takeFootprint measures it.
type processStats struct {
	CPU        time.Duration `json:"cpu"`
	RSS        int64         `json:"rss"`
	RSSFile    int64         `json:"rss_file"`
	Heap       uint64        `json:"heap"`
	Live       uint64        `json:"live"`
	Goroutines int           `json:"goroutines"`
	// InMsgs and OutMsgs are the server's in_msgs and out_msgs ("msgs");
	// Conns its connections' messages in and out by name ("conns").
	InMsgs  int64               `json:"in_msgs,omitempty"`
	OutMsgs int64               `json:"out_msgs,omitempty"`
	Conns   map[string][2]int64 `json:"conns,omitempty"`
	Err     string              `json:"err,omitempty"` // a request that failed
}

// heapProfile has the child write its heap profile to path.
func (c *natsChild) heapProfile(path string) error {
	st, err := c.ask("heapprofile\n" + path)
	if err == nil && st.Err != "" {
		err = errors.New(st.Err)
	}
	if err != nil {
		return fmt.Errorf("the NATS server process's heap profile: %w", err)
	}
	return nil
}

// runNATSChild is the child's whole life: it serves NATS until its
// standard input ends.
func runNATSChild(spec string, stdin io.Reader, stdout io.Writer) error {
	var c natsChildConfig
	if err := json.Unmarshal([]byte(spec), &c); err != nil {
		return fmt.Errorf("%s: %w", natsChildEnv, err)
	}
	// The parent stops it (its input ends) after the services: a signal
	// to the process group (an interrupt at the terminal, a TERM from a
	// supervisor) reaches both, and the server must outlive the services'
	// own stop.
	signal.Ignore(os.Interrupt, syscall.SIGTERM)
	srv, authDir, stop, err := devstack.StartServer(devstack.Config{DataDir: c.DataDir, NATSAddr: "127.0.0.1:0",
		SyncAlways: c.SyncAlways, SyncInterval: c.SyncInterval, Insecure: c.Insecure})
	if err != nil {
		return err
	}
	defer stop()
	enc := json.NewEncoder(stdout)
	if err := enc.Encode(natsChildHello{URL: srv.ClientURL(), AuthDir: authDir}); err != nil {
		return err
	}
	in := bufio.NewScanner(stdin)
	for in.Scan() {
		var st processStats
		switch in.Text() {
		case "cpu":
			st.CPU = cpuTime()
		case "footprint":
			f := takeFootprint()
			st = processStats{CPU: cpuTime(), RSS: f.rss, RSSFile: f.rssFile, Heap: f.heap, Live: f.live, Goroutines: f.goroutines}
		case "msgs":
			v, err := srv.Varz(nil)
			if err != nil {
				st.Err = err.Error()
				break
			}
			st.InMsgs, st.OutMsgs = v.InMsgs, v.OutMsgs
		case "conns":
			conns := connMsgs(srv)
			if conns == nil {
				st.Err = "no connections' figures from the server"
				break
			}
			st.Conns = map[string][2]int64{}
			for name, c := range conns {
				st.Conns[name] = [2]int64{c.in, c.out}
			}
		case "heapprofile":
			if !in.Scan() {
				return in.Err()
			}
			runtime.GC() // the profile is as of the last collection
			if err := writeHeapProfile(in.Text()); err != nil {
				st.Err = err.Error()
			}
		default:
			return fmt.Errorf("nats child: unknown request %q", in.Text())
		}
		if err := enc.Encode(st); err != nil {
			return err
		}
	}
	return in.Err()
}

// natsChild is the parent's handle on the child.
type natsChild struct {
	cmd   *exec.Cmd
	mu    sync.Mutex // one request at a time
	in    io.WriteCloser
	out   *json.Decoder
	hello natsChildHello
}

// serverProcess is the benchmark's NATS server process, nil when the
// server runs in this one.
var serverProcess *natsChild

// startNATSChild starts the child with c and waits for its URL.
func startNATSChild(ctx context.Context, c natsChildConfig) (*natsChild, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	spec, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), natsChildEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the NATS server process: %w", err)
	}
	ch := &natsChild{cmd: cmd, in: in, out: json.NewDecoder(out)}
	hello := make(chan error, 1)
	go func() { hello <- ch.out.Decode(&ch.hello) }()
	select {
	case err = <-hello:
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(time.Minute):
		err = errors.New("no answer in a minute")
	}
	if err != nil {
		ch.stop()
		return nil, fmt.Errorf("the NATS server process: %w", err)
	}
	return ch, nil
}

// ask sends the child one request and reads its answer.
func (c *natsChild) ask(req string) (processStats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var st processStats
	if _, err := io.WriteString(c.in, req+"\n"); err != nil {
		return st, fmt.Errorf("ask the NATS server process: %w", err)
	}
	if err := c.out.Decode(&st); err != nil {
		return st, fmt.Errorf("read the NATS server process's answer: %w", err)
	}
	return st, nil
}

// stop ends the child's input, which stops it, and waits for it (it is
// killed after 30 s).
func (c *natsChild) stop() {
	_ = c.in.Close()
	done := make(chan struct{})
	go func() {
		_ = c.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// askServer asks the server process req; false when there is none, or
// it did not answer.
func askServer(req string) (processStats, bool) {
	if serverProcess == nil {
		return processStats{}, false
	}
	st, err := serverProcess.ask(req)
	return st, err == nil && st.Err == ""
}

// childCPU is the server process's CPU time, 0 when there is none, -1
// when it does not say.
func childCPU() time.Duration {
	if serverProcess == nil {
		return 0
	}
	st, ok := askServer("cpu")
	if !ok {
		return -1
	}
	return st.CPU
}

// childFootprint is the server process's footprint, and false when
// there is none or it does not say.
func childFootprint() (footprint, bool) {
	st, ok := askServer("footprint")
	return footprint{rss: st.RSS, rssFile: st.RSSFile, heap: st.Heap, live: st.Live, goroutines: st.Goroutines}, ok
}

// childMsgs is serverMsgs of the server process.
func childMsgs() msgCount {
	st, ok := askServer("msgs")
	return msgCount{in: st.InMsgs, out: st.OutMsgs, known: ok}
}

// childConns is connMsgs of the server process.
func childConns() map[string]connCount {
	st, ok := askServer("conns")
	if !ok {
		return nil
	}
	m := make(map[string]connCount, len(st.Conns))
	for name, c := range st.Conns {
		m[name] = connCount{in: c[0], out: c[1]}
	}
	return m
}

// projectorBehindJS is projectorBehind read through JetStream's API (the
// projector's consumer's info), for a server in another process.
func projectorBehindJS(ctx context.Context, js jetstream.JetStream) (uint64, bool) {
	c, err := js.Consumer(ctx, bus.StreamEvents, bus.ConsumerProjector)
	if err != nil {
		return 0, false
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, false
	}
	return info.NumPending + uint64(info.NumAckPending), true
}
