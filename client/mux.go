package client

import (
	"context"
	"errors"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	filewritev1 "github.com/filewrite/filewrite/api/filewrite/v1"
	"github.com/filewrite/filewrite/internal/shard"
	"github.com/filewrite/filewrite/internal/streamwire"
)

// With WithSharedStreams, the fileStreams of a Client's paths do not each
// open a WriteStream: each declares its file on a muxStream, a WriteStream
// of declared files (docs/streaming.md) shared by up to filesPerStream
// paths that have one owner daemon. A fileStream keeps its own queue,
// sender, retries and lifetimes as without sharing; its streamConn is its
// index on the muxStream, and the muxStream's one receiver hands each ack
// to its file by the index its id carries: a file's write ids are its
// index << 32 plus a count (which would meet the next index's only after
// 2^32 writes to one file on one stream). A send that fails, or the
// stream's end, breaks every file on it: each goes on as its own broken
// stream would (fileStream.ended), re-declaring its file, which must then
// exist, on another muxStream.
//
// Locks: see the package doc; muxStream.mu is taken alone.

// muxStream is one WriteStream of declared files.
type muxStream struct {
	c      *Client
	owner  string
	stream grpc.BidiStreamingClient[filewritev1.WriteStreamRequest, filewritev1.WriteStreamResponse]
	cancel context.CancelFunc
	// users counts the files on it, declared or being declared; guarded
	// by Client.mu.
	users int
	// sendMu serialises SendMsg, which gRPC allows one caller at a time.
	sendMu chan struct{}

	// mu guards the fields below.
	mu sync.Mutex
	// members are the files on the stream, by index; opening the
	// declarations not yet answered.
	members   map[uint32]*streamConn
	opening   map[uint32]chan error
	nextIndex uint32
	// broken: the stream ended; err says why.
	broken bool
	err    error
}

// ownerOf is the daemon that owns path, as the ring of WithTargets picks
// it; "" with one target, or when the client cannot know it.
func (c *Client) ownerOf(path string) string {
	if c.owners == nil {
		return ""
	}
	return c.owners.Owner(path)
}

// ownersOf is the ring ownerOf asks, built once; nil with fewer than two
// targets.
func ownersOf(targets []string) *shard.Owners {
	if len(targets) < 2 {
		return nil
	}
	return shard.NewOwners(targets)
}

// sharing reports whether the Client puts several paths on one stream:
// WithSharedStreams, and an owner that the client can compute (not over
// WithRingHash, whose members the resolver alone knows).
func (c *Client) sharing() bool {
	return c.opts.filesPerStream > 0 && !c.opts.ringHash
}

// declareShared declares s's file in mode on a muxStream to its path's
// owner with room for one more file: one of the open ones, or a new one,
// routed by the path. The file is a user of it from then on. It returns
// once the declaration is sent; await has the daemon's answer. ctx bounds
// opening a new stream.
func (c *Client) declareShared(ctx context.Context, s *fileStream, mode filewritev1.OpenMode, cond *int64) (*streamConn, chan error, error) {
	path := s.path
	owner := c.ownerOf(path)
	c.mu.Lock()
	for {
		var best *muxStream
		for _, m := range c.muxes[owner] {
			if m.users < c.opts.filesPerStream && (best == nil || m.users < best.users) {
				best = m
			}
		}
		if best != nil {
			best.users++
			c.mu.Unlock()
			return best.declare(s, mode, cond)
		}
		// One new stream at a time per owner: callers that find no room
		// while one opens wait for it, rather than each open one.
		opening := c.muxOpening[owner]
		if opening == nil {
			break
		}
		c.mu.Unlock()
		select {
		case <-opening:
		case <-ctx.Done():
			return nil, nil, wrapErr(ctx.Err())
		}
		c.mu.Lock()
	}
	opened := make(chan struct{})
	c.muxOpening[owner] = opened
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.muxOpening, owner)
		c.mu.Unlock()
		close(opened)
	}()
	mctx, cancel := context.WithCancel(c.outgoing(c.ctx, path))
	stop := context.AfterFunc(ctx, cancel)
	stream, err := c.api.WriteStream(mctx, c.streamCallOptions()...)
	if !stop() && err != nil {
		err = ctx.Err()
	}
	if err != nil {
		cancel()
		return nil, nil, wrapErr(err)
	}
	m := &muxStream{c: c, owner: owner, stream: stream, cancel: cancel, users: 1, sendMu: make(chan struct{}, 1),
		members: map[uint32]*streamConn{}, opening: map[uint32]chan error{}}
	go m.receive()
	// The daemon checks the stream's routing header against its first
	// file: declare it before another file can join.
	conn, answer, err := m.declare(s, mode, cond)
	if err != nil {
		return nil, nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		cancel()
		return nil, nil, errClientClosed
	}
	// Added before muxOpening is cleared (deferred): a caller woken by
	// it finds the stream.
	c.muxes[owner] = append(c.muxes[owner], m)
	c.mu.Unlock()
	return conn, answer, nil
}

// releaseLocked drops a user of m; the last closes the stream.
//
// Preconditions: c.mu is held.
func (m *muxStream) releaseLocked() (last bool) {
	m.users--
	if m.users > 0 {
		return false
	}
	m.removeLocked()
	return true
}

