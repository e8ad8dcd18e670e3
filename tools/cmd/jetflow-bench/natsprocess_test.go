package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

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
	err := run(t.Context(), []string{"-nats-process", "-executions", "20", "-concurrency", "5", "-single", "2", "-single1", "2",
		"-sleepers", "20", "-sleepers-settle", "1s", "-data", t.TempDir()}, &out)
	t.Log(out.String())
	require.NoError(t, err)
	s := out.String()
	require.Contains(t, s, "JetStream in a process of its own (-nats-process)")
	require.Contains(t, s, "with the read models caught up", "the projector's lag is read through JetStream")
	require.Regexp(t, `CPU +[0-9.]+m?s user\+system`, s)
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

// TestNATSChildAnswers: the server process answers its requests, says
// what it does not know, and stops when its input ends.
func TestNATSChildAnswers(t *testing.T) {
	t.Parallel()
	child, err := startNATSChild(t.Context(), natsChildConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	defer child.stop()
	require.True(t, strings.HasPrefix(child.hello.URL, "nats://127.0.0.1:"), child.hello.URL)
	require.NotEmpty(t, child.hello.AuthDir, "secure by default")
	st, err := child.ask("cpu")
	require.NoError(t, err)
	require.Positive(t, st.CPU)
	st, err = child.ask("footprint")
	require.NoError(t, err)
	require.Positive(t, st.Heap)
	require.Positive(t, st.Goroutines)
	require.NoError(t, child.heapProfile(t.TempDir()+"/heap.pprof"))
	require.ErrorContains(t, child.heapProfile(t.TempDir()+"/no/such/dir/heap.pprof"), "no such file or directory")
	_, err = child.ask("nonsense")
	require.Error(t, err, "an unknown request stops it")
	child.stop()
	require.NotNil(t, child.cmd.ProcessState, "it has exited")
	require.False(t, child.cmd.ProcessState.Success(), "with an error, for the unknown request")
}
