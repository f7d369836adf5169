package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bojand/ghz/runner"
	"github.com/jhump/protoreflect/desc"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
)

// Fully qualified names of the methods the harness calls through ghz.
const (
	callWrite       = "filewrite.v1.FileService.Write"
	callHealthCheck = "grpc.health.v1.Health.Check"
)

// ghzRun is one ghz run: clients concurrent callers of call for duration,
// each request built by message.
type ghzRun struct {
	call     string
	addr     string
	token    string // sent as the bearer token; "" for none
	clients  int
	duration time.Duration
	// message returns request number n (0, 1, 2, ... across all clients)
	// already encoded, length-delimited (see delimited).
	message func(n int64) []byte
	// done counts completed calls, for the progress line.
	done *atomic.Int64
	// connections is how many HTTP/2 connections the clients share; 0
	// means one per client.
	connections int
}

// run drives ghz's runner for r.duration and returns its report. Calls
// still in flight when the time is up are waited for ("wait", not ghz's
// default "close", which would fail them and count them as errors).
func (r ghzRun) run(ctx context.Context, column string) (*runResult, error) {
	done := r.done
	if done == nil {
		done = new(atomic.Int64)
	}
	// started is closed when the first request is built, which is after
	// ghz has started its workers (NewRequester builds one request first,
	// before armed is set). ghz must not be stopped before that: its
	// worker ticker would then send on a channel already closed.
	var armed atomic.Bool
	var once sync.Once
	started := make(chan struct{})
	opts := []runner.Option{
		runner.WithName(column),
		runner.WithInsecure(true),
		runner.WithConcurrency(uint(r.clients)),
		// One connection per client by default, as independent clients
		// (and fio's independent jobs) have. Sharing fewer connections lets
		// HTTP/2 carry many calls per read and write syscall, which changes
		// the figures a lot on a small machine; -connections chooses.
		runner.WithConnections(uint(min(cmp.Or(r.connections, r.clients), r.clients))),
		runner.WithRunDuration(r.duration),
		runner.WithDurationStopAction("wait"),
		runner.WithTimeout(time.Minute),
		// Without these ghz builds a text/template with sprig's ~200
		// functions for every call, even for binary data: that, not the
		// service, would be what is measured.
		runner.WithDisableTemplateFuncs(true),
		runner.WithDisableTemplateData(true),
		runner.WithBinaryDataFunc(func(_ *desc.MethodDescriptor, cd *runner.CallData) []byte {
			if armed.Load() {
				once.Do(func() { close(started) })
			}
			return r.message(cd.RequestNumber)
		}),
		runner.WithDefaultCallOptions([]grpc.CallOption{
			grpc.MaxCallRecvMsgSize(math.MaxInt32),
			grpc.MaxCallSendMsgSize(math.MaxInt32),
			grpc.OnFinish(func(error) { done.Add(1) }),
		}),
	}
	if r.token != "" {
		// ghz learns the method's types by server reflection, which
		// needs the token as much as the calls do.
		md := map[string]string{"authorization": "Bearer " + r.token}
		opts = append(opts, runner.WithMetadata(md), runner.WithReflectionMetadata(md))
	}
	cfg, err := runner.NewConfig(r.call, r.addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("ghz config: %w", err)
	}
	req, err := runner.NewRequester(cfg)
	if err != nil {
		return nil, fmt.Errorf("ghz %s at %s: %w", r.call, r.addr, err)
	}
	armed.Store(true)
	var rep *runner.Report
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		rep, err = req.Run()
	}()
	// A duration run only ends when stopped, and Stop must be called once:
	// it sends on a channel that Run closes when it returns. The run's time
	// counts from its first request.
	select {
	case <-started:
	case <-finished:
	}
	timer := time.NewTimer(r.duration)
	defer timer.Stop()
	select {
	case <-timer.C:
		req.Stop(runner.ReasonTimeout)
		<-finished
	case <-ctx.Done():
		req.Stop(runner.ReasonCancel)
		<-finished
		return nil, ctx.Err()
	case <-finished:
	}
	if err != nil {
		return nil, fmt.Errorf("ghz %s at %s: %w", r.call, r.addr, err)
	}
	return fromGHZ(column, rep), nil
}

// delimited prefixes an encoded message with its length. ghz's binary data
// is parsed first as a sequence of length-delimited messages and only then
// as one bare message; a bare WriteRequest can happen to parse as a
// truncated sequence (its first tag byte read as a length), so the harness
// always sends the unambiguous form.
func delimited(msg []byte) []byte {
	b := protowire.AppendVarint(make([]byte, 0, len(msg)+binaryVarintMax), uint64(len(msg)))
	return append(b, msg...)
}

const binaryVarintMax = 10

// writeEncoder builds WriteRequests that differ only in their offset. The
// path, data and sync fields are encoded once; each call appends only the
// offset (protobuf accepts fields in any order), so that a 64 KiB body is
// not re-encoded per call and the client's CPU, which shares the machine
// with the daemon, goes to sending.
type writeEncoder struct {
	fixed []byte
}

func newWriteEncoder(path string, bs int, sync filewritev1.SyncMode) (*writeEncoder, error) {
	data := make([]byte, bs)
	for i := range data {
		data[i] = byte(i*7 + i>>8) // not all zeros, so nothing can shortcut them
	}
	fixed, err := proto.Marshal(&filewritev1.WriteRequest{Path: path, Data: data, Sync: sync})
	if err != nil {
		return nil, err
	}
	return &writeEncoder{fixed: fixed}, nil
}

// encode returns the length-delimited WriteRequest for off.
func (e *writeEncoder) encode(off int64) []byte {
	var field [binaryVarintMax + 1]byte
	f := protowire.AppendTag(field[:0], 2, protowire.VarintType)
	f = protowire.AppendVarint(f, uint64(off))
	n := len(e.fixed) + len(f)
	b := protowire.AppendVarint(make([]byte, 0, n+binaryVarintMax), uint64(n))
	b = append(b, f...)
	return append(b, e.fixed...)
}

// randomBlock picks request n's block out of blocks. It is a hash of the
// round's seed and n, not a shared random source, so that every
// configuration of a round writes the same offsets in the same order.
func randomBlock(seed uint64, n int64, blocks int64) int64 {
	// splitmix64's finalizer.
	z := seed*0x9e3779b97f4a7c15 + uint64(n) + 1
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return int64(z % uint64(blocks))
}
