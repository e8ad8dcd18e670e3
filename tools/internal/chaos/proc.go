package chaos

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Process is a program run as its own process, which a chaos run SIGKILLs
// and starts again. Its output goes to Log. Start, Kill and Stop are
// called from one goroutine; Signal may be called from any.
type Process struct {
	// Name names the process in logs and reports.
	Name string
	// Path is the program; Args and Env (added to the environment) its
	// arguments and settings.
	Path string
	Args []string
	Env  []string
	// Log receives the program's output (nil: discarded). One with a
	// Flush method is flushed when the process has exited.
	Log io.Writer

	cmd    *exec.Cmd
	exited chan struct{}
	mu     sync.Mutex
	proc   *os.Process
	// Starts and Kills count the starts and the SIGKILLs.
	Starts, Kills int
}

// Start starts the program.
func (p *Process) Start() error {
	p.Starts++
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Env = append(os.Environ(), p.Env...)
	w := p.Log
	if w == nil {
		w = io.Discard
	}
	if p.Log != nil {
		fmt.Fprintf(w, "--- %s start %d\n", p.Name, p.Starts)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		if f, ok := w.(interface{ Flush() }); ok {
			f.Flush()
		}
		close(exited)
	}()
	p.mu.Lock()
	p.cmd, p.exited, p.proc = cmd, exited, cmd.Process
	p.mu.Unlock()
	return nil
}

// Running reports whether the process started last still runs.
func (p *Process) Running() bool {
	if p.exited == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// ErrExited is returned by [Process.Kill] for a process that had already
// ended by itself: a crash that the chaos did not cause.
var ErrExited = errors.New("chaos: process exited by itself")

// Kill SIGKILLs the process and waits until it is gone.
func (p *Process) Kill() error {
	if !p.Running() {
		return fmt.Errorf("%s (start %d): %w: %v", p.Name, p.Starts, ErrExited, p.state())
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	return p.Killed()
}

// Signal sends sig to the running process (from any goroutine).
func (p *Process) Signal(sig os.Signal) error {
	p.mu.Lock()
	proc := p.proc
	p.mu.Unlock()
	if proc == nil {
		return fmt.Errorf("%s: not started", p.Name)
	}
	return proc.Signal(sig)
}

// Wait waits at most d for the process to exit by itself (after a
// signal that ends it gracefully), and reports whether it did.
func (p *Process) Wait(d time.Duration) bool {
	select {
	case <-p.exited:
		return true
	case <-time.After(d):
		return false
	}
}

// Killed waits until the process, sent SIGKILL, is gone, and checks that
// the SIGKILL ended it.
func (p *Process) Killed() error {
	<-p.exited
	ws, _ := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return fmt.Errorf("%s (start %d): %w before the kill: %v", p.Name, p.Starts, ErrExited, p.cmd.ProcessState)
	}
	p.Kills++
	return nil
}

func (p *Process) state() string {
	if p.cmd == nil || p.cmd.ProcessState == nil {
		return "not started"
	}
	return p.cmd.ProcessState.String()
}

// Stop ends the process: SIGTERM, then SIGKILL after grace.
func (p *Process) Stop(grace time.Duration) {
	if !p.Running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}