// removeLocked takes m out of its Client's pool.
//
// Preconditions: c.mu is held.
func (m *muxStream) removeLocked() {
	list := m.c.muxes[m.owner]
	for i, v := range list {
		if v == m {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(m.c.muxes, m.owner)
	} else {
		m.c.muxes[m.owner] = list
	}
}

// release drops a user of m, half-closing the stream after the last.
func (m *muxStream) release() {
	m.c.mu.Lock()
	last := m.releaseLocked()
	m.c.mu.Unlock()
	if last {
		m.lockSend()
		m.stream.CloseSend()
		m.unlockSend()
	}
}

func (m *muxStream) lockSend()   { m.sendMu <- struct{}{} }
func (m *muxStream) unlockSend() { <-m.sendMu }

// send sends req; a failure breaks the stream (its receiver then ends
// every file on it).
func (m *muxStream) send(req any) error {
	m.lockSend()
	err := m.stream.SendMsg(req)
	m.unlockSend()
	if err != nil && !errors.Is(err, io.EOF) {
		// io.EOF says the daemon ended the stream: the receiver gets why
		// from Recv, which cancelling could turn into CANCELLED.
		m.cancel()
	}
	return err
}

// declare sends the declaration of s's file on m in mode, on the
// condition cond on its generation (nil: none): its streamConn once await
// has the daemon's answer. m's user is s's from then on; on error it is
// given back.
func (m *muxStream) declare(s *fileStream, mode filewritev1.OpenMode, cond *int64) (*streamConn, chan error, error) {
	answer := make(chan error, 1)
	m.mu.Lock()
	if m.broken {
		err := m.err
		m.mu.Unlock()
		m.release()
		return nil, nil, err
	}
	m.nextIndex++
	index := m.nextIndex
	conn := &streamConn{mux: m, index: index, s: s, cancel: m.cancel, inflight: make(map[uint64]*write),
		nextID: uint64(index) << 32, done: make(chan struct{})}
	m.members[index] = conn
	m.opening[index] = answer
	m.mu.Unlock()
	f := streamwire.File{Index: index, Path: s.path, OpenMode: int32(mode), If: streamwire.Conditions{IfMatch: cond}}
	b := streamwire.AppendFile(nil, &f)
	if err := m.send(&encodedRequest{data: mem.BufferSlice{mem.SliceBuffer(b)}}); err != nil && !errors.Is(err, io.EOF) {
		m.detach(conn)
		return nil, nil, wrapErr(err)
	}
	// io.EOF from Send means the daemon ended the stream (a refused
	// token, say): the receiver gets why from Recv and answers the
	// declaration with it (ended), as handshake does for a stream of its
	// own.
	return conn, answer, nil
}

// await waits for the daemon's answer to conn's declaration (bounded by
// ctx): conn, or why the file could not be opened, its user of m given
// back.
func (m *muxStream) await(ctx context.Context, conn *streamConn, answer chan error) (*streamConn, error) {
	var err error
	select {
	case err = <-answer:
	case <-ctx.Done():
		err = wrapErr(ctx.Err())
	}
	if err != nil {
		m.detach(conn)
		return nil, err
	}
	return conn, nil
}

// detach takes conn off m: the daemon closes its file once the writes it
// read are acked. It gives back conn's user of m.
func (m *muxStream) detach(conn *streamConn) {
	m.mu.Lock()
	delete(m.members, conn.index)
	delete(m.opening, conn.index)
	broken := m.broken
	m.mu.Unlock()
	if !broken {
		b := streamwire.AppendClose(nil, conn.index)
		m.send(&encodedRequest{data: mem.BufferSlice{mem.SliceBuffer(b)}})
	}
	m.release()
}

// receive reads m's responses until it ends: it answers declarations and
// hands each ack to its file's stream.
func (m *muxStream) receive() {
	var resp ackResponse
	for {
		if err := m.stream.RecvMsg(&resp); err != nil {
			m.ended(err)
			return
		}
		for _, f := range resp.files {
			m.mu.Lock()
			answer := m.opening[f.index]
			conn := m.members[f.index]
			delete(m.opening, f.index)
			m.mu.Unlock()
			if answer != nil {
				if f.err == nil && conn != nil {
					conn.s.gen.Store(f.gen)
				}
				answer <- f.err
			}
		}
		// One lookup per run of acks of one file, and one hold of its
		// stream's lock: a response mostly acks the writes of few files.
		for i := 0; i < len(resp.acks); {
			index := uint32(resp.acks[i].id >> 32)
			j := i + 1
			for j < len(resp.acks) && uint32(resp.acks[j].id>>32) == index {
				j++
			}
			m.mu.Lock()
			conn := m.members[index]
			m.mu.Unlock()
			if conn != nil {
				conn.s.acked(conn, resp.acks[i:j])
			}
			i = j
		}
	}
}

// ended breaks m: its declarations fail, and each of its files goes on as
// after its own stream's end.
func (m *muxStream) ended(err error) {
	m.cancel()
	m.c.mu.Lock()
	m.removeLocked()
	m.c.mu.Unlock()
	m.mu.Lock()
	m.broken = true
	if errors.Is(err, io.EOF) {
		m.err = wrapErr(status.Error(codes.Unavailable, "the daemon ended the stream before answering the file's declaration"))
	} else {
		m.err = wrapErr(err)
	}
	members, opening := m.members, m.opening
	m.members, m.opening = map[uint32]*streamConn{}, map[uint32]chan error{}
	m.mu.Unlock()
	for index := range opening {
		// Not yet its file's stream: declare reports the failure.
		delete(members, index)
	}
	for _, answer := range opening {
		answer <- m.err
	}
	for _, conn := range members {
		conn.s.ended(conn, err)
	}
}
