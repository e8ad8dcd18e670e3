package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMain makes the test binary the NATS server process when it is
// started as one (-nats-process starts this binary again).
func TestMain(m *testing.M) {
	if spec := os.Getenv(natsChildEnv); spec != "" {
		if err := runNATSChild(spec, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "NATS server process:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestNATSProcess runs the throughput and sleepers runs, small, with
// nats-server in a process of its own: the services reach it (every
// execution ends, every sleeper sleeps), the projector's lag is read
// through JetStream (the throughput run waits for the read models), the
// CPU counts both processes, the footprint says the server process's
// part, and the server process is gone once the run returns.
func TestNATSProcess(t *testing.T) {
	var out bytes.Buffer
	err := run(t.Context(), []string{"-nats-process", "-by-connection", "-executions", "20", "-concurrency", "5", "-single", "2", "-single1", "2",
		"-sleepers", "20", "-sleepers-settle", "1s", "-data", t.TempDir()}, &out)
	t.Log(out.String())
	require.NoError(t, err)
	s := out.String()
	require.Contains(t, s, "JetStream in a process of its own (-nats-process)")
	require.Contains(t, s, "with the read models caught up", "the projector's lag is read through JetStream")
	require.Regexp(t, `CPU +[0-9.]+m?s user\+system in both processes`, s)
	msgs := regexp.MustCompile(`NATS messages +([0-9.]+) in and ([0-9.]+) out of the server per step`).FindStringSubmatch(s)
	require.Len(t, msgs, 3, "read from the server process")
	in, err := strconv.ParseFloat(msgs[1], 64)
	require.NoError(t, err)
	require.Positive(t, in, "the server process counted the steps' messages")
	require.Regexp(t, `messages per step by connection[^\n]*\n(?: +jetflow-[a-z]+ +[0-9.]+ / +[0-9.]+\n)*? +jetflow-dispatcher +[1-9][0-9]*\.[0-9]+ /`, s,
		"-by-connection, from the server process: the dispatcher sent messages")
	require.Contains(t, s, "(every figure below is the sum of this process's and the NATS server process's, -nats-process)")
	m := regexp.MustCompile(`of which NATS +RSS ([0-9.]+) MiB → ([0-9.]+) MiB, heap in use ([0-9.]+) MiB`).FindStringSubmatch(s)
	require.Len(t, m, 4, "the server process's part of the footprint")
	rss, err := strconv.ParseFloat(m[2], 64)
	require.NoError(t, err)
	require.Positive(t, rss, "the server process's RSS")
	total := regexp.MustCompile(`RSS +[0-9.]+ MiB before, ([0-9.]+) MiB after`).FindStringSubmatch(s)
	require.Len(t, total, 2)
	all, err := strconv.ParseFloat(total[1], 64)
	require.NoError(t, err)
	require.Greater(t, all, rss, "the RSS counts both processes")
	require.Nil(t, serverProcess, "the run forgets the server process once it stopped it")
	require.False(t, strings.Contains(s, "unknown"), "every figure is known")
}

// TestNATSChildAnswers: the server process answers its requests, holds
// its data directory, counts in cpuTime, says what it could not do, and
// stops, well, when its input ends.
func TestNATSChildAnswers(t *testing.T) {
	dir := t.TempDir()
	child, err := startNATSChild(t.Context(), natsChildConfig{DataDir: dir})
	require.NoError(t, err)
	defer child.stop()
	require.True(t, strings.HasPrefix(child.hello.URL, "nats://127.0.0.1:"), child.hello.URL)
	require.NotEmpty(t, child.hello.AuthDir, "secure by default")

	st, err := child.ask("cpu")
	require.NoError(t, err)
	require.Positive(t, st.CPU)
	own := selfCPU()
	serverProcess = child
	all := cpuTime()
	both := takeFootprint()
	serverProcess = nil
	require.GreaterOrEqual(t, all, own+st.CPU, "cpuTime counts the server process's CPU")
	require.NotNil(t, both.server, "takeFootprint asks the server process")
	require.Greater(t, both.heap, both.server.heap, "and adds this process's")
	require.Greater(t, both.goroutines, both.server.goroutines)

	st, err = child.ask("footprint")
	require.NoError(t, err)
	require.Positive(t, st.Heap)
	require.Positive(t, st.Goroutines)
	if runtime.GOOS == "linux" {
		require.Positive(t, st.RSS)
	}
	st, err = child.ask("msgs")
	require.NoError(t, err)
	require.Empty(t, st.Err)
	st, err = child.ask("conns")
	require.NoError(t, err)
	require.Empty(t, st.Err)
	require.NoError(t, child.heapProfile(t.TempDir()+"/heap.pprof"))
	require.ErrorContains(t, child.heapProfile(t.TempDir()+"/no/such/dir/heap.pprof"), "no such file or directory")

	_, err = startNATSChild(t.Context(), natsChildConfig{DataDir: dir})
	require.Error(t, err, "a second server on the same data directory is refused")

	began := time.Now()
	child.stop()
	require.NotNil(t, child.cmd.ProcessState, "it has exited")
	require.True(t, child.cmd.ProcessState.Success(), "its input ended: it stopped well, %s", child.cmd.ProcessState)
	require.Less(t, time.Since(began), 20*time.Second, "it stopped when its input ended, not killed after 30 s")

	other, err := startNATSChild(t.Context(), natsChildConfig{DataDir: dir})
	require.NoError(t, err, "the data directory is free again")
	_, err = other.ask("nonsense")
	require.Error(t, err, "an unknown request stops it")
	other.stop()
	require.False(t, other.cmd.ProcessState.Success(), "with an error, for the unknown request")
}

// TestFootprintPlus: the footprints of two processes add up; a figure
// either does not know is not known.
func TestFootprintPlus(t *testing.T) {
	t.Parallel()
	a := footprint{rss: 100, rssFile: 10, heap: 50, live: 20, goroutines: 3}
	b := footprint{rss: 40, rssFile: 4, heap: 30, live: 10, goroutines: 2}
	require.Equal(t, footprint{rss: 140, rssFile: 14, heap: 80, live: 30, goroutines: 5}, a.plus(b, true))
	unknown := a.plus(footprint{rss: -1, rssFile: 4, heap: 30}, true)
	require.Equal(t, int64(-1), unknown.rss)
	require.Equal(t, int64(14), unknown.rssFile)
	require.Equal(t, int64(-1), a.plus(b, false).rss, "the other process did not answer")
}
