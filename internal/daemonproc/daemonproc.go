// Package daemonproc builds the filewrite daemon and runs it as a child
// process on ports the kernel picks, learning them from the daemon's
// listening records (ParseListening). The tests that run the real binary
// (service, deploy, loadtest) and the load harness start it this way. It
// imports no package of the daemon's and nothing for tests only.
package daemonproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// modulePath is the filewrite module, whose root holds the daemon's main
// package.
const modulePath = "github.com/filewrite/filewrite"

// ModuleRoot is the root directory of the filewrite checkout the daemon is
// built from: the main module when the working directory is in it, or
// where a module that requires it (the load harness's, through its
// replace directive) finds it.
func ModuleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", modulePath).Output()
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		var stderr string
		if ee, ok := errors.AsType[*exec.ExitError](err); ok {
			stderr = strings.TrimSpace(string(ee.Stderr))
		}
		return "", fmt.Errorf("finding the %s checkout (run from inside it): go list -m: %v %s", modulePath, err, stderr)
	}
	return dir, nil
}

// Build compiles the daemon (the main package at the module root) into
// dir, with the race detector if race, and returns the binary's absolute
// path.
func Build(ctx context.Context, dir string, race bool) (string, error) {
	root, err := ModuleRoot(ctx)
	if err != nil {
		return "", err
	}
	bin, err := filepath.Abs(filepath.Join(dir, "filewrite"))
	if err != nil {
		return "", err
	}
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	build := exec.CommandContext(ctx, "go", append(args, ".")...)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build of the daemon: %w\n%s", err, out)
	}
	return bin, nil
}

// Process is a daemon started by Start. Its methods are safe for
// concurrent use.
type Process struct {
	// GRPCAddr and HTTPAddr are the addresses it logged; HTTPAddr is ""
	// when its flags turn the gateway off.
	GRPCAddr, HTTPAddr string

	cmd *exec.Cmd
	// exited is closed once the process has been waited for; err is then
	// what exec.Cmd.Wait returned.
	exited chan struct{}
	err    error
}

// Start runs the daemon binary bin with args and returns once it has
// logged the address of its gRPC listener and, unless args turn the
// gateway off (--http-addr ""), of its HTTP one; args should ask for port
// 0 where the caller cannot know a free port. Each line the daemon writes
// to standard error is copied to log for as long as it runs.
//
// The process outlives ctx, which bounds only the wait for the addresses:
// if ctx ends first, or the daemon exits before logging them, Start kills
// it and says so.
func Start(ctx context.Context, bin string, args []string, log io.Writer) (*Process, error) {
	return StartEnv(ctx, bin, args, nil, log)
}

// StartEnv is Start with env ("NAME=value") added to the environment the
// daemon inherits; a name in env wins over the same one inherited.
func StartEnv(ctx context.Context, bin string, args, env []string, log io.Writer) (*Process, error) {
	p := &Process{cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	if len(env) > 0 {
		// exec.Cmd keeps the last value of a name that appears twice.
		p.cmd.Env = append(os.Environ(), env...)
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the daemon: %w", err)
	}
	// Closed when standard error ends; a record past the two it can hold
	// is dropped rather than stop the copying of the log.
	found := make(chan Listener, 2)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			log.Write(append(sc.Bytes(), '\n'))
			if l, ok := ParseListening(sc.Text()); ok {
				select {
				case found <- l:
				default:
				}
			}
		}
		close(found)
		io.Copy(log, stderr) // after a line too long to scan
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	wantHTTP := wantsHTTP(args)
	for p.GRPCAddr == "" || (wantHTTP && p.HTTPAddr == "") {
		select {
		case l, ok := <-found:
			if !ok {
				// Standard error ended, or a line was too long to scan
				// and the daemon runs on: either way it exits or ctx ends.
				found = nil
				continue
			}
			if l.Protocol == "grpc" {
				p.GRPCAddr = l.Addr
			} else {
				p.HTTPAddr = l.Addr
			}
		case <-p.exited:
			return nil, fmt.Errorf("the daemon exited while Start waited for its addresses: %v", p.err)
		case <-ctx.Done():
			p.Kill()
			<-p.exited
			return nil, fmt.Errorf("the daemon logged no listening addresses: %w", ctx.Err())
		}
	}
	return p, nil
}

// wantsHTTP reports whether args, a daemon's flags, give it an HTTP
// address: the last --http-addr wins.
func wantsHTTP(args []string) bool {
	want := true // the daemon's default
	for i, a := range args {
		switch {
		case a == "--http-addr" && i+1 < len(args):
			want = args[i+1] != ""
		case strings.HasPrefix(a, "--http-addr="):
			want = a != "--http-addr="
		}
	}
	return want
}

// Pid is the process's ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Kill ends the process with SIGKILL, as a crash would.
func (p *Process) Kill() error { return p.cmd.Process.Kill() }

// Exited is closed once the process has exited and been waited for.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Wait waits for the process to exit and returns what exec.Cmd.Wait did:
// nil for exit status 0.
func (p *Process) Wait() error {
	<-p.exited
	return p.err
}

// Stop asks the daemon to drain (SIGTERM), as an operator would, kills it
// if it has not exited after grace, and returns what Wait does. A daemon
// that exits non-zero after SIGTERM failed its final sync.
func (p *Process) Stop(grace time.Duration) error {
	select {
	case <-p.exited:
	default:
		p.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(grace):
			p.Kill()
			<-p.exited
		}
	}
	return p.err
}
